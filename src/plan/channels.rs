//! Channel endpoints and global aliases, as FairMQ transition arguments.
//!
//! IPC: an abstract socket `ipc://@eb-<hash>` (hash of environment id, role path, channel),
//! the same string on both sides; both tasks must be on one node. TCP: the bound side gets a
//! port of the node from the TCP range and binds `tcp://*:PORT`; the connecting side dials
//! `tcp://<node>:PORT`.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use super::names;
use super::ports::PortBook;
use super::resolve::{EvalChannel, ResolvedTask};
use crate::workflow::error::{Error, Loc, Result};
use crate::workflow::model::FastMap;

const DEFAULT_BUF: &str = "1000";
/// Transition arguments per channel (see [`channel_keys`]).
const KEYS_PER_CHANNEL: usize = 8;

struct Bound<'a> {
    task: &'a ResolvedTask,
    chan: &'a EvalChannel,
    connect_address: String,
}

/// FairMQ channel arguments per task (same order as `tasks`).
pub fn wire(
    env_id: &str,
    tasks: &[ResolvedTask],
    book: &mut PortBook,
    tcp_ports: &RangeInclusive<u16>,
) -> Result<Vec<BTreeMap<String, String>>> {
    // By (role path, channel name): what a target `<role path>:<channel>` names (neither part
    // can hold a `:`).
    let mut bound: FastMap<(&str, &str), Bound> = FastMap::default();
    let mut aliases: FastMap<String, (String, Loc)> = FastMap::default();
    // Collected as lists and sorted once per task at the end (a BTreeMap built from a list
    // is one sort and a bulk load, not an ordered insert per key).
    let mut out: Vec<Vec<(String, String)>> = tasks
        .iter()
        .map(|t| Vec::with_capacity(KEYS_PER_CHANNEL * (t.bind.len() + t.connect.len())))
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
                    format!("tcp://*:{port}"),
                    format!("tcp://{}:{port}", t.node),
                )
            } else {
                let a = names::ipc_address(env_id, &t.path, &c.name);
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
            channel_keys(
                &mut out[i],
                c,
                "bind",
                &bind_address,
                c.transport.as_deref(),
            );
            bound.insert(
                (t.path.as_str(), c.name.as_str()),
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
            let transport = c.transport.as_deref().or(b.chan.transport.as_deref());
            channel_keys(&mut out[i], c, "connect", &b.connect_address, transport);
        }
    }
    // A later key replaces an earlier one, as an insert would (connect after bind).
    Ok(out.into_iter().map(BTreeMap::from_iter).collect())
}

fn channel_keys(
    out: &mut Vec<(String, String)>,
    c: &EvalChannel,
    method: &str,
    address: &str,
    transport: Option<&str>,
) {
    // `chans.<name><suffix>`, built without the formatting machinery (8 keys per channel).
    let key = |suffix: &str| {
        let mut k = String::with_capacity(6 + c.name.len() + suffix.len());
        k.push_str("chans.");
        k.push_str(&c.name);
        k.push_str(suffix);
        k
    };
    let value = |v: Option<&String>, default: &str| v.map_or(default, |s| s.as_str()).to_string();
    out.extend([
        (key(".numSockets"), "1".to_string()),
        (key(".0.address"), address.to_string()),
        (key(".0.method"), method.to_string()),
        (key(".0.type"), c.r#type.clone()),
        (
            key(".0.transport"),
            transport.unwrap_or("default").to_string(),
        ),
        (
            key(".0.sndBufSize"),
            value(c.snd_buf_size.as_ref(), DEFAULT_BUF),
        ),
        (
            key(".0.rcvBufSize"),
            value(c.rcv_buf_size.as_ref(), DEFAULT_BUF),
        ),
        (key(".0.rateLogging"), value(c.rate_logging.as_ref(), "0")),
    ]);
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
