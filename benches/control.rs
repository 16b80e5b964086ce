//! Task control benchmark (printed figures, not a timed test): CONFIGURE then START of N
//! simulated tasks spread over M loopback "nodes" (default 2,000 on 250), driven by the real
//! client, all transitions in flight at once, against in-process task simulators.
//!
//! Half the tasks are direct (one CONFIGURE, 100 ms; START 20 ms), half FairMQ (five
//! CONFIGURE steps of 20 ms each; RUN 20 ms). The floor is a task's own simulated delay: no
//! transition can finish sooner.
//!
//! Baselines measured in the same run, against the same simulators and client:
//! - `connect`: the first call to every task at once (HTTP/2 handshake + one unary GetState);
//! - `GetState`: one bare unary call to every task at once on the warm channels: the cost of
//!   a round-trip at this concurrency with no simulated delay, to compare with a transition's
//!   latency above its floor;
//! - `GetState serial`: one call at a time (200 calls), the round-trip with nothing in flight.
//!
//! CONFIGURE and START then run on the warm channels, all transitions in flight at once.
//!
//! Run: `cargo bench --bench control`. BENCH_TASKS and BENCH_NODES adjust it. No cluster.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use envbridge::control::sim::{SimConfig, SimMode, Simulator, bind, serve};
use envbridge::control::{ControlClient, TaskEndpoint};
use envbridge::plan::ControlMode;
use envbridge::state::{Event, State};

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One round: `call` on every endpoint at once; wall time, sorted latencies of the successes,
/// failures (printed to stderr).
async fn round<F, Fut>(
    what: &str,
    eps: &[TaskEndpoint],
    call: F,
) -> (Duration, Vec<Duration>, usize)
where
    F: Fn(&TaskEndpoint) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let t0 = Instant::now();
    let runs = eps.iter().map(|ep| {
        let fut = call(ep);
        async move {
            let t = Instant::now();
            let r = fut.await;
            (r, t.elapsed())
        }
    });
    let results = futures::future::join_all(runs).await;
    let wall = t0.elapsed();
    let mut lat = Vec::with_capacity(results.len());
    let mut failed = 0;
    for (r, d) in results {
        match r {
            Ok(()) => lat.push(d),
            Err(e) => {
                failed += 1;
                eprintln!("{what}: {e}");
            }
        }
    }
    lat.sort();
    (wall, lat, failed)
}

fn print_row(what: &str, wall: Duration, lat: &[Duration], floor: Duration, failed: usize) {
    let p50 = pct(lat, 0.5);
    println!(
        "{what:<16} wall {:>7.1} ms | per call p50 {:>7.2} ms  p99 {:>7.2} ms  max {:>7.2} ms | floor {:>5.1} ms  p50 above floor {:>6.2} ms | failed {failed}",
        ms(wall),
        ms(p50),
        ms(pct(lat, 0.99)),
        ms(pct(lat, 1.0)),
        ms(floor),
        ms(p50.saturating_sub(floor)),
    );
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tasks = env_num("BENCH_TASKS", 2000);
    let nodes = env_num("BENCH_NODES", 250).max(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let direct = SimConfig::parse(
            SimMode::Direct,
            &["CONFIGURE=100ms".into(), "START=20ms".into()],
            &[],
            &[],
            &[],
            &[],
        )?;
        let fairmq = SimConfig::parse(SimMode::Fairmq, &["20ms".into()], &[], &[], &[], &[])?;
        let mut eps = Vec::with_capacity(tasks);
        for i in 0..tasks {
            // Node k listens on 127.3.<k/250>.<k%250+1>, like a kwok node's loopback IP.
            let k = i % nodes;
            let ip = IpAddr::V4(Ipv4Addr::new(127, 3, (k / 250) as u8, (k % 250 + 1) as u8));
            let l = bind(SocketAddr::new(ip, 0), false).await?;
            let addr = l.local_addr()?;
            let (config, mode) = if i % 2 == 0 {
                (direct.clone(), ControlMode::Direct)
            } else {
                (fairmq.clone(), ControlMode::Fairmq)
            };
            tokio::spawn(serve(l, Simulator::new(config), std::future::pending()));
            eps.push(TaskEndpoint::new(addr, mode));
        }
        println!(
            "task control: {tasks} simulated tasks on {nodes} loopback nodes, half direct, half FairMQ; load average at start {}",
            load_average()
        );
        let deadline = Duration::from_secs(60);
        // One client for every round: the "connect" round fills its channel cache.
        let ctl = ControlClient::default();
        let get_state = |ep: &TaskEndpoint| {
            let ep = *ep;
            let ctl = ctl.clone();
            async move {
                ctl.get_state(&ep, deadline)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
        };
        for what in ["connect", "GetState"] {
            let (wall, lat, failed) = round(what, &eps, get_state).await;
            print_row(what, wall, &lat, Duration::ZERO, failed);
        }
        let mut serial = Vec::with_capacity(200);
        for ep in eps.iter().cycle().take(200) {
            let t = Instant::now();
            ctl.get_state(ep, deadline).await?;
            serial.push(t.elapsed());
        }
        let total: Duration = serial.iter().sum();
        serial.sort();
        print_row("GetState serial", total, &serial, Duration::ZERO, 0);
        for (event, from, floor) in [
            (Event::Configure, State::Standby, Duration::from_millis(100)),
            (Event::Start, State::Configured, Duration::from_millis(20)),
        ] {
            let (wall, lat, failed) = round(&event.to_string(), &eps, |ep| {
                let ep = *ep;
                let ctl = ctl.clone();
                async move {
                    match ctl.transition(&ep, from, event, &[], deadline).await {
                        Ok(s) if s == event.target() => Ok(()),
                        Ok(s) => Err(format!("unexpected state {s}")),
                        Err(e) => Err(e.to_string()),
                    }
                }
            })
            .await;
            print_row(&event.to_string(), wall, &lat, floor, failed);
        }
        println!("load average at end {}", load_average());
        Ok::<(), Box<dyn std::error::Error>>(())
    })
}
