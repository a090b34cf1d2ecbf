//! The server's certificate: the configured one, or a self-signed one made on first start.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use tonic::transport::Identity;

use crate::{ServerConfig, ServerError};

/// The identity to serve TLS with, and the certificate's path (what clients must trust).
pub fn identity(config: &ServerConfig) -> Result<(Identity, PathBuf), ServerError> {
    config.check_tls_files().map_err(ServerError::Failed)?;
    let (cert, key) = config.tls_paths();
    if !cert.exists() && !key.exists() {
        generate(config, &cert, &key)?;
    }
    let read = |p: &PathBuf| {
        std::fs::read(p).map_err(|e| ServerError::Failed(format!("reading {}: {e}", p.display())))
    };
    Ok((Identity::from_pem(read(&cert)?, read(&key)?), cert))
}

fn generate(config: &ServerConfig, cert: &PathBuf, key: &PathBuf) -> Result<(), ServerError> {
    let mut names: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    names.extend(hostname());
    names.extend(config.tls_names.iter().cloned());
    let made = rcgen::generate_simple_self_signed(names)
        .map_err(|e| ServerError::Failed(format!("generating a certificate: {e}")))?;
    for (path, text, mode) in [
        (cert, made.cert.pem(), 0o644),
        // The key never leaves this machine: owner-only, created so, never widened.
        (key, made.signing_key.serialize_pem(), 0o600),
    ] {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| ServerError::Failed(format!("creating {}: {e}", dir.display())))?;
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(path)
            .map_err(|e| ServerError::Failed(format!("writing {}: {e}", path.display())))?;
        f.write_all(text.as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|e| ServerError::Failed(format!("writing {}: {e}", path.display())))?;
    }
    Ok(())
}

/// This machine's name as the kernel has it, if it has one: for the generated certificate and
/// the server's name among those sharing a catalog.
pub(crate) fn hostname() -> Option<String> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let host = host.trim();
    (!host.is_empty()).then(|| host.to_owned())
}
