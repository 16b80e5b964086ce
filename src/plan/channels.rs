//! Channel endpoints and global aliases, as FairMQ transition arguments.
//!
//! IPC: an abstract socket `ipc://@eb-<hash>` (hash of environment id, role path, channel),
//! the same string on both sides; both tasks must be on one node. TCP: the bound side gets a
//! port of the node from the TCP range and binds `tcp://*:PORT`; the connecting side dials
//! `tcp://<node>:PORT`.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::sync::Arc;

use super::names;
use super::ports::PortBook;
use super::resolve::{EvalChannel, ResolvedTask};
use crate::workflow::error::{Error, Loc, Result};
use crate::workflow::model::FastMap;

/// The key suffixes of a channel's transition arguments, in their sorted order.
const SUFFIXES: [&str; 8] = [
    ".0.address",
    ".0.method",
    ".0.rateLogging",
    ".0.rcvBufSize",
    ".0.sndBufSize",
    ".0.transport",
    ".0.type",
    ".numSockets",
];

/// A task's channel arguments as (key, value) pairs.
pub type ChannelArgs = BTreeMap<Arc<str>, Arc<str>>;

struct Bound<'a> {
    task: &'a ResolvedTask,
    chan: &'a EvalChannel,
    connect_address: Arc<str>,
}

/// The strings every channel end repeats, made once per render: the keys of each channel
/// name, and the constant values.
struct Strings {
    keys: FastMap<Arc<str>, [Arc<str>; 8]>,
    one: Arc<str>,
    bind: Arc<str>,
    connect: Arc<str>,
    default: Arc<str>,
    buf: Arc<str>,
    zero: Arc<str>,
}

impl Strings {
    fn new() -> Self {
        Strings {
            keys: FastMap::default(),
            one: Arc::from("1"),
            bind: Arc::from("bind"),
            connect: Arc::from("connect"),
            default: Arc::from("default"),
            buf: Arc::from("1000"),
            zero: Arc::from("0"),
        }
    }

    /// `chans.<name><suffix>` for every suffix.
    fn keys(&mut self, name: &Arc<str>) -> &[Arc<str>; 8] {
        self.keys
            .entry(name.clone())
            .or_insert_with(|| SUFFIXES.map(|suffix| Arc::from(["chans.", name, suffix].concat())))
    }
}

