//! Packing tasks into TaskSets: each task is serialized once; its size decides the packing and
//! its bytes go on to its set's JSON array (`[a,b,...]` is exactly what serde_json writes for
//! the Vec), hashed when the set closes.
//!
//! Tasks are serialized in rounds, each round split over the threads, into buffers reused
//! from round to round: the environment's JSON is never held whole. The packing itself is
//! sequential and depends only on the bytes, so the sets are the same for any thread count.

use std::ops::Range;

use super::TaskRef;
use crate::crd::json_digest;

/// Tasks serialized per thread and round.
const ROUND_PER_THREAD: usize = 1024;

/// Consecutive task ranges of at most `budget` bytes of JSON (a node's tasks stay together
/// unless they alone exceed it), each with the content hash of its JSON array. `tasks` are
/// sorted by node.
pub fn pack(tasks: &[TaskRef], budget: usize, threads: usize) -> Vec<(Range<usize>, String)> {
    let mut bufs: Vec<Chunk> = (0..threads.max(1)).map(|_| Chunk::default()).collect();
    let mut packer = Packer::new(budget);
    let mut i = 0;
    while i < tasks.len() {
        let end = node_end(tasks, i + ROUND_PER_THREAD * bufs.len());
        let round = &tasks[i..end];
        serialize(round, &mut bufs);
        let pieces: Vec<&[u8]> = bufs.iter().flat_map(Chunk::pieces).collect();
        let mut k = 0;
        while k < round.len() {
            let node = node_end(round, k + 1);
            packer.node(i + k, &pieces[k..node]);
            k = node;
        }
        i = end;
    }
    packer.finish(tasks.len())
}

/// The first index at or after `at` where a new node starts (or the end).
fn node_end(tasks: &[TaskRef], at: usize) -> usize {
    let mut at = at.min(tasks.len());
    while at > 0 && at < tasks.len() && tasks[at].node == tasks[at - 1].node {
        at += 1;
    }
    at
}

/// One thread's share of a round: the JSON of consecutive tasks.
#[derive(Default)]
struct Chunk {
    json: Vec<u8>,
    spans: Vec<Range<usize>>,
}

impl Chunk {
    fn fill(&mut self, tasks: &[TaskRef]) {
        self.json.clear();
        self.spans.clear();
        for t in tasks {
            let at = self.json.len();
            if serde_json::to_writer(&mut self.json, t).is_err() {
                self.json.truncate(at);
            }
            self.spans.push(at..self.json.len());
        }
    }

    fn pieces(&self) -> impl Iterator<Item = &[u8]> {
        self.spans.iter().map(|r| &self.json[r.clone()])
    }
}

/// Serializes `round` into the chunks, in order: the first on this thread, the others on
/// threads of their own.
fn serialize(round: &[TaskRef], bufs: &mut [Chunk]) {
    let per = round.len().div_ceil(bufs.len()).max(1);
    let mut parts = round.chunks(per);
    let Some((first, rest)) = bufs.split_first_mut() else {
        return;
    };
    if rest.is_empty() || round.len() <= per {
        first.fill(round);
        rest.iter_mut().for_each(|b| b.fill(&[]));
        return;
    }
    let head = parts.next().unwrap_or(&[]);
    std::thread::scope(|s| {
        for b in rest.iter_mut() {
            let part = parts.next().unwrap_or(&[]);
            s.spawn(move || b.fill(part));
        }
        first.fill(head);
    });
}

/// Closes a set when the next node (or, for a node larger than the budget, the next task)
/// would not fit.
struct Packer {
    budget: usize,
    set_json: Vec<u8>,
    start: usize,
    size: usize,
    sets: Vec<(Range<usize>, String)>,
}

impl Packer {
    fn new(budget: usize) -> Self {
        let mut set_json = Vec::with_capacity(budget + 64 * 1024);
        set_json.push(b'[');
        Packer {
            budget,
            set_json,
            start: 0,
            size: 0,
            sets: Vec::new(),
        }
    }

    /// The tasks of one node, the first being task `i`.
    fn node(&mut self, i: usize, pieces: &[&[u8]]) {
        let node_size: usize = pieces.iter().map(|p| p.len() + 1).sum();
        if self.start < i && self.size + node_size > self.budget {
            self.close(i);
        }
        for (k, p) in (i..).zip(pieces) {
            let s = p.len() + 1;
            if self.start < k && self.size + s > self.budget {
                self.close(k);
            }
            if self.start < k {
                self.set_json.push(b',');
            }
            self.set_json.extend_from_slice(p);
            self.size += s;
        }
    }

    fn close(&mut self, end: usize) {
        self.set_json.push(b']');
        self.sets
            .push((self.start..end, json_digest(&self.set_json)));
        self.set_json.clear();
        self.set_json.push(b'[');
        (self.start, self.size) = (end, 0);
    }

    fn finish(mut self, total: usize) -> Vec<(Range<usize>, String)> {
        if self.start < total {
            self.close(total);
        }
        self.sets
    }
}
