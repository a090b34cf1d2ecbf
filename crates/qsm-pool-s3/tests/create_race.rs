//! Two servers creating the same pool at once: the descriptor's put-if-absent lets exactly
//! one succeed, and both then see the winner's pool.

mod common;

use std::sync::Barrier;

use common::{Env, TestResult};
use qsm_pool::Pool;
use qsm_pool_s3::S3Pool;

#[test]
fn exactly_one_of_two_racing_creates_succeeds() -> TestResult {
    let env = Env::start()?;
    for round in 0..20 {
        let prefix = format!("race-{round}");
        let config = env.config(&prefix);
        let barrier = Barrier::new(2);
        let results: Vec<_> = std::thread::scope(|s| {
            let threads: Vec<_> = ["A", "B"]
                .iter()
                .map(|name| {
                    let (config, barrier) = (&config, &barrier);
                    s.spawn(move || {
                        barrier.wait();
                        S3Pool::create(config, name, None)
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join()).collect()
        });
        let mut won = Vec::new();
        for result in results {
            match result {
                Ok(Ok(pool)) => won.push(pool),
                Ok(Err(e)) => {
                    let text = e.to_string();
                    eprintln!("round {round}: {text}");
                    assert!(
                        text.contains("already a pool") || text.contains("at the same time"),
                        "round {round}: {text}"
                    );
                }
                Err(_) => panic!("round {round}: a create panicked"),
            }
        }
        assert_eq!(won.len(), 1, "round {round}: {} creates succeeded", won.len());
        let opened = S3Pool::open(&config)?;
        assert_eq!((opened.id(), opened.name()), (won[0].id(), won[0].name()));
    }
    Ok(())
}
