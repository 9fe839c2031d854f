//! The node config's reference and a starting config for a real host, both generated from the
//! code so they cannot drift from it: every key and its meaning come from the doc comments of
//! `NodeConfig` and its sections in `src/config/` (compiled in), every default from
//! `NodeConfig::default()`. `baton config reference` prints the reference
//! (`deploy/config-reference.md` is its output, compared by a test); `baton config init` writes a
//! commented node config from a few flags.

use std::fmt::Write as _;
use std::path::PathBuf;

use baton::backends::BackendKind;
use baton::config::{NodeConfig, PeerSpec};

/// The sources the reference is read from: every file of `src/config/`, by its name there (a
/// test checks that none that declares a struct is missing).
const CONFIG_SOURCES: [(&str, &str); 18] = [
    ("mod.rs", include_str!("../../src/config/mod.rs")),
    ("budget.rs", include_str!("../../src/config/budget.rs")),
    ("common.rs", include_str!("../../src/config/common.rs")),
    ("detector.rs", include_str!("../../src/config/detector.rs")),
    ("etcd.rs", include_str!("../../src/config/etcd.rs")),
    ("http.rs", include_str!("../../src/config/http.rs")),
    ("pg_lease.rs", include_str!("../../src/config/pg_lease.rs")),
    ("raft.rs", include_str!("../../src/config/raft.rs")),
    ("read.rs", include_str!("../../src/config/read.rs")),
    ("redis.rs", include_str!("../../src/config/redis.rs")),
    ("resource.rs", include_str!("../../src/config/resource.rs")),
    (
        "scheduler.rs",
        include_str!("../../src/config/scheduler.rs"),
    ),
    ("secret.rs", include_str!("../../src/config/secret.rs")),
    (
        "sequencer.rs",
        include_str!("../../src/config/sequencer.rs"),
    ),
    ("shards.rs", include_str!("../../src/config/shards.rs")),
    ("timing.rs", include_str!("../../src/config/timing.rs")),
    ("tls.rs", include_str!("../../src/config/tls.rs")),
    ("zk.rs", include_str!("../../src/config/zk.rs")),
];

/// Every line of [`CONFIG_SOURCES`], file after file.
fn config_lines() -> impl Iterator<Item = &'static str> {
    CONFIG_SOURCES.iter().flat_map(|(_, text)| text.lines())
}

/// Where the generated reference is committed.
pub const REFERENCE_PATH: &str = "deploy/config-reference.md";

/// One key of a section, as its doc comment describes it.
#[derive(Clone, Debug)]
pub struct Key {
    /// The key's name in TOML.
    pub name: String,
    /// Its Rust type (tells a section from a value).
    pub rust_type: String,
    /// Its doc comment, joined into one paragraph, rustdoc links made plain.
    pub doc: String,
}

/// The fields of `pub struct NAME { ... }` in `src/config/`, with their doc comments.
pub fn struct_keys(name: &str) -> Vec<Key> {
    let mut keys = Vec::new();
    let mut inside = false;
    let mut doc: Vec<String> = Vec::new();
    for line in config_lines() {
        let t = line.trim();
        if !inside {
            inside = t == format!("pub struct {name} {{");
            doc.clear();
            continue;
        }
        if t == "}" {
            break;
        }
        if let Some(d) = t.strip_prefix("///") {
            doc.push(d.trim().to_owned());
        } else if let Some((field, ty)) = t
            .strip_prefix("pub ")
            .and_then(|f| f.trim_end_matches(',').split_once(": "))
        {
            keys.push(Key {
                name: field.to_owned(),
                rust_type: ty.to_owned(),
                doc: plain(&doc.join(" ")),
            });
            doc.clear();
        } else if !t.starts_with("#[") {
            doc.clear();
        }
    }
    keys
}

