//! Credentials in the config ([`Secret`]), and the admin token's rules.

use serde::{Deserialize, Serialize};

use super::{ConfigError, NodeConfig};

/// A credential (the admin token, the raft cluster secret): serialized as the plain string (node
/// config files must carry it; `baton fleet` writes them 0600), but `Debug` never shows it, so a
/// `{:?}` of a config in a log cannot leak it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a credential.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }
    /// The secret itself, for the one comparison (or config file) that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Secret {
        Secret(value)
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Shortest admin token accepted: a guessable token is no guard.
pub const MIN_ADMIN_TOKEN_BYTES: usize = 16;

impl NodeConfig {
    /// The admin route (`POST /stepdown`) is reachable by anyone who can reach `listen_ip`: off
    /// loopback it must need a token, and a token must not be guessable.
    pub fn check_admin_surface(&self, listen_ip: std::net::IpAddr) -> Result<(), ConfigError> {
        match &self.admin_token {
            Some(t) if t.expose().len() < MIN_ADMIN_TOKEN_BYTES => Err(ConfigError::Invalid(format!(
                "admin_token is shorter than {MIN_ADMIN_TOKEN_BYTES} bytes"
            ))),
            Some(t) if t.expose().chars().any(|c| c.is_whitespace() || c.is_control()) => Err(
                ConfigError::Invalid("admin_token must not contain whitespace or control characters".into()),
            ),
            None if !listen_ip.is_loopback() => Err(ConfigError::Invalid(format!(
                "the HTTP server listens on {listen_ip}, which is not loopback: set admin_token (or BATON_ADMIN_TOKEN / --admin-token) so POST /stepdown needs it"
            ))),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::*;

    #[test]
    fn off_loopback_without_admin_token_is_refused() {
        let mut c = NodeConfig {
            http_listen: "0.0.0.0:8080".parse().unwrap(),
            ..NodeConfig::default()
        };
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("admin_token"), "{err}");
        c.http_listen = "10.1.2.3:8080".parse().unwrap();
        assert!(c.validate().is_err());
        c.admin_token = Some(Secret::new("0123456789abcdef0123"));
        c.validate().unwrap();
        // Loopback needs none.
        c.admin_token = None;
        c.http_listen = "127.0.0.1:8080".parse().unwrap();
        c.validate().unwrap();
        c.http_listen = "[::1]:8080".parse().unwrap();
        c.validate().unwrap();
    }

    #[test]
    fn short_or_blank_admin_tokens_are_refused() {
        let mut c = NodeConfig::default();
        for bad in ["", "short", "0123456789abcde f"] {
            c.admin_token = Some(Secret::new(bad));
            assert!(c.validate().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn admin_token_never_shows_in_debug_or_redacted_json() {
        let c = NodeConfig {
            admin_token: Some(Secret::new("very-secret-admin-token")),
            ..NodeConfig::default()
        };
        assert!(!format!("{c:?}").contains("very-secret"));
        assert!(!c.redacted_json().to_string().contains("very-secret"));
        // The config file still carries it: a node started from it must know its token.
        let text = toml::to_string(&c).unwrap();
        assert!(text.contains("very-secret-admin-token"));
        let back: NodeConfig = toml::from_str(&text).unwrap();
        assert_eq!(back.admin_token, c.admin_token);
    }
}
