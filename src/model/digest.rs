//! The content hash of a TaskSet: BLAKE3 (hex) of the JSON array of its tasks, as written by
//! [`serialize_into`]. The packer hashes those bytes as it writes them; the operator verifies
//! a set read back with [`tasks_digest`], the same serializer.

use std::ops::Range;

use super::TaskRef;

/// Appends each task's JSON to `json`, and where it lies to `spans`.
///
/// sonic-rs writes the same bytes as `serde_json::to_vec` (tested in `objects::pack` for every
/// kind of character) but escapes strings with SIMD, and strings are most of a task.
pub fn serialize_into(tasks: &[TaskRef], json: &mut Vec<u8>, spans: &mut Vec<Range<usize>>) {
    for t in tasks {
        let at = json.len();
        if sonic_rs::to_writer(&mut *json, t).is_err() {
            json.truncate(at);
        }
        spans.push(at..json.len());
    }
}

/// The hash of a set's tasks: `[a,b,...]` of [`serialize_into`]'s bytes.
pub fn tasks_digest(tasks: &[TaskRef]) -> String {
    let mut items = Vec::new();
    let mut spans = Vec::with_capacity(tasks.len());
    serialize_into(tasks, &mut items, &mut spans);
    let mut json = Vec::with_capacity(items.len() + spans.len() + 2);
    json.push(b'[');
    for (i, r) in spans.into_iter().enumerate() {
        if i > 0 {
            json.push(b',');
        }
        json.extend_from_slice(&items[r]);
    }
    json.push(b']');
    json_digest(&json)
}

/// The hash of tasks already serialized: `json` is the JSON array of a set's tasks.
/// (Hashed in one piece: BLAKE3 hashes many 1 KiB chunks at once only when given them at once.)
pub fn json_digest(json: &[u8]) -> String {
    blake3::hash(json).to_hex().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_of_what_serde_json_writes() {
        let tasks: Vec<TaskRef> = (0..3)
            .map(|i| TaskRef {
                name: format!("t{i} \"é\"\n"),
                control_port: 47100 + i,
                ..TaskRef::default()
            })
            .collect();
        let want = json_digest(&serde_json::to_vec(&tasks).unwrap());
        assert_eq!(tasks_digest(&tasks), want);
        assert_eq!(tasks_digest(&[]), json_digest(b"[]"));
    }
}
