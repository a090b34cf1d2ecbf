//! Configuration and connection failures are clear errors naming the endpoint and bucket:
//! never a panic, never an empty pool.

mod common;

use std::time::{Duration, Instant};

use common::{BUCKET, Env, TestResult, frames};
use qsm_pool::{FrameLocation, Pool, PoolError};
use qsm_pool_s3::{S3Pool, S3PoolConfig};

fn expect_err<T: std::fmt::Debug>(r: Result<T, PoolError>, what: &str) -> PoolError {
    match r {
        Ok(v) => panic!("{what} succeeded: {v:?}"),
        Err(e) => e,
    }
}

#[test]
fn missing_bucket_is_named() -> TestResult {
    let env = Env::start()?;
    let config = env.server.pool_config("no-such-bucket", "p");
    for (what, result) in [
        ("create", S3Pool::create(&config, "P", None).map(|_| ())),
        ("open", S3Pool::open(&config).map(|_| ())),
    ] {
        let e = expect_err(result, what).to_string();
        eprintln!("{what}: {e}");
        assert!(
            e.contains("bucket 'no-such-bucket' does not exist")
                && e.contains(&env.server.endpoint()),
            "{what}: {e}"
        );
    }
    Ok(())
}

#[test]
fn wrong_secret_key_is_refused() -> TestResult {
    let env = Env::start()?;
    S3Pool::create(&env.config("p"), "P", None)?;
    let wrong = S3PoolConfig { secret_key: Some("not-the-secret".into()), ..env.config("p") };
    for (what, result) in [
        ("open", S3Pool::open(&wrong).map(|_| ())),
        ("create", S3Pool::create(&wrong, "Q", None).map(|_| ())),
    ] {
        let e = expect_err(result, what);
        let text = e.to_string();
        eprintln!("{what}: {text}");
        assert!(
            matches!(&e, PoolError::Io { source, .. }
                if source.kind() == std::io::ErrorKind::PermissionDenied),
            "{what}: {e:?}"
        );
        assert!(text.contains("access denied") && text.contains(BUCKET), "{what}: {text}");
        assert!(!text.contains("not-the-secret"), "{what}: the secret key is in the message");
    }
    // And a pool opened with the right key but used with the wrong one cannot list an empty
    // pool: a second handle on the same prefix with the wrong key fails every operation.
    let right = S3Pool::open(&env.config("p"))?;
    let mut w = right.writer()?;
    w.append(&frames(1, 100)[0])?;
    w.finish()?;
    assert_eq!(right.containers()?.len(), 1);
    Ok(())
}

#[test]
fn the_debug_output_hides_the_secret_key() -> TestResult {
    let env = Env::start()?;
    let config = env.config("p");
    let pool = S3Pool::create(&config, "P", None)?;
    for shown in [format!("{config:?}"), format!("{pool:?}")] {
        assert!(!shown.contains(common::SECRET_KEY), "secret in {shown}");
    }
    Ok(())
}

#[test]
fn stopped_server_fails_within_bounded_time() -> TestResult {
    let env = Env::start()?;
    let pool = S3Pool::create(&env.config("p"), "P", None)?;
    let frames = frames(3, 1000);
    let mut w = pool.writer()?;
    let locs: Vec<FrameLocation> = frames.iter().map(|f| w.append(f)).collect::<Result<_, _>>()?;
    w.sync()?;
    let mut out = Vec::new();
    pool.read_frame(&locs[0], None, &mut out)?;
    let endpoint = env.server.endpoint();
    let common::Env { server, dir } = env;
    drop(server);

    let started = Instant::now();
    let errors = [
        ("read_frame", pool.read_frame(&locs[1], Some(1), &mut out).map(|_| ())),
        ("containers", pool.containers().map(|_| ())),
        ("scan", pool.scan(locs[0].container, &mut |_, _| Ok(())).map(|_| ())),
        ("sync", {
            w.append(&frames[2])?;
            w.sync()
        }),
        ("open", S3Pool::open(&pool_config_for(&endpoint)).map(|_| ())),
    ];
    let elapsed = started.elapsed();
    for (what, result) in errors {
        let e = expect_err(result, what).to_string();
        eprintln!("{what}: {e}");
        assert!(e.contains(&endpoint) && e.contains(BUCKET), "{what}: {e}");
    }
    assert!(out.is_empty(), "read_frame left bytes after an error");
    // Five operations, each at most 2 retries within 2 s (the test configuration).
    assert!(elapsed < Duration::from_secs(15), "the errors took {elapsed:?}");
    eprintln!("five operations against a stopped server failed in {elapsed:?}");
    drop(dir);
    Ok(())
}