/// Rustdoc links as plain code: "[`a`](b)" and "[`a`]" become "`a`".
fn plain(doc: &str) -> String {
    let mut out = String::new();
    let mut rest = doc;
    while let Some(open) = rest.find("[`") {
        let Some(close) = rest[open..].find("`]").map(|c| open + c) else {
            break;
        };
        out.push_str(&rest[..open]);
        out.push_str(&rest[open + 1..close + 1]);
        rest = &rest[close + 2..];
        if rest.starts_with('(') {
            if let Some(end) = rest.find(')') {
                rest = &rest[end + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The doc comment of `pub struct NAME` in `src/config/`, joined into one paragraph.
pub fn struct_doc(name: &str) -> String {
    let mut doc: Vec<String> = Vec::new();
    for line in config_lines() {
        let t = line.trim();
        if t == format!("pub struct {name} {{") {
            return plain(&doc.join(" "));
        }
        if let Some(d) = t.strip_prefix("///") {
            doc.push(d.trim().to_owned());
        } else if !t.starts_with("#[") {
            doc.clear();
        }
    }
    String::new()
}

/// Whether `ty` is one of the config's structs (written as a TOML table).
fn is_table(ty: &str) -> bool {
    !struct_keys(ty).is_empty()
}

/// The struct of a key written as an array of tables (`Vec<PeerSpec>` → `PeerSpec`).
fn table_array(ty: &str) -> Option<&str> {
    ty.strip_prefix("Vec<")
        .and_then(|t| t.strip_suffix('>'))
        .filter(|t| is_table(t))
}

/// How a value of Rust type `ty` is written in TOML: `integer`, `float`, `boolean`, `string`
/// (text, paths, addresses, secrets and the enums, which are written as their names), `array
/// of ...` or `table`. An `Option` is written as what it holds, or left out.
pub fn toml_type(ty: &str) -> String {
    let ty = ty.trim();
    if let Some(inner) = ty.strip_prefix("Option<").and_then(|t| t.strip_suffix('>')) {
        return toml_type(inner);
    }
    if let Some(inner) = ty.strip_prefix("Vec<").and_then(|t| t.strip_suffix('>')) {
        return format!("array of {}s", toml_type(inner));
    }
    match ty {
        "u8" | "u16" | "u32" | "u64" | "usize" | "i8" | "i16" | "i32" | "i64" | "isize" => {
            "integer".into()
        }
        "f32" | "f64" => "float".into(),
        "bool" => "boolean".into(),
        _ if is_table(ty) => "table".into(),
        _ => "string".into(),
    }
}

/// The unit of an integer key, from its name (`_ms`, `_bytes`); none for any other type (a
/// string like `election_timeout_ms = "150-250"` names its unit in its meaning).
fn unit(key: &Key) -> Option<&'static str> {
    if toml_type(&key.rust_type) != "integer" {
        None
    } else if key.name.ends_with("_ms") {
        Some("ms")
    } else if key.name.ends_with("_bytes") {
        Some("bytes")
    } else {
        None
    }
}

/// A key's type as the reference shows it: `integer (ms)`, `string`, `array of tables`, ...
fn show_type(key: &Key) -> String {
    let ty = toml_type(&key.rust_type);
    match unit(key) {
        Some(u) => format!("{ty} ({u})"),
        None => ty,
    }
}

/// A section's struct: the type of a top-level key that names one of the config's structs.
fn section_struct(key: &Key) -> Option<&str> {
    let ty = key.rust_type.as_str();
    (ty.ends_with("Config") && is_table(ty)).then_some(ty)
}

/// How a default shows in the reference.
fn show_default(v: Option<&toml::Value>) -> String {
    match v {
        None => "unset".to_owned(),
        Some(toml::Value::Array(a)) if a.is_empty() => "`[]`".to_owned(),
        Some(v) => format!("`{v}`"),
    }
}

/// The rows of `keys`. `defaults` is the section's default table; `None` for the tables of an
/// array, which have no defaults: there a key that is not an `Option` is required.
fn table_rows(out: &mut String, keys: &[Key], defaults: Option<&toml::Table>) {
    out.push_str("| key | type | default | meaning |\n| --- | --- | --- | --- |\n");
    for k in keys {
        let default = match defaults {
            Some(d) => show_default(d.get(&k.name)),
            None if k.rust_type.starts_with("Option<") => "unset".to_owned(),
            None => "required".to_owned(),
        };
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} |",
            k.name,
            show_type(k),
            default,
            k.doc.replace('|', "\\|")
        );
    }
}

/// The array-of-tables keys of section `section` (type `ty`), each as its own table:
/// `[[raft.peers]]`, `[[shards.members]]`, `[[detector.peers]]`.
fn table_array_rows(out: &mut String, section: &str, ty: &str) {
    for k in struct_keys(ty) {
        let Some(elem) = table_array(&k.rust_type) else {
            continue;
        };
        let _ = write!(
            out,
            "\n### `[[{section}.{key}]]`\n\n{doc} `{key}` above is a list of these: write one \
             `[[{section}.{key}]]` table per entry. A key without a default is required.\n\n",
            key = k.name,
            doc = struct_doc(elem),
        );
        table_rows(out, &struct_keys(elem), None);
    }
}

/// The whole reference, in Markdown.
pub fn reference() -> String {
    let defaults = toml::Table::try_from(NodeConfig::default()).expect("the default serializes");
    let top = struct_keys("NodeConfig");
    let mut out = String::from(
        "# baton node config reference\n\n\
         Generated from the code by `baton config reference` (each key's doc comment in \
         `src/config/`, each default from `NodeConfig::default()`); a test fails when this file \
         differs, so regenerate it with `baton config reference > deploy/config-reference.md`. \
         Every key is optional, except inside the tables of an array (`[[raft.peers]]` and the \
         like), where a key marked \"required\" must be given; an unknown key is an error. \
         `baton node` and `baton run` read it with `--config FILE`, and their flags override it. \
         \"type\" is how the value is written in TOML (`string` also covers paths, addresses \
         and the named choices such as `backend`); an integer's unit, where it has one, follows \
         in brackets. \"unset\" means no value unless one is given. Start from `baton config \
         init` (see deploy/README.md).\n\n## Top level\n\n",
    );
    let (values, sections): (Vec<Key>, Vec<Key>) =
        top.into_iter().partition(|k| section_struct(k).is_none());
    table_rows(&mut out, &values, Some(&defaults));
    for s in &sections {
        let ty = section_struct(s).expect("partitioned");
        let _ = write!(out, "\n## `[{}]`\n\n{}\n\n", s.name, s.doc);
        let d = defaults.get(&s.name).and_then(|v| v.as_table());
        table_rows(&mut out, &struct_keys(ty), d);
        table_array_rows(&mut out, &s.name, ty);
    }
    out
}

/// `baton config init`: what a real host's node config needs.
#[derive(clap::Args, Debug)]
pub struct InitArgs {
    /// This node's id (unique in the fleet).
    #[arg(long)]
    pub node_id: String,
    /// The election backend.
    #[arg(long, default_value = "raft")]
    pub backend: BackendKind,
    /// Where this node's client HTTP server listens, e.g. 0.0.0.0:7001 (off loopback the admin
    /// token is required: give it as BATON_ADMIN_TOKEN in the unit's environment file).
    #[arg(long, default_value = "127.0.0.1:7001")]
    pub listen: std::net::SocketAddr,
    /// The address other nodes and clients reach this node's HTTP server at, e.g. host1:7001.
    #[arg(long)]
    pub advertise: Option<String>,
    /// Raft: every member, `ID=HOST:HTTP_PORT/PEER_PORT`, comma-separated, this node included.
    #[arg(long, value_delimiter = ',')]
    pub peers: Vec<String>,
    /// Raft: where the cluster secret lives (a file, 0600, the same on every member).
    #[arg(long, default_value = "/etc/baton/cluster-secret")]
    pub cluster_secret_file: PathBuf,
    /// etcd: the members' client URLs, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub etcd_endpoints: Vec<String>,
    /// redis / redis-naive: the server's URL.
    #[arg(long)]
    pub redis_url: Option<String>,
    /// zk: the ensemble, host:port,host:port,...
    #[arg(long)]
    pub zk_connect: Option<String>,
    /// pg-lease: the lease store's URL (its own role, `baton_lease`).
    #[arg(long, conflicts_with = "lease_url_file")]
    pub lease_url: Option<String>,
    /// pg-lease: read --lease-url from this file instead (`baton db init --backend pg-lease
    /// --out DIR` writes DIR/baton_lease.url), so the password stays off the command line.
    #[arg(long)]
    pub lease_url_file: Option<PathBuf>,
    /// The fenced resource's URL, as this node's own role (`baton_node_<id>`, which `baton db
    /// init --nodes` creates), written into the config.
    #[arg(
        long,
        required_unless_present = "database_url_file",
        conflicts_with = "database_url_file"
    )]
    pub database_url: Option<String>,
    /// Read --database-url from this file instead (`baton db init --out DIR` writes
    /// DIR/baton_node_<id>.url, 0600), so the password stays off the command line.
    #[arg(long)]
    pub database_url_file: Option<PathBuf>,
    /// Where the node keeps its state (raft log, actor trace).
    #[arg(long, default_value = "/var/lib/baton")]
    pub state_dir: PathBuf,
    /// For `baton run`: the `--child-stop-margin` it will run with. The lease (and on raft the
    /// election timeout) is raised so the margin fits: derived, not guessed.
    #[arg(long, value_parser = baton::config::parse_duration_ms)]
    pub child_stop_margin: Option<u64>,
    /// Write the config here (mode 0600, never over an existing file) instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Why `baton config init` refused its flags; nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// A `--peers` entry that is not `ID=HOST:HTTP_PORT/PEER_PORT`.
    #[error("--peers entry {0:?}: use ID=HOST:HTTP_PORT/PEER_PORT, e.g. n1=10.0.0.1:7001/7101")]
    Peer(String),
    /// The backend needs a flag that was not given.
    #[error("the {backend} backend needs {flag}")]
    Missing {
        /// The backend.
        backend: &'static str,
        /// The flag it needs.
        flag: &'static str,
    },
    /// The config the flags make does not validate.
    #[error(transparent)]
    Invalid(#[from] baton::config::ConfigError),
    /// Neither `--database-url` nor `--database-url-file`.
    #[error("give the fenced resource's URL: --database-url or --database-url-file")]
    NoDatabaseUrl,
    /// A URL file could not be read, or holds no URL.
    #[error("reading a URL from {0}: {1}")]
    Read(PathBuf, std::io::Error),
    /// `--out` names a file that exists.
    #[error("{0} exists; not overwritten")]
    Exists(PathBuf),
    /// Writing `--out` failed.
    #[error("writing {0}: {1}")]
    Write(PathBuf, std::io::Error),
}

fn parse_peer(entry: &str) -> Result<PeerSpec, InitError> {
    let bad = || InitError::Peer(entry.to_owned());
    let (id, rest) = entry.split_once('=').ok_or_else(bad)?;
    let (addr, peer_port) = rest.split_once('/').ok_or_else(bad)?;
    let (host, _) = addr.rsplit_once(':').ok_or_else(bad)?;
    peer_port.parse::<u16>().map_err(|_| bad())?;
    Ok(PeerSpec {
        id: id.to_owned(),
        addr: addr.to_owned(),
        peer_addr: format!("{host}:{peer_port}"),
    })
}

/// A URL given as a flag, or read from a file (surrounding whitespace trimmed), or neither.
fn url_arg(url: &Option<String>, file: &Option<PathBuf>) -> Result<Option<String>, InitError> {
    match (url, file) {
        (Some(url), _) => Ok(Some(url.clone())),
        (None, Some(path)) => {
            let text =
                std::fs::read_to_string(path).map_err(|e| InitError::Read(path.clone(), e))?;
            match text.trim() {
                "" => Err(InitError::Read(
                    path.clone(),
                    std::io::Error::new(std::io::ErrorKind::InvalidData, "the file is empty"),
                )),
                url => Ok(Some(url.to_owned())),
            }
        }
        (None, None) => Ok(None),
    }
}

/// The shipped timing for `backend` (config/<backend>.toml, compiled in): what the fleets and
/// tests run with.
fn backend_base(backend: BackendKind) -> NodeConfig {
    let text = match backend {
        BackendKind::Raft => include_str!("../../config/raft.toml"),
        BackendKind::Etcd => include_str!("../../config/etcd.toml"),
        BackendKind::Redis => include_str!("../../config/redis.toml"),
        BackendKind::RedisNaive => include_str!("../../config/redis-naive.toml"),
        BackendKind::Zk => include_str!("../../config/zk.toml"),
        BackendKind::PgLease => include_str!("../../config/pg-lease.toml"),
        BackendKind::Custom => "",
    };
    toml::from_str(text).expect("config/*.toml parse")
}

/// The config `args` describe, validated as a node would validate it (with the admin token
/// the unit's environment will supply, when the listener is off loopback).
pub fn init_config(args: &InitArgs) -> Result<NodeConfig, InitError> {
    let mut c = NodeConfig {
        node_id: args.node_id.clone(),
        backend: args.backend,
        http_listen: args.listen,
        advertise_addr: args.advertise.clone(),
        state_dir: args.state_dir.clone(),
        ..backend_base(args.backend)
    };
    c.resource.database_url =
        url_arg(&args.database_url, &args.database_url_file)?.ok_or(InitError::NoDatabaseUrl)?;
    let missing = |flag| InitError::Missing {
        backend: args.backend.as_str(),
        flag,
    };
    match args.backend {
        BackendKind::Raft => {
            c.raft.peers = args
                .peers
                .iter()
                .map(|p| parse_peer(p))
                .collect::<Result<_, _>>()?;
            if !c.raft.peers.iter().any(|p| p.id == c.node_id) {
                return Err(missing("--peers listing this node"));
            }
            c.raft.cluster_secret_file = Some(args.cluster_secret_file.clone());
            // The peer listener on this node's peer port, on the client listener's address
            // (its `peer_addr` may be a host name, which a listener cannot bind).
            let me = c.raft.peers.iter().find(|p| p.id == c.node_id);
            let port = me.and_then(|p| p.peer_addr.rsplit_once(':')?.1.parse::<u16>().ok());
            c.raft.peer_listen = port.map(|port| std::net::SocketAddr::new(args.listen.ip(), port));
        }
        BackendKind::Etcd if args.etcd_endpoints.is_empty() => {
            return Err(missing("--etcd-endpoints"))
        }
        BackendKind::Etcd => c.etcd.endpoints = args.etcd_endpoints.clone(),
        BackendKind::Redis | BackendKind::RedisNaive => {
            c.redis.url = args
                .redis_url
                .clone()
                .ok_or_else(|| missing("--redis-url"))?
        }
        BackendKind::Zk => {
            c.zk.connect = args
                .zk_connect
                .clone()
                .ok_or_else(|| missing("--zk-connect"))?
        }
        BackendKind::PgLease => {
            c.pg_lease.database_url = url_arg(&args.lease_url, &args.lease_url_file)?
                .ok_or_else(|| missing("--lease-url or --lease-url-file"))?
        }
        BackendKind::Custom => return Err(missing("a built-in backend")),
    }
    if let Some(margin_ms) = args.child_stop_margin {
        derive_timing_for_margin(&mut c, margin_ms);
    }
    // Validated as it will run: the secret comes from a file at start, the admin token from
    // the environment; placeholders stand in for both here and are not written.
    let mut check = c.clone();
    check.work_stop_margin_ms = args.child_stop_margin.unwrap_or(0);
    check.raft.cluster_secret_file = None;
    if !check.raft.peers.is_empty() {
        check.raft.cluster_secret = Some("placeholder".to_owned().into());
    }
    check.admin_token = Some("placeholder-admin-token-0123456789".to_owned().into());
    check.validate()?;
    Ok(c)
}

/// Raises `c`'s lease (and on raft the election timeout) for a `baton run --child-stop-margin`
/// of `margin_ms`, leaving the watchdog 3 renewals + 5 ms after each renewal: see
/// [`NodeConfig::fit_stop_margin`]. The margin itself is not written: `baton run` sets it from
/// its flag.
fn derive_timing_for_margin(c: &mut NodeConfig, margin_ms: u64) {
    c.fit_stop_margin(margin_ms);
}

/// `key = value` lines of `table`, each under its doc comment (as `# ` lines).
fn commented(out: &mut String, table: &toml::Table, keys: &[Key], only: &[&str]) {
    for k in keys.iter().filter(|k| only.contains(&k.name.as_str())) {
        let Some(v) = table.get(&k.name) else {
            continue;
        };
        for line in wrap(&k.doc, 96) {
            let _ = writeln!(out, "# {line}");
        }
        let _ = writeln!(out, "{} = {v}\n", k.name);
    }
}

fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in text.split_whitespace() {
        let last = lines.last_mut().expect("one line");
        if !last.is_empty() && last.len() + 1 + word.len() > width {
            lines.push(word.to_owned());
        } else {
            if !last.is_empty() {
                last.push(' ');
            }
            last.push_str(word);
        }
    }
    lines
}

