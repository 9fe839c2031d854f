//! `[redis]`: the redis and redis-naive backends' server, lock key and Sentinels.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{tls, ConfigError, Secret, Section};

/// `[redis]`: the redis backends' server and lock key.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://host:port/` or, over TLS, `rediss://host:port/`.
    pub url: String,
    /// The lock key; the fenced variant keeps its token counter at `<key>:token`.
    pub key: String,
    /// Bound on each request (and on connecting).
    pub request_timeout_ms: u64,
    /// PEM CA bundle that the server's certificate must chain to (feature `tls`); the URL must
    /// then be `rediss://`.
    pub tls_ca_file: Option<PathBuf>,
    /// Redis Sentinel addresses (`host:port`). When set, the backend asks them which server is
    /// `master_name`'s primary and talks to that one, and asks again after a connection error or
    /// a `READONLY` answer (a failover), without a restart. `url` then gives only how to talk to
    /// the primary: `redis://` or `rediss://` (TLS to the primary and to the Sentinels, verified
    /// against `tls_ca_file`), the user and password, the database; its host and port are not
    /// used. A token counter (the `redis` backend) can go back after a failover to a replica that
    /// lacked the last `INCR`s: the fenced resource refuses such a token (README).
    pub sentinels: Vec<String>,
    /// The name the Sentinels monitor the primary under (their `sentinel monitor NAME ...`);
    /// required with `sentinels`.
    pub master_name: Option<String>,
    /// The password the Sentinels themselves ask for (their `requirepass`), sent with `AUTH` on
    /// every Sentinel connection. Only with `sentinels`. The data servers' password is `url`'s,
    /// which the Sentinels reach them with through their own `sentinel auth-pass`.
    pub sentinel_password: Option<Secret>,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            url: "redis://127.0.0.1:6379/".into(),
            key: "baton:leader".into(),
            request_timeout_ms: 1000,
            tls_ca_file: None,
            sentinels: Vec::new(),
            master_name: None,
            sentinel_password: None,
        }
    }
}

impl RedisConfig {
    /// The Sentinel options: every address a `host:port` with a port, a master name with them
    /// (and only with them), a `url` that still parses (it carries the primary's scheme and
    /// credentials).
    fn validate_sentinels(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(format!("[redis] {m}")));
        match (&self.master_name, self.sentinels.is_empty()) {
            (None, false) => {
                return bad(
                    "sentinels needs master_name: the name the Sentinels monitor the primary under (their `sentinel monitor NAME host port quorum`)".into(),
                )
            }
            (Some(_), true) => {
                return bad(
                    "master_name is set but sentinels is empty: list the Sentinels' host:port addresses, or remove master_name for a single Redis at url".into(),
                )
            }
            (Some(name), false) if name.is_empty() || name.chars().any(char::is_whitespace) => {
                return bad(format!(
                    "master_name {name:?} must be non-empty, without whitespace"
                ))
            }
            _ => {}
        }
        if self.sentinel_password.is_some() && self.sentinels.is_empty() {
            return bad(
                "sentinel_password is set but sentinels is empty: it is the Sentinels' own password"
                    .into(),
            );
        }
        for s in &self.sentinels {
            let port = s
                .rsplit_once(':')
                .filter(|(host, _)| !host.is_empty() && !host.contains('/'))
                .and_then(|(_, port)| port.parse::<u16>().ok())
                .filter(|&p| p > 0);
            if port.is_none() {
                return bad(format!(
                    "sentinels entry {s:?} is not host:port (e.g. \"127.0.0.1:26379\")"
                ));
            }
        }
        Ok(())
    }

    /// A CA needs a `rediss://` url, and one without `#insecure`.
    fn validate_tls(&self) -> Result<(), ConfigError> {
        if self.tls_ca_file.is_some() && !self.url.starts_with("rediss://") {
            return Err(ConfigError::Invalid(
                "[redis] tls_ca_file needs a rediss:// url".into(),
            ));
        }
        // The redis client reads `#insecure` as "skip certificate checks": never with a CA.
        if self.tls_ca_file.is_some() && self.url.contains("#insecure") {
            return Err(ConfigError::Invalid(
                "[redis] a url with #insecure would skip the checks tls_ca_file asks for".into(),
            ));
        }
        Ok(())
    }
}

impl Section for RedisConfig {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.validate_sentinels()?;
        self.validate_tls()
    }

    fn redacted_keys(&self) -> &'static [&'static str] {
        &["url", "sentinels", "sentinel_password", "tls_ca_file"]
    }

    fn tls_files(&self) -> Vec<(&'static str, &PathBuf)> {
        tls::named([("[redis] tls_ca_file", &self.tls_ca_file)])
    }
}

#[cfg(test)]
mod tests {
    use crate::config::*;
    use crate::elector::BackendKind;

    fn with(sentinels: &[&str], master_name: Option<&str>) -> Result<(), ConfigError> {
        let mut c = NodeConfig::for_backend(BackendKind::Redis);
        c.redis.sentinels = sentinels.iter().map(|s| s.to_string()).collect();
        c.redis.master_name = master_name.map(str::to_owned);
        c.validate()
    }

    fn refused(sentinels: &[&str], master_name: Option<&str>) -> String {
        with(sentinels, master_name).unwrap_err().to_string()
    }

    #[test]
    fn sentinels_need_a_master_name_and_host_port_addresses() {
        with(&[], None).unwrap();
        with(
            &["127.0.0.1:26379", "sentinel-2.example:26379"],
            Some("baton"),
        )
        .unwrap();
        assert!(refused(&["127.0.0.1:26379"], None).contains("sentinels needs master_name"));
        assert!(refused(&[], Some("baton")).contains("sentinels is empty"));
        assert!(refused(&["127.0.0.1:26379"], Some("")).contains("master_name"));
        assert!(refused(&["127.0.0.1:26379"], Some("a b")).contains("whitespace"));
        for bad in [
            "127.0.0.1",
            ":26379",
            "127.0.0.1:0",
            "127.0.0.1:port",
            "redis://h:1/",
        ] {
            let e = refused(&[bad], Some("baton"));
            assert!(e.contains("is not host:port"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_sentinel_addresses_stay_out_of_reports() {
        let mut c = NodeConfig::for_backend(BackendKind::Redis);
        c.redis.sentinels = vec!["10.1.2.3:26379".into()];
        c.redis.master_name = Some("baton".into());
        c.redis.sentinel_password = Some(Secret::new("sentinel-hunter2"));
        let v = c.redacted_json().to_string();
        assert!(!v.contains("10.1.2.3"), "{v}");
        assert!(!v.contains("sentinel-hunter2"), "{v}");
        assert!(v.contains("\"master_name\":\"baton\""), "{v}");
        assert!(!format!("{c:?}").contains("sentinel-hunter2"));
    }

    #[test]
    fn a_sentinel_password_needs_sentinels() {
        let mut c = NodeConfig::for_backend(BackendKind::Redis);
        c.redis.sentinel_password = Some(Secret::new("pw"));
        let e = c.redis.validate().unwrap_err().to_string();
        assert!(
            e.contains("sentinel_password is set but sentinels is empty"),
            "{e}"
        );
        c.redis.sentinels = vec!["127.0.0.1:26379".into()];
        c.redis.master_name = Some("baton".into());
        c.redis.validate().unwrap();
    }
}
