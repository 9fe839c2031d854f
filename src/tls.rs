//! TLS (feature `tls`): the one loader for every PEM file baton reads, and the rustls configs
//! built from them, shared by the client HTTP server and every client (PostgreSQL, Redis, etcd).
//!
//! rustls with the `ring` provider only: pure Rust, no OpenSSL. Server certificates are always
//! verified (chain to the configured CA, name or IP address of the server); there is no switch
//! to turn verification off. Key files are never logged, and errors about them never quote them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// Why a TLS file or configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file holds no usable PEM certificate.
    #[error("{path}: no PEM certificate in it ({detail})")]
    Certificate {
        /// The file.
        path: PathBuf,
        /// What was wrong with it.
        detail: String,
    },
    /// The file holds no usable PEM private key. Deliberately without detail: the parser's
    /// message could quote part of the key.
    #[error("{path}: no usable PEM private key (PKCS#8, PKCS#1 or SEC1) in it")]
    Key {
        /// The file.
        path: PathBuf,
    },
    /// rustls refused the certificates or the key (e.g. the key does not match the certificate).
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// The crypto provider every baton TLS config uses.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Makes `ring` the process-wide default provider, for client crates that build their own rustls
/// config with `ClientConfig::builder()` (redis does), which needs one. Idempotent; an
/// application that installed its own default keeps it.
pub fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A CA bundle: the PEM text as read (redis and etcd's clients take PEM) and its certificates
/// (checked to parse, so a bad file fails at start-up, not at the first connection).
#[derive(Clone)]
pub struct CaBundle {
    pem: Vec<u8>,
    certs: Vec<CertificateDer<'static>>,
}

impl CaBundle {
    /// Reads and checks a PEM file of one or more CA certificates.
    pub fn read(path: &Path) -> Result<CaBundle, TlsError> {
        let pem = read_file(path)?;
        let certs = parse_certs(path, &pem)?;
        Ok(CaBundle { pem, certs })
    }

    /// The PEM text.
    pub fn pem(&self) -> &[u8] {
        &self.pem
    }

    /// A root store of exactly these CAs (never the system's: a private deployment trusts its
    /// own CA, not every public one).
    pub fn roots(&self) -> Result<RootCertStore, TlsError> {
        let mut roots = RootCertStore::empty();
        for cert in &self.certs {
            roots.add(cert.clone())?;
        }
        Ok(roots)
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

fn parse_certs(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = |detail: String| TlsError::Certificate {
        path: path.to_owned(),
        detail,
    };
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no CERTIFICATE section".into()));
    }
    Ok(certs)
}

/// A client config that trusts exactly the CAs in `ca_file`.
pub fn client_config(ca_file: &Path) -> Result<ClientConfig, TlsError> {
    let roots = CaBundle::read(ca_file)?.roots()?;
    Ok(ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// A server config presenting the certificate chain in `cert_file` with the key in `key_file`.
/// `alpn` lists the protocols offered (e.g. `http/1.1`).
pub fn server_config(
    cert_file: &Path,
    key_file: &Path,
    alpn: &[&[u8]],
) -> Result<ServerConfig, TlsError> {
    let chain = parse_certs(cert_file, &read_file(cert_file)?)?;
    let key = PrivateKeyDer::from_pem_slice(&read_file(key_file)?).map_err(|_| TlsError::Key {
        path: key_file.to_owned(),
    })?;
    let mut cfg = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(cfg)
}

/// A tokio-postgres connector verifying the server against `ca_file`.
pub fn postgres_connector(
    ca_file: &Path,
) -> Result<tokio_postgres_rustls::MakeRustlsConnect, TlsError> {
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(
        client_config(ca_file)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_empty_files_are_precise_errors() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.pem");
        assert!(matches!(
            CaBundle::read(&missing),
            Err(TlsError::Read { .. })
        ));
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        assert!(matches!(
            CaBundle::read(&empty),
            Err(TlsError::Certificate { .. })
        ));
        assert!(client_config(&empty).is_err());
    }

    #[test]
    fn a_bad_key_error_never_quotes_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key.pem");
        std::fs::write(
            &key,
            "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWtleS1tYXRlcmlhbA==!!\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let err = TlsError::Key { path: key.clone() }.to_string();
        assert!(!err.contains("c2VjcmV0"), "{err}");
        // server_config fails on the certificate first; the key error path is the same type.
        let cert = dir.path().join("cert.pem");
        std::fs::write(&cert, "").unwrap();
        assert!(server_config(&cert, &key, &[]).is_err());
    }
}