/// The commented TOML for `c`: the keys a host sets, each with its meaning; every other key
/// keeps its default (deploy/config-reference.md lists them).
pub fn init_toml(c: &NodeConfig) -> String {
    let table = toml::Table::try_from(c).expect("a config serializes");
    let mut out = format!(
        "# baton node config for {}, written by `baton config init`.\n\
         # Every key not here keeps its default: see deploy/config-reference.md. Keep this file\n\
         # 0600: it holds database URLs. The admin token is not here: give it as\n\
         # BATON_ADMIN_TOKEN in the unit's environment file (deploy/README.md).\n\n",
        c.node_id
    );
    let top = struct_keys("NodeConfig");
    commented(
        &mut out,
        &table,
        &top,
        &[
            "node_id",
            "backend",
            "http_listen",
            "advertise_addr",
            "state_dir",
            "election_timeout_ms",
            "lease_ttl_ms",
            "renew_interval_ms",
            "retry_interval_ms",
            "deadline_margin_ms",
        ],
    );
    let section = |out: &mut String, name: &str, ty: &str, only: &[&str]| {
        if let Some(t) = table.get(name).and_then(|v| v.as_table()) {
            let _ = writeln!(out, "[{name}]");
            commented(out, t, &struct_keys(ty), only);
        }
    };
    section(&mut out, "resource", "ResourceConfig", &["database_url"]);
    match c.backend {
        BackendKind::Raft => {
            section(
                &mut out,
                "raft",
                "RaftConfig",
                &["peer_listen", "cluster_secret_file"],
            );
            for p in &c.raft.peers {
                let _ = writeln!(
                    out,
                    "[[raft.peers]]\nid = {:?}\naddr = {:?}\npeer_addr = {:?}\n",
                    p.id, p.addr, p.peer_addr
                );
            }
        }
        BackendKind::Etcd => section(&mut out, "etcd", "EtcdConfig", &["endpoints"]),
        BackendKind::Redis | BackendKind::RedisNaive => {
            section(&mut out, "redis", "RedisConfig", &["url"])
        }
        BackendKind::Zk => section(&mut out, "zk", "ZkConfig", &["connect"]),
        BackendKind::PgLease => section(&mut out, "pg_lease", "PgLeaseConfig", &["database_url"]),
        BackendKind::Custom => {}
    }
    out
}