fn pool_config_for(endpoint: &str) -> S3PoolConfig {
    S3PoolConfig {
        endpoint: Some(endpoint.into()),
        bucket: BUCKET.into(),
        prefix: "p".into(),
        access_key: Some(common::ACCESS_KEY.into()),
        secret_key: Some(common::SECRET_KEY.into()),
        allow_http: true,
        max_retries: 2,
        retry_timeout_secs: 2,
        connect_timeout_secs: 1,
        ..S3PoolConfig::default()
    }
}

#[test]
fn open_without_descriptor_is_not_a_pool() -> TestResult {
    let env = Env::start()?;
    // An empty prefix, and one holding other objects but no POOL.
    let e = expect_err(S3Pool::open(&env.config("nothing-here")), "open of an empty prefix");
    assert!(matches!(e, PoolError::NotAPool { .. }), "{e:?}");
    assert!(e.to_string().contains("no POOL descriptor"), "{e}");

    let other = env.server.object_file(BUCKET, "other/containers/0123456789abcdef");
    std::fs::create_dir_all(other.parent().ok_or("no parent")?)?;
    std::fs::write(&other, b"QSMC")?;
    let e = expect_err(S3Pool::open(&env.config("other")), "open without POOL");
    assert!(matches!(e, PoolError::NotAPool { .. }), "{e:?}");

    // A POOL object that is not a descriptor.
    std::fs::write(env.server.object_file(BUCKET, "other/POOL"), b"not a descriptor")?;
    let e = expect_err(S3Pool::open(&env.config("other")), "open with a damaged POOL");
    assert!(e.to_string().contains("not a pool descriptor"), "{e}");
    Ok(())
}

#[test]
fn create_refuses_a_used_prefix() -> TestResult {
    let env = Env::start()?;
    let pool = S3Pool::create(&env.config("p"), "P", None)?;
    let e = expect_err(S3Pool::create(&env.config("p"), "P", None), "second create");
    assert!(e.to_string().contains("already a pool"), "{e}");
    let reopened = S3Pool::open(&env.config("/p/"))?;
    assert_eq!((reopened.id(), reopened.name()), (pool.id(), "P"));

    std::fs::create_dir_all(env.server.object_file(BUCKET, "used"))?;
    std::fs::write(env.server.object_file(BUCKET, "used/file"), b"x")?;
    let e = expect_err(S3Pool::create(&env.config("used"), "P", None), "create over objects");
    assert!(e.to_string().contains("not empty"), "{e}");
    Ok(())
}

#[test]
fn invalid_configurations_and_arguments() -> TestResult {
    let env = Env::start()?;
    let cases = [
        (
            "no bucket",
            S3PoolConfig { bucket: String::new(), ..env.config("p") },
            "bucket is not set",
        ),
        ("bad prefix", env.config("a//b"), "invalid prefix"),
        (
            "key without secret",
            S3PoolConfig { secret_key: None, ..env.config("p") },
            "both access_key and secret_key",
        ),
        ("plain http not allowed", S3PoolConfig { allow_http: false, ..env.config("p") }, ""),
    ];
    for (what, config, text) in cases {
        let e = expect_err(S3Pool::create(&config, "P", None), what).to_string();
        eprintln!("{what}: {e}");
        assert!(e.contains(text), "{what}: {e}");
    }
    for (name, target) in [("", None), ("P", Some(1)), ("P", Some(2 << 30))] {
        expect_err(S3Pool::create(&env.config("q"), name, target), "invalid name or size");
    }
    Ok(())
}

#[test]
fn config_reads_from_toml() -> TestResult {
    let config: S3PoolConfig = toml::from_str(
        "endpoint = \"http://127.0.0.1:9000\"\nbucket = \"b\"\nprefix = \"pools/x\"\n\
         allow_http = true\nmax_retries = 3\n",
    )?;
    assert_eq!(config.bucket, "b");
    assert_eq!(config.max_retries, 3);
    assert_eq!(config.sync_seal_size, qsm_pool_s3::DEFAULT_SYNC_SEAL_SIZE);
    assert!(toml::from_str::<S3PoolConfig>("bucket = \"b\"\nbukket = \"c\"\n").is_err());
    let back: S3PoolConfig = toml::from_str(&toml::to_string(&config)?)?;
    assert_eq!(back, config);
    Ok(())
}