/// FairMQ channel arguments per task (same order as `tasks`).
pub fn wire(
    env_id: &str,
    tasks: &[ResolvedTask],
    book: &mut PortBook,
    tcp_ports: &RangeInclusive<u16>,
) -> Result<Vec<ChannelArgs>> {
    // By (role path, channel name): what a target `<role path>:<channel>` names (neither part
    // can hold a `:`).
    let binds = tasks.iter().map(|t| t.bind.len()).sum();
    let mut bound: FastMap<(&str, &str), Bound> =
        FastMap::with_capacity_and_hasher(binds, Default::default());
    let mut aliases: FastMap<Arc<str>, (String, Loc)> = FastMap::default();
    let mut strings = Strings::new();
    // Collected as lists and sorted once per task at the end (a BTreeMap built from a list
    // is one sort and a bulk load, not an ordered insert per key).
    let mut out: Vec<Vec<(Arc<str>, Arc<str>)>> = tasks
        .iter()
        .map(|t| Vec::with_capacity(SUFFIXES.len() * (t.bind.len() + t.connect.len())))
        .collect();
    for (i, t) in tasks.iter().enumerate() {
        for c in &t.bind {
            let (bind_address, connect_address) = if c.tcp {
                let port = book.take(&t.node, tcp_ports).ok_or_else(|| {
                    Error::new(
                        &c.loc,
                        format!(
                            "no free TCP port left on node `{}` in {}-{} for channel `{}` of task `{}`",
                            t.node,
                            tcp_ports.start(),
                            tcp_ports.end(),
                            c.name,
                            t.path
                        ),
                    )
                })?;
                (
                    Arc::from(format!("tcp://*:{port}")),
                    Arc::from(format!("tcp://{}:{port}", t.node)),
                )
            } else {
                let a: Arc<str> = Arc::from(names::ipc_address(env_id, &t.path, &c.name));
                (a.clone(), a)
            };
            if let Some(g) = &c.global {
                let key = format!("{}:{}", t.path, c.name);
                if let Some((other, loc)) = aliases.get(g)
                    && *other != key
                {
                    return Err(Error::new(
                        &c.loc,
                        format!(
                            "alias `::{g}` redefined: `{key}` here, already `{other}` (at {loc})"
                        ),
                    ));
                }
                aliases.insert(g.clone(), (key, c.loc.clone()));
            }
            let method = strings.bind.clone();
            let transport = c.transport.clone();
            channel_keys(
                &mut out[i],
                &mut strings,
                c,
                method,
                bind_address,
                transport,
            );
            bound.insert(
                (t.path.as_str(), &*c.name),
                Bound {
                    task: t,
                    chan: c,
                    connect_address,
                },
            );
        }
    }
    for (i, t) in tasks.iter().enumerate() {
        for c in &t.connect {
            let Some((target, tloc)) = &c.target else {
                continue;
            };
            let key: &str = match target.strip_prefix("::") {
                Some(alias) => match aliases.get(alias) {
                    Some((k, _)) => k,
                    None => {
                        return Err(Error::new(
                            tloc,
                            format!(
                                "unresolved target `{target}` of channel `{}` of task `{}`: no inbound channel publishes the alias `::{alias}`",
                                c.name, t.path
                            ),
                        ));
                    }
                },
                None => target,
            };
            let split = key.rsplit_once(':');
            let Some(b) = split.and_then(|k| bound.get(&k)) else {
                let hint = match split {
                    Some((p, ch)) => format!("no inbound channel `{ch}` on a task at role `{p}`"),
                    None => "expected `<role path>:<channel>` or `::<alias>`".to_string(),
                };
                return Err(Error::new(
                    tloc,
                    format!(
                        "unresolved target `{target}` of channel `{}` of task `{}`: {hint}",
                        c.name, t.path
                    ),
                ));
            };
            if !compatible(&b.chan.r#type, &c.r#type) {
                return Err(Error::new(
                    &c.loc,
                    format!(
                        "channel type mismatch: `{}:{}` ({}) connects to `{key}` ({}, at {}); push must meet pull, pub must meet sub",
                        t.path, c.name, c.r#type, b.chan.r#type, b.chan.loc
                    ),
                ));
            }
            if !b.chan.tcp && b.task.node != t.node {
                return Err(Error::new(
                    &c.loc,
                    format!(
                        "IPC channel `{key}` is on node `{}`, but `{}:{}` connects from node `{}`: IPC works on one node only (use addressing: tcp)",
                        b.task.node, t.path, c.name, t.node
                    ),
                ));
            }
            let method = strings.connect.clone();
            let transport = c.transport.clone().or_else(|| b.chan.transport.clone());
            let address = b.connect_address.clone();
            channel_keys(&mut out[i], &mut strings, c, method, address, transport);
        }
    }
    // A later key replaces an earlier one, as an insert would (connect after bind).
    Ok(out.into_iter().map(BTreeMap::from_iter).collect())
}

/// The 8 transition arguments of channel `c`, in [`SUFFIXES`] order.
fn channel_keys(
    out: &mut Vec<(Arc<str>, Arc<str>)>,
    strings: &mut Strings,
    c: &EvalChannel,
    method: Arc<str>,
    address: Arc<str>,
    transport: Option<Arc<str>>,
) {
    let or = |v: &Option<Arc<str>>, default: &Arc<str>| v.as_ref().unwrap_or(default).clone();
    let values = [
        address,
        method,
        or(&c.rate_logging, &strings.zero),
        or(&c.rcv_buf_size, &strings.buf),
        or(&c.snd_buf_size, &strings.buf),
        transport.unwrap_or_else(|| strings.default.clone()),
        c.r#type.clone(),
        strings.one.clone(),
    ];
    let keys = strings.keys(&c.name);
    out.extend(keys.iter().cloned().zip(values));
}

/// Socket types that can talk: push-pull, pub-sub, req-rep, pair-pair.
fn compatible(bound: &str, connecting: &str) -> bool {
    matches!(
        (bound, connecting),
        ("push", "pull")
            | ("pull", "push")
            | ("pub", "sub")
            | ("sub", "pub")
            | ("req", "rep")
            | ("rep", "req")
            | ("pair", "pair")
    )
}
