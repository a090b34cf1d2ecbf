//! The PEM files either side of a TLS connection is given: a garbage file must be named as
//! what it is not, not surface later as a handshake failure that blames the other side.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Why `pem` holds no certificate a TLS peer can use, if it holds none.
pub fn check_certificates(pem: &[u8]) -> Result<(), String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("not a PEM certificate: {e}"))?;
    if certs.is_empty() {
        return Err("holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into());
    }
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err("holds no certificate that parses (damaged PEM)".into());
    }
    Ok(())
}

/// Why `pem` holds no private key, if it holds none.
pub fn check_private_key(pem: &[u8]) -> Result<(), String> {
    PrivateKeyDer::from_pem_slice(pem).map(drop).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => {
            "holds no PEM private key (-----BEGIN PRIVATE KEY-----)".to_owned()
        }
        e => format!("not a PEM private key: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_neither_a_certificate_nor_a_key() {
        let garbage = b"this is not a certificate\n";
        assert!(check_certificates(garbage).unwrap_err().contains("no PEM certificate"));
        assert!(check_private_key(garbage).unwrap_err().contains("no PEM private key"));
        let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        assert_eq!(check_certificates(made.cert.pem().as_bytes()), Ok(()));
        assert_eq!(check_private_key(made.signing_key.serialize_pem().as_bytes()), Ok(()));
        assert!(check_private_key(made.cert.pem().as_bytes()).is_err());
    }
}
