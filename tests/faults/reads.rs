//! The daemon answers reads throughout: each replica is read every few hundred milliseconds
//! for the whole run, and a read that fails outside that replica's own kill window is a
//! violation (the apiserver or etcd being down is no excuse: reads come from the roster).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envbridge::server::pb;
use tokio_util::sync::CancellationToken;

use super::site::Site;

const EVERY: Duration = Duration::from_millis(400);
const DEADLINE: Duration = Duration::from_secs(3);
/// A replica just restarted may take this long to listen again beyond its recorded window.
const SLACK: Duration = Duration::from_secs(2);

pub struct Reads {
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    failures: Arc<Mutex<Vec<String>>>,
    pub reads: Arc<Mutex<u64>>,
}

pub fn spawn(site: Arc<Site>) -> Reads {
    let stop = CancellationToken::new();
    let failures = Arc::new(Mutex::new(Vec::new()));
    let reads = Arc::new(Mutex::new(0));
    let started = Instant::now();
    let tasks = (0..site.daemons.len())
        .map(|r| {
            let (site, stop, failures, reads) =
                (site.clone(), stop.clone(), failures.clone(), reads.clone());
            tokio::spawn(async move {
                while !stop.is_cancelled() {
                    let t = Instant::now();
                    let answered = tokio::time::timeout(DEADLINE, async {
                        let mut api = site.api(r).await.ok_or("no connection")?;
                        api.list_environments(pb::ListEnvironmentsRequest {})
                            .await
                            .map(|_| ())
                            .map_err(|_| "an error")
                    })
                    .await;
                    *reads.lock().unwrap() += 1;
                    let failed = !matches!(answered, Ok(Ok(())));
                    if failed && !site.daemons[r].downtime.covers(t, SLACK) && !stop.is_cancelled()
                    {
                        failures.lock().unwrap().push(format!(
                            "daemon-{r} did not answer a read {:.1} s into the run ({})",
                            (t - started).as_secs_f64(),
                            match answered {
                                Ok(Err(e)) => e,
                                _ => "no answer within 3 s",
                            }
                        ));
                    }
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep(EVERY) => {}
                    }
                }
            })
        })
        .collect();
    Reads {
        stop,
        tasks,
        failures,
        reads,
    }
}

impl Reads {
    pub async fn stop(self) -> Vec<String> {
        self.stop.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        std::mem::take(&mut *self.failures.lock().unwrap())
    }
}
