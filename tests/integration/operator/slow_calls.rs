//! Control calls that take long (a real process's CONFIGURE or STOP takes seconds): a task's
//! call does not hold one of the operator's `--task-concurrency` reconciles, so the tasks of a
//! transition, or of a teardown, are called all at once however many there are.

use super::*;

/// How long the slow call takes.
const CALL: Duration = Duration::from_secs(3);

/// Eight direct tasks numbered `numbers` (control port 47100 + n, on two nodes) whose
/// `event` takes [`CALL`], STANDBY under an operator allowed 2 task reconciles at a time.
async fn eight_slow_tasks(
    test: &str,
    env: &str,
    numbers: std::ops::RangeInclusive<u16>,
    event: Event,
) -> Res<(Fixture, Sims, Running)> {
    let fx = fixture(test).await?;
    let sims = Sims::start(&fx);
    let op = start_with(
        &fx,
        OperatorArgs {
            task_concurrency: 2,
            ..args(&fx.ns, None)
        },
    )
    .await?;
    let tasks: Vec<TaskRef> = numbers
        .map(|n| {
            let host = if n % 2 == 0 { "flp001" } else { "flp002" };
            let mut t = task_ref(env, host, "readout", n, ControlMode::Direct);
            t.env.push(EnvVar {
                name: "ENVBRIDGE_SIM_DELAY".into(),
                value: format!("{event}={}ms", CALL.as_millis()).into(),
            });
            t
        })
        .collect();
    assert_eq!(tasks.len(), 8);
    deploy(&fx, env, &tasks, false).await?;
    wait_env(&fx, env, "STANDBY 8/8", |e| {
        state_is(State::Standby)(e)
            && e.status.as_ref().and_then(|s| s.ready.as_deref()) == Some("8/8")
    })
    .await?;
    Ok((fx, sims, op))
}

/// Eight tasks whose CONFIGURE takes 3 s, an operator with 2 task reconciles at a time: the
/// transition takes about one call, not four rounds of two calls (12 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_calls_run_together_beyond_the_reconcile_concurrency() -> Res {
    let (fx, sims, op) = eight_slow_tasks("slowcalls", "sc", 1..=8, Event::Configure).await?;
    let took = transition_succeeds(&fx, "sc", "c1", Event::Configure).await?;
    println!("CONFIGURE of 8 tasks answering in {CALL:?} each, 2 reconciles at a time: {took:?}");
    assert!(
        took >= CALL,
        "the simulators' delay did not apply: {took:?}"
    );
    // Four rounds of two calls would take 12 s; all at once, one call and its writes.
    assert!(
        took < CALL * 3,
        "the calls waited for reconciles: {took:?} for 8 calls of {CALL:?}"
    );
    let took = transition_succeeds(&fx, "sc", "r1", Event::Reset).await?;
    println!("RESET (no delay): {took:?}");
    let env = wait_env(&fx, "sc", "STANDBY", state_is(State::Standby)).await?;
    assert_eq!(env.status.unwrap().ready.as_deref(), Some("8/8"));
    destroy(&fx, "sc").await?;
    op.stop().await?;
    sims.stop().await;
    finish(fx).await
}

/// Eight tasks whose EXIT takes 3 s, an operator with 2 task reconciles at a time: the
/// teardown takes each process out (EXIT before its pod is deleted) all at once, not in four
/// rounds of two (12 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_take_outs_run_together_beyond_the_reconcile_concurrency() -> Res {
    // Ports of their own (47111-47118): the pods share their node's address, and the test
    // above uses 47101-47108 on the same nodes.
    let (fx, sims, op) = eight_slow_tasks("slowexit", "se", 11..=18, Event::Exit).await?;
    let t0 = Instant::now();
    destroy(&fx, "se").await?;
    let took = t0.elapsed();
    println!(
        "teardown of 8 tasks whose EXIT answers in {CALL:?}, 2 reconciles at a time: {took:?}"
    );
    // Each pod goes only after its process answered EXIT.
    assert!(
        took >= CALL,
        "the take-outs did not wait for EXIT: {took:?}"
    );
    assert!(
        took < CALL * 3,
        "the take-outs waited for reconciles: {took:?} for 8 calls of {CALL:?}"
    );
    op.stop().await?;
    sims.stop().await;
    finish(fx).await
}
