//! Runs the in-process S3 test server of `qsm_pool_s3::test_server` standalone, for
//! end-to-end tests and benchmark scripts of other crates:
//!
//! ```text
//! cargo run -p qsm-pool-s3 --example s3-test-server -- \
//!     --root DIR --addr 127.0.0.1:PORT --access-key K --secret-key S [--bucket NAME]...
//! ```
//!
//! `--addr` defaults to 127.0.0.1:0 (any free port). Once it listens it prints
//! `listening on http://ADDR` on a line of its own (scripts wait for it), then serves until it
//! is killed. Each `--bucket` is created if missing. Not for production: it is `s3s-fs`, an
//! experimental server.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use qsm_pool_s3::test_server::TestServer;

const USAGE: &str = "usage: s3-test-server --root DIR [--addr 127.0.0.1:PORT] --access-key K \
                     --secret-key S [--bucket NAME]...";

struct Args {
    root: PathBuf,
    addr: SocketAddr,
    access_key: String,
    secret_key: String,
    buckets: Vec<String>,
}

fn parse() -> Result<Args, String> {
    let (mut root, mut addr, mut access_key, mut secret_key) = (None, None, None, None);
    let mut buckets = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--help" || flag == "-h" {
            return Err(USAGE.into());
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        match flag.as_str() {
            "--root" => root = Some(PathBuf::from(value)),
            "--addr" => {
                addr = Some(value.parse().map_err(|e| format!("--addr {value}: {e}"))?);
            }
            "--access-key" => access_key = Some(value),
            "--secret-key" => secret_key = Some(value),
            "--bucket" => buckets.push(value),
            _ => return Err(format!("unknown argument {flag}\n{USAGE}")),
        }
    }
    let missing = |what: &str| format!("{what} is required\n{USAGE}");
    Ok(Args {
        root: root.ok_or_else(|| missing("--root"))?,
        addr: addr.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0))),
        access_key: access_key.ok_or_else(|| missing("--access-key"))?,
        secret_key: secret_key.ok_or_else(|| missing("--secret-key"))?,
        buckets,
    })
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = std::fs::create_dir_all(&args.root) {
        eprintln!("s3-test-server: creating {}: {e}", args.root.display());
        return ExitCode::FAILURE;
    }
    let server = match TestServer::start(&args.root, args.addr, &args.access_key, &args.secret_key)
    {
        Ok(server) => server,
        Err(e) => {
            eprintln!("s3-test-server: starting on {}: {e}", args.addr);
            return ExitCode::FAILURE;
        }
    };
    for bucket in &args.buckets {
        if let Err(e) = server.create_bucket(bucket) {
            eprintln!("s3-test-server: creating bucket {bucket}: {e}");
            return ExitCode::FAILURE;
        }
    }
    println!("listening on {}", server.endpoint());
    // Scripts read the line through a pipe, where stdout is block-buffered.
    let _ = std::io::stdout().flush();
    // Serves on its own threads until the process is killed.
    loop {
        std::thread::park();
    }
}
