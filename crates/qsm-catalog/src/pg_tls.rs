//! TLS to the PostgreSQL catalog. The catalog holds password hashes, dedup secrets and
//! wrapped keys, and may sit on another host: its connection is encrypted unless the database
//! is on this machine or the connection string says `sslmode=disable`.
//!
//! `sslmode` is read as libpq reads it, with a safer default:
//!
//! | `sslmode` | TLS | the server's certificate |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` | if the server offers it | not checked |
//! | `require` | always | not checked (encrypted against listeners, not against a server in the middle) |
//! | `verify-ca`, `verify-full` | always | must chain to `sslrootcert` (a PEM file) and name the host |
//! | (none) | `require` for a host on the network, `prefer` on loopback or a local socket | not checked |
//!
//! `verify-ca` checks the name too (rustls always does); a certificate that does not name the
//! host is refused either way. tokio-postgres knows only disable, prefer and require, so the
//! two verify modes and `sslrootcert` are taken out of the string here.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio_postgres::config::{Host, SslMode};

use crate::error::{CatalogError, Result};

/// How a catalog connection is protected.
#[derive(Clone)]
pub(crate) enum Tls {
    /// No TLS (`sslmode=disable`).
    Off,
    /// TLS, as `mode` (prefer or require) says, with this client configuration.
    On(tokio_postgres_rustls::MakeRustlsConnect),
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Tls::Off => "Tls::Off",
            Tls::On(_) => "Tls::On",
        })
    }
}

/// The connection string without the options tokio-postgres does not know, and the TLS they
/// and `sslmode` ask for; `config` is set to the mode tokio-postgres applies.
pub(crate) fn parse(url: &str, shown: &str) -> Result<(tokio_postgres::Config, Tls)> {
    let (rest, mode, root) = take_tls_options(url);
    let mut config: tokio_postgres::Config = rest.parse().map_err(|e| {
        CatalogError::Refused(format!("{shown} is not a PostgreSQL connection string: {e}"))
    })?;
    let local = config.get_hosts().iter().all(|h| match h {
        Host::Unix(_) => true,
        Host::Tcp(name) => {
            let name = name.trim_start_matches('[').trim_end_matches(']');
            name.eq_ignore_ascii_case("localhost")
                || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
        }
    });
    let mode = match mode.as_deref() {
        None if local => "prefer",
        None => "require",
        Some(m) => m,
    };
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| CatalogError::Refused(format!("TLS for {shown}: {e}")))?;
    let client = match mode {
        "disable" => {
            config.ssl_mode(SslMode::Disable);
            return Ok((config, Tls::Off));
        }
        "prefer" | "require" | "allow" => {
            config.ssl_mode(if mode == "require" { SslMode::Require } else { SslMode::Prefer });
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Unchecked(provider)))
                .with_no_client_auth()
        }
        "verify-ca" | "verify-full" => {
            let Some(root) = root else {
                return Err(CatalogError::Refused(format!(
                    "{shown}: sslmode={mode} needs sslrootcert=FILE, the PEM certificate of the \
                     authority that signed the database server's"
                )));
            };
            config.ssl_mode(SslMode::Require);
            let pem = std::fs::read(&root).map_err(|e| {
                CatalogError::Refused(format!("{shown}: reading sslrootcert {root}: {e}"))
            })?;
            let mut roots = rustls::RootCertStore::empty();
            let certs: Vec<CertificateDer<'static>> =
                rustls::pki_types::pem::PemObject::pem_slice_iter(&pem)
                    .collect::<std::result::Result<_, _>>()
                    .map_err(|e| {
                        CatalogError::Refused(format!(
                            "{shown}: sslrootcert {root} is not a PEM certificate: {e}"
                        ))
                    })?;
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(CatalogError::Refused(format!(
                    "{shown}: sslrootcert {root} holds no usable certificate"
                )));
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        other => {
            return Err(CatalogError::Refused(format!(
                "{shown}: unknown sslmode {other:?} (disable, prefer, require, verify-ca, \
                 verify-full)"
            )));
        }
    };
    Ok((config, Tls::On(tokio_postgres_rustls::MakeRustlsConnect::new(client))))
}

