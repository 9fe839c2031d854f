//! The TLS files a config names (certificates, keys, CA bundles): each section lists its own
//! ([`Section::tls_files`]) and checks its own URL schemes; here every one is checked readable
//! (it is parsed when the node starts), and refused in a build without TLS.

use std::path::PathBuf;

use super::{ConfigError, Section};

/// The options of `options` that are set, each with its file.
pub(super) fn named<'a, const N: usize>(
    options: [(&'static str, &'a Option<PathBuf>); N],
) -> Vec<(&'static str, &'a PathBuf)> {
    options
        .into_iter()
        .filter_map(|(option, path)| path.as_ref().map(|p| (option, p)))
        .collect()
}

/// Every TLS file `sections` name is readable, and the build has TLS in it if any is set.
pub(super) fn check_files(sections: &[&dyn Section]) -> Result<(), ConfigError> {
    for (option, path) in sections.iter().flat_map(|s| s.tls_files()) {
        if !cfg!(feature = "tls") {
            return Err(ConfigError::Invalid(format!(
                "{option} is set, but this build of baton has no TLS (cargo feature `tls`)"
            )));
        }
        std::fs::File::open(path).map_err(|source| ConfigError::File {
            option,
            path: path.clone(),
            source,
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::config::*;

    #[test]
    fn https_needs_both_certificate_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("cert.pem");
        std::fs::write(&cert, "x").unwrap();
        let mut c = NodeConfig::default();
        c.http.tls_cert_file = Some(cert.clone());
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("together"), "{err}");
        c.http.tls_cert_file = None;
        c.http.tls_key_file = Some(cert);
        assert!(c.validate().is_err());
    }

    #[test]
    fn tls_files_must_be_readable_and_schemes_must_match() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let mut c = NodeConfig::default();
        c.resource.tls_ca_file = Some(missing.clone());
        let err = c.validate().unwrap_err();
        if cfg!(feature = "tls") {
            assert!(
                matches!(
                    err,
                    ConfigError::File {
                        option: "[resource] tls_ca_file",
                        ..
                    }
                ),
                "{err}"
            );
        } else {
            assert!(err.to_string().contains("feature `tls`"), "{err}");
        }
        let mut c = NodeConfig::default();
        c.redis.tls_ca_file = Some(missing.clone());
        assert!(c.validate().unwrap_err().to_string().contains("rediss://"));
        let mut c = NodeConfig::default();
        c.etcd.tls_ca_file = Some(missing);
        assert!(c.validate().unwrap_err().to_string().contains("https://"));
    }

    #[cfg(feature = "tls")]
    #[test]
    fn readable_tls_files_pass_validation_and_stay_out_of_reports() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "x").unwrap();
        let mut c = NodeConfig::default();
        c.http.tls_cert_file = Some(ca.clone());
        c.http.tls_key_file = Some(ca.clone());
        c.resource.tls_ca_file = Some(ca.clone());
        c.redis.url = "rediss://127.0.0.1:6380/".into();
        c.redis.tls_ca_file = Some(ca.clone());
        c.validate().unwrap();
        let redacted = c.redacted_json().to_string();
        assert!(!redacted.contains("ca.pem"), "{redacted}");
        let back: NodeConfig = toml::from_str(&toml::to_string(&c).unwrap()).unwrap();
        assert_eq!(back.http.tls_key_file, Some(ca));
    }
}