/// Writes `text` to `path`, mode 0600, refusing to replace a file.
pub fn write_new_private(path: &std::path::Path, text: &str) -> Result<(), InitError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => InitError::Exists(path.to_owned()),
            _ => InitError::Write(path.to_owned(), e),
        })?;
    f.write_all(text.as_bytes())
        .map_err(|e| InitError::Write(path.to_owned(), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed reference is what the code generates now.
    #[test]
    fn the_committed_reference_is_current() {
        let committed = std::fs::read_to_string(crate::repo_path(REFERENCE_PATH))
            .expect("deploy/config-reference.md");
        let generated = reference();
        assert!(
            committed == generated,
            "{REFERENCE_PATH} is stale: run `baton config reference > {REFERENCE_PATH}`"
        );
    }

    /// Every key a config file can hold is in the reference, with a meaning: the parse of
    /// src/config/ misses nothing that serde writes.
    #[test]
    fn the_reference_covers_every_key_with_a_meaning() {
        use baton::config::{DetectorPeer, MemberSpec};
        // Every array holds an entry and many options are set, so that nearly every key is
        // written and its type can be checked against the one the reference shows.
        let mut full = NodeConfig::default();
        full.raft.peers = vec![PeerSpec {
            id: "n1".into(),
            addr: "a:1".into(),
            peer_addr: "a:2".into(),
        }];
        full.shards.members = vec![MemberSpec {
            id: "n1".into(),
            addr: "a:1".into(),
        }];
        full.detector.peers = vec![DetectorPeer {
            id: "n1".into(),
            addr: "127.0.0.1:3".into(),
        }];
        full.detector.bind = Some("127.0.0.1:3".parse().unwrap());
        full.advertise_addr = Some("a:1".into());
        full.admin_token = Some("t".to_owned().into());
        full.raft.peer_listen = Some("127.0.0.1:2".parse().unwrap());
        full.raft.cluster_secret = Some("s".to_owned().into());
        full.raft.cluster_secret_file = Some("/s".into());
        full.http.commit_threads = Some(1);
        full.http.tls_cert_file = Some("/c".into());
        full.redis.sentinels = vec!["a:4".into()];
        full.redis.master_name = Some("m".into());
        full.redis.sentinel_password = Some("p".to_owned().into());
        full.resource.tls_ca_file = Some("/ca".into());
        let table = toml::Table::try_from(&full).unwrap();

        /// The type of a written value, as `toml_type` names it.
        fn value_type(v: &toml::Value) -> String {
            match v {
                toml::Value::String(_) => "string".into(),
                toml::Value::Integer(_) => "integer".into(),
                toml::Value::Float(_) => "float".into(),
                toml::Value::Boolean(_) => "boolean".into(),
                toml::Value::Datetime(_) => "datetime".into(),
                toml::Value::Array(a) => {
                    format!("array of {}s", value_type(a.first().expect("an entry")))
                }
                toml::Value::Table(_) => "table".into(),
            }
        }
        /// `table`'s keys are `keys`, each with a meaning and the type the value has.
        fn check(r#where: &str, table: &toml::Table, keys: &[Key]) -> usize {
            let mut checked = 0;
            for (name, value) in table {
                let k = keys
                    .iter()
                    .find(|k| &k.name == name)
                    .unwrap_or_else(|| panic!("{where} {name} not in the reference"));
                assert!(!k.doc.is_empty(), "{where} {name} has no doc comment");
                assert_eq!(
                    value_type(value),
                    toml_type(&k.rust_type),
                    "{where} {name}: written as one type, shown as another"
                );
                checked += 1;
                if let Some(sub) = value.as_table() {
                    let ty = section_struct(k).expect("a section");
                    checked += check(&format!("[{name}]"), sub, &struct_keys(ty));
                }
                if let (Some(elem), Some(a)) = (table_array(&k.rust_type), value.as_array()) {
                    let entry = a[0].as_table().expect("a table");
                    checked += check(&format!("{where} [[{name}]]"), entry, &struct_keys(elem));
                }
            }
            checked
        }
        let checked = check("top level", &table, &struct_keys("NodeConfig"));
        assert!(checked > 100, "only {checked} keys checked");

        let r = reference();
        // The default backend is raft, whose default lease is 150 ms.
        assert!(
            r.contains("| `lease_ttl_ms` | integer (ms) | `150` |"),
            "{r}"
        );
        // A range written as a string has no unit of its own.
        assert!(
            r.contains("| `election_timeout_ms` | string | `\"150-250\"` |"),
            "{r}"
        );
        assert!(
            r.contains("| `max_body_bytes` | integer (bytes) | `1024` |"),
            "{r}"
        );
        assert!(r.contains("| `clock_rate_error` | float | `0.01` |"), "{r}");
        assert!(r.contains("| `peers` | array of tables | `[]` |"), "{r}");
        assert!(r.contains("## `[term_backoff]`"));
        assert!(r.contains("| `failed_terms` | integer | `5` |"), "{r}");
        // Every array of tables has its own table of keys, all required.
        for (array, n) in [
            ("raft.peers", 3),
            ("shards.members", 2),
            ("detector.peers", 2),
        ] {
            let head = format!("### `[[{array}]]`");
            let at = r.find(&head).unwrap_or_else(|| panic!("no {head}\n{r}"));
            let rows = r[at..].split("\n\n").nth(2).expect("a table");
            assert_eq!(rows.matches("| string | required |").count(), n, "{rows}");
        }
    }

    /// The reference reads every file of `src/config/` that declares a struct.
    #[test]
    fn the_reference_reads_every_config_file() {
        let dir = crate::repo_path("src/config");
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap().to_owned();
            if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                let read = CONFIG_SOURCES.iter().any(|(f, _)| *f == name);
                assert!(
                    read || !text.contains("pub struct "),
                    "src/config/{name} declares a struct but is not in CONFIG_SOURCES"
                );
            }
        }
    }

    fn init_args(extra: &[&str]) -> InitArgs {
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            a: InitArgs,
        }
        let base = [
            "init",
            "--node-id",
            "n2",
            "--database-url",
            "postgres://baton_app:pw@db:5432/baton",
        ];
        let argv = base.iter().chain(extra).copied();
        <P as clap::Parser>::try_parse_from(argv).unwrap().a
    }

    #[test]
    fn init_writes_a_config_that_reads_back_and_validates() {
        let args = init_args(&[
            "--listen",
            "0.0.0.0:7001",
            "--peers",
            "n1=h1:7001/7101,n2=h2:7001/7101,n3=h3:7001/7101",
        ]);
        let c = init_config(&args).unwrap();
        let text = init_toml(&c);
        assert!(text.contains("# This node's id"), "{text}");
        assert!(!text.contains("placeholder"), "{text}");
        let back: NodeConfig = toml::from_str(&text).unwrap();
        assert_eq!(back.raft.peers.len(), 3);
        assert_eq!(back.raft.peers[1].peer_addr, "h2:7101");
        assert_eq!(Some(back.resource.database_url), args.database_url);
        assert_eq!(
            back.raft.cluster_secret_file,
            Some("/etc/baton/cluster-secret".into())
        );
        assert_eq!(back.lease_ttl_ms, 150);
    }

    /// `--database-url-file` (and `--lease-url-file`): the URL `baton db init --out` wrote is
    /// read from its file and written into the config; a flag and its file exclude each other,
    /// and one of the two is required.
    #[test]
    fn init_reads_urls_from_the_files_db_init_writes() {
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            a: InitArgs,
        }
        let parse = |extra: &[&str]| {
            let argv = ["init", "--node-id", "n2", "--listen", "0.0.0.0:7001"];
            <P as clap::Parser>::try_parse_from(argv.iter().chain(extra)).map(|p| p.a)
        };
        let dir = tempfile::tempdir().unwrap();
        let node_url = dir.path().join("baton_node_n2.url");
        let lease_url = dir.path().join("baton_lease.url");
        std::fs::write(&node_url, "postgres://baton_node_n2:pw2@db:5432/baton\n").unwrap();
        std::fs::write(&lease_url, "postgres://baton_lease:pwl@db:5432/baton\n").unwrap();
        let file = node_url.to_str().unwrap();
        let peers = ["--peers", "n1=h1:7001/7101,n2=h2:7001/7101"];
        let args = parse(&[&["--database-url-file", file][..], &peers].concat()).unwrap();
        let text = init_toml(&init_config(&args).unwrap());
        let back: NodeConfig = toml::from_str(&text).unwrap();
        assert_eq!(
            back.resource.database_url,
            "postgres://baton_node_n2:pw2@db:5432/baton"
        );
        let args = parse(&[
            "--backend",
            "pg-lease",
            "--database-url-file",
            file,
            "--lease-url-file",
            lease_url.to_str().unwrap(),
        ])
        .unwrap();
        let c = init_config(&args).unwrap();
        assert_eq!(
            c.pg_lease.database_url,
            "postgres://baton_lease:pwl@db:5432/baton"
        );
        assert!(parse(&peers).is_err(), "no URL at all");
        assert!(parse(
            &[
                &[
                    "--database-url",
                    "postgres://x@db/b",
                    "--database-url-file",
                    file
                ][..],
                &peers
            ]
            .concat()
        )
        .is_err());
        let missing =
            parse(&[&["--database-url-file", "/nonexistent/x.url"][..], &peers].concat()).unwrap();
        let e = init_config(&missing).unwrap_err();
        assert!(matches!(e, InitError::Read(..)), "{e}");
    }

    /// `baton run` on raft: the timing is derived from the stop margin, and `baton run` with
    /// that margin validates (issue 30: README's advice alone did not).
    #[test]
    fn init_for_baton_run_derives_raft_timing_from_the_stop_margin() {
        let args = init_args(&[
            "--peers",
            "n1=h1:7001/7101,n2=h2:7001/7101",
            "--child-stop-margin",
            "5250ms",
        ]);
        let mut c = init_config(&args).unwrap();
        let (emin, emax) = c.election_timeout_range_ms().unwrap();
        // deploy/baton-run.service's margin: a 5.5 s lease, raft failover ~5.7 s (the maximum).
        assert_eq!((c.lease_ttl_ms, emin, emax), (5500, 5500, 5700), "{c:?}");
        assert_eq!(
            c.work_stop_margin_ms, 0,
            "baton run sets the margin from its flag"
        );
        c.work_stop_margin_ms = 5250;
        c.raft.cluster_secret_file = None;
        c.raft.cluster_secret = Some("s".to_owned().into());
        c.validate().unwrap();
    }

    #[test]
    fn init_refuses_what_cannot_run_and_writes_nothing() {
        let e = init_config(&init_args(&["--peers", "n1=h1:7001"])).unwrap_err();
        assert!(matches!(e, InitError::Peer(_)), "{e}");
        let e = init_config(&init_args(&["--peers", "n1=h1:7001/7101"])).unwrap_err();
        assert!(e.to_string().contains("listing this node"), "{e}");
        let e = init_config(&init_args(&["--backend", "etcd"])).unwrap_err();
        assert!(e.to_string().contains("--etcd-endpoints"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n2.toml");
        write_new_private(&path, "x").unwrap();
        assert!(matches!(
            write_new_private(&path, "y"),
            Err(InitError::Exists(_))
        ));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "x");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
}
