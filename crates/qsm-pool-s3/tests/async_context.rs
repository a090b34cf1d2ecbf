//! The pool is synchronous but may be called from async tasks of another tokio runtime (the
//! server's): it must neither panic (as `Runtime::block_on` would) nor deadlock, also on a
//! current-thread runtime, and dropping it there must not panic either.

mod common;

use common::{Env, TestResult, frames};
use qsm_pool::{Pool, copy_frames};
use qsm_pool_s3::S3Pool;

fn exercise(env: &Env, prefix: &str) -> TestResult {
    let pool = S3Pool::create(&env.config(prefix), "ASYNC", None)?;
    let frames = frames(5, 3_000);
    let mut w = pool.writer()?;
    let locs = frames.iter().map(|f| w.append(f)).collect::<Result<Vec<_>, _>>()?;
    w.sync()?;
    let mut out = Vec::new();
    for (loc, frame) in locs.iter().zip(&frames) {
        pool.read_frame(loc, None, &mut out)?;
        assert_eq!(&out, frame);
    }
    w.finish()?;
    let mut w = pool.writer()?;
    let moved = copy_frames(&pool, &locs, &mut *w)?;
    w.finish()?;
    pool.delete(locs[0].container)?;
    assert_eq!(pool.containers()?.len(), 1);
    assert!(pool.audit(moved[0].container)?.is_clean());
    drop(pool);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usable_from_a_multi_thread_runtime() -> TestResult {
    let env = Env::start()?;
    exercise(&env, "multi")?;
    // And from several tasks at once.
    let env = std::sync::Arc::new(env);
    let tasks: Vec<_> = (0..4)
        .map(|i| {
            let env = std::sync::Arc::clone(&env);
            tokio::spawn(
                async move { exercise(&env, &format!("task-{i}")).map_err(|e| e.to_string()) },
            )
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(())
}

#[tokio::test(flavor = "current_thread")]
async fn usable_from_a_current_thread_runtime() -> TestResult {
    let env = Env::start()?;
    exercise(&env, "current")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usable_from_spawn_blocking() -> TestResult {
    let env = std::sync::Arc::new(Env::start()?);
    let task_env = std::sync::Arc::clone(&env);
    tokio::task::spawn_blocking(move || exercise(&task_env, "blocking").map_err(|e| e.to_string()))
        .await??;
    Ok(())
}
