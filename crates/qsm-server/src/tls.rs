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

/// The HTTPS listener's TLS settings: the same certificate as the gRPC listeners (made
/// first by [`identity`] if missing), HTTP/1.1 only.
pub fn http_config(
    config: &ServerConfig,
) -> Result<std::sync::Arc<rustls::ServerConfig>, ServerError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    identity(config)?;
    let (cert, key) = config.tls_paths();
    let bad = |p: &PathBuf, e: &dyn std::fmt::Display| {
        ServerError::Failed(format!("reading {}: {e}", p.display()))
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert)
        .map_err(|e| bad(&cert, &e))?
        .collect::<Result<_, _>>()
        .map_err(|e| bad(&cert, &e))?;
    let private = PrivateKeyDer::from_pem_file(&key).map_err(|e| bad(&key, &e))?;
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(certs, private))
        .map_err(|e| ServerError::Failed(format!("the HTTPS listener's certificate: {e}")))?;
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(std::sync::Arc::new(tls))
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
