//! Task control benchmark (printed figures, not a timed test): CONFIGURE then START of N
//! simulated tasks spread over M loopback "nodes" (default 2,000 on 250), driven by the real
//! client, all transitions in flight at once, against in-process task simulators.
//!
//! Half the tasks are direct (one CONFIGURE, 100 ms; START 20 ms), half FairMQ (five
//! CONFIGURE steps of 20 ms each; RUN 20 ms). The floor is a task's own simulated delay: no
//! transition can finish sooner. CONFIGURE includes the first HTTP/2 handshake to every task;
//! START reuses the cached channels.
//!
//! Run: `cargo bench --bench control`. BENCH_TASKS and BENCH_NODES adjust it. No cluster.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use envbridge::control::sim::{SimConfig, SimMode, Simulator, bind, serve};
use envbridge::control::{self, TaskEndpoint};
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
        println!("task control: {tasks} simulated tasks on {nodes} loopback nodes, half direct, half FairMQ");
        for (event, from, floor) in [
            (Event::Configure, State::Standby, Duration::from_millis(100)),
            (Event::Start, State::Configured, Duration::from_millis(20)),
        ] {
            let t0 = Instant::now();
            let runs = eps.iter().map(|ep| async move {
                let t = Instant::now();
                let r = control::transition(ep, from, event, &[], Duration::from_secs(60)).await;
                (r, t.elapsed())
            });
            let results = futures::future::join_all(runs).await;
            let wall = t0.elapsed();
            let mut lat: Vec<Duration> = Vec::with_capacity(results.len());
            let mut failed = 0;
            for (r, d) in results {
                match r {
                    Ok(s) if s == event.target() => lat.push(d),
                    Ok(s) => {
                        failed += 1;
                        eprintln!("{event}: unexpected state {s}");
                    }
                    Err(e) => {
                        failed += 1;
                        eprintln!("{event}: {e}");
                    }
                }
            }
            lat.sort();
            println!(
                "{event:<9} wall {:>7.1} ms | per task p50 {:>7.1} ms  p99 {:>7.1} ms  max {:>7.1} ms | floor (own delay) {:>5.1} ms | failed {failed}",
                wall.as_secs_f64() * 1e3,
                pct(&lat, 0.5).as_secs_f64() * 1e3,
                pct(&lat, 0.99).as_secs_f64() * 1e3,
                pct(&lat, 1.0).as_secs_f64() * 1e3,
                floor.as_secs_f64() * 1e3,
            );
        }
        Ok::<(), Box<dyn std::error::Error>>(())
    })
}
