//! Compiles `proto/qsm/v1/qsm.proto` with `protox` (pure Rust: no `protoc` binary needed) and
//! generates the tonic client and server.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["qsm/v1/qsm.proto"], ["proto"])?;
    tonic_prost_build::configure()
        // Frames travel as `Bytes`: decoded without a copy, appended to the pool as received.
        .bytes(".qsm.v1")
        .compile_fds(fds)?;
    Ok(())
}
