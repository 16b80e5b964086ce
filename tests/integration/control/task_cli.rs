//! `envbridge task state|transition|watch` against the task simulator, in both modes.

use std::process::Output;
use std::time::{Duration, Instant};

use super::protocol::SimProc;

async fn task(args: &[&str]) -> Output {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_envbridge"))
        .arg("task")
        .args(args)
        .output();
    tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("envbridge task ended within 60 s")
        .expect("run envbridge task")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).trim().to_string(),
        String::from_utf8_lossy(&o.stderr).trim().to_string(),
    )
}

async fn cycle(mode: &str, standby: &str, configured: &str) {
    let sim = SimProc::start(&["--mode", mode, "-v"], &[]).await;
    let addr = sim.addr.to_string();
    let out = task(&["state", &addr, "--mode", mode]).await;
    assert!(out.status.success(), "{:?}", text(&out));
    assert_eq!(text(&out).0, standby);

    let mut watch = tokio::process::Command::new(env!("CARGO_BIN_EXE_envbridge"))
        .args(["task", "watch", &addr, "--mode", mode])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("watch");
    tokio::time::sleep(Duration::from_millis(300)).await;

    for (event, extra, want) in [
        ("CONFIGURE", &[][..], "STANDBY -> CONFIGURED"),
        (
            "START",
            &["--run-number", "7", "--arg", "k=v"][..],
            "CONFIGURED -> RUNNING",
        ),
        ("STOP", &[][..], "RUNNING -> CONFIGURED"),
        ("RESET", &[][..], "CONFIGURED -> STANDBY"),
    ] {
        let mut args = vec!["transition", &addr, event, "--mode", mode];
        args.extend(extra);
        let out = task(&args).await;
        assert!(out.status.success(), "{event}: {:?}", text(&out));
        assert_eq!(text(&out).0, want);
        // Time for the watch's poll of a FairMQ device (it has no state stream).
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    let out = task(&["state", &addr, "--mode", mode]).await;
    assert_eq!(text(&out).0, standby);
    // START carried the run number as the processes read it, and k=v; STOP neither.
    let log = sim.log_text();
    let start = &log[log
        .find("received transition RUN")
        .or(log.find("received transition START"))
        .unwrap()..];
    let start = &start[..start.find("received transition STOP").unwrap()];
    assert!(start.contains("argument runNumber = 7"), "{start}");
    assert!(start.contains("argument k = v"), "{start}");
    let stop = &log[log.find("received transition STOP").unwrap()..];
    assert!(
        !stop.contains("runNumber") && !stop.contains("argument k"),
        "{stop}"
    );

    // EXIT ends the process (EXITING/DONE); the watch saw the cycle.
    let out = task(&["transition", &addr, "EXIT", "--mode", mode]).await;
    assert!(out.status.success(), "EXIT: {:?}", text(&out));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let _ = watch.start_kill();
    let seen = watch.wait_with_output().await.expect("watch output");
    let seen = String::from_utf8_lossy(&seen.stdout).to_string();
    assert!(seen.contains(&format!("state {standby}")), "{seen}");
    assert!(seen.contains("RUNNING"), "{seen}");
    assert!(seen.contains(configured), "{seen}");
}

#[tokio::test]
async fn a_direct_task_goes_through_its_cycle_by_hand() {
    cycle("direct", "STANDBY", "state CONFIGURED").await;
}

#[tokio::test]
async fn a_fairmq_device_goes_through_its_cycle_by_hand() {
    cycle("fairmq", "STANDBY device=IDLE", "CONFIGURED device=READY").await;
}

#[tokio::test]
async fn a_refused_or_unreachable_task_exits_1_with_its_answer() {
    let sim = SimProc::start(&["--fail-on", "CONFIGURE"], &[]).await;
    let addr = sim.addr.to_string();
    let out = task(&["transition", &addr, "CONFIGURE"]).await;
    assert_eq!(out.status.code(), Some(1), "{:?}", text(&out));
    let (_, err) = text(&out);
    assert!(
        err.contains("ERROR") && err.contains("DEVICE_ERROR"),
        "{err}"
    );

    // Nobody listens there: exit 1 within the timeout.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let started = Instant::now();
    let out = task(&["state", &format!("127.0.0.1:{port}"), "--timeout", "2"]).await;
    assert_eq!(out.status.code(), Some(1), "{:?}", text(&out));
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(text(&out).1.starts_with("error:"), "{:?}", text(&out));

    let out = task(&["transition", &addr, "LAUNCH"]).await;
    assert_eq!(out.status.code(), Some(2), "{:?}", text(&out));
}