/// Whether a connection failed because TLS refused the server (its certificate, or no TLS
/// where it was required): retrying cannot help.
pub(crate) fn is_refused_certificate(e: &tokio_postgres::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cause {
        if c.downcast_ref::<rustls::Error>().is_some() {
            return true;
        }
        if let Some(inner) = c.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref())
            && inner.downcast_ref::<rustls::Error>().is_some()
        {
            return true;
        }
        cause = c.source();
    }
    e.to_string().contains("TLS")
}

/// Removes `sslmode` and `sslrootcert` from a URL's query or a key=value string, returning
/// what is left and their values.
fn take_tls_options(url: &str) -> (String, Option<String>, Option<String>) {
    let (mut mode, mut root) = (None, None);
    let mut keep = |pair: &str| -> bool {
        if let Some(v) = pair.strip_prefix("sslmode=") {
            mode = Some(v.to_owned());
            false
        } else if let Some(v) = pair.strip_prefix("sslrootcert=") {
            root = Some(v.to_owned());
            false
        } else {
            true
        }
    };
    let rest = if url.contains("://") {
        match url.split_once('?') {
            Some((base, query)) => {
                let kept: Vec<&str> = query.split('&').filter(|p| keep(p)).collect();
                if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) }
            }
            None => url.to_owned(),
        }
    } else {
        url.split_whitespace().filter(|p| keep(p)).collect::<Vec<_>>().join(" ")
    };
    (rest, mode, root)
}

/// Accepts any server certificate, as libpq's `require` does: the connection is encrypted,
/// but whoever answers is not authenticated (`verify-full` is what authenticates).
#[derive(Debug)]
struct Unchecked(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_options_are_taken_from_both_forms() {
        let (rest, mode, root) = take_tls_options(
            "postgres://u@h/db?sslmode=verify-full&application_name=x&sslrootcert=/c.pem",
        );
        assert_eq!(rest, "postgres://u@h/db?application_name=x");
        assert_eq!((mode.as_deref(), root.as_deref()), (Some("verify-full"), Some("/c.pem")));
        let (rest, mode, root) = take_tls_options("host=h sslmode=require dbname=d");
        assert_eq!(rest, "host=h dbname=d");
        assert_eq!((mode.as_deref(), root), (Some("require"), None));
        let (rest, mode, _) = take_tls_options("postgres://u@h/db?sslmode=disable");
        assert_eq!((rest.as_str(), mode.as_deref()), ("postgres://u@h/db", Some("disable")));
    }

    #[test]
    fn the_default_is_require_off_this_machine_and_bad_modes_are_refused() {
        let mode = |url: &str| parse(url, url).map(|(c, _)| c.get_ssl_mode());
        assert_eq!(mode("postgres://u@db.example/q").unwrap(), SslMode::Require);
        assert_eq!(mode("postgres://u@127.0.0.1/q").unwrap(), SslMode::Prefer);
        assert_eq!(mode("host=/run/postgresql dbname=q").unwrap(), SslMode::Prefer);
        assert_eq!(mode("postgres://u@db.example/q?sslmode=disable").unwrap(), SslMode::Disable);
        let e = mode("postgres://u@h/q?sslmode=verify-full").unwrap_err().to_string();
        assert!(e.contains("sslrootcert"), "{e}");
        let e = mode("postgres://u@h/q?sslmode=sometimes").unwrap_err().to_string();
        assert!(e.contains("unknown sslmode"), "{e}");
        let e = mode("postgres://u@h/q?sslmode=verify-ca&sslrootcert=/nonexistent/ca.pem")
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
    }
}
