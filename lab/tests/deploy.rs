//! deploy/README.md's walk, run: `baton db init --nodes n1,n2,n3 --out DIR` makes one role per
//! node with its URL in a 0600 file and turns `require_node_roles` on, each host gets only its
//! own node's URL file and configs it with `baton config init --database-url-file`, the cluster secret and the admin token sit where the README puts
//! them (a 0600 file, the unit's environment file), and `baton node` is started exactly as
//! deploy/baton-node.service starts it (its ExecStart and EnvironmentFile, with /etc/baton and
//! /usr/local/bin mapped into a temp dir: there is no systemd here, so this is the equivalent).
//! Then: one leader, IDs served, a step-down that needs the token from the environment file, a
//! SIGTERM stop (the unit's KillSignal) that exits 0 within TimeoutStopSec, no secret in any
//! log; every node connected as its own role, every fenced write of a term under one holder, a
//! node's role refused when it names another holder and the shared role refused outright. And
//! the baton-run unit's command line accepted by the CLI with the config `config init
//! --child-stop-margin` wrote.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use baton_lab::fleet::client::NodeClient;
use baton_lab::fleet::servers::{free_ports, log_tail, ScratchPg};

const BATON: &str = env!("CARGO_BIN_EXE_baton");

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

/// `[Service]` settings of a unit file (the last value of each key).
fn unit(path: &str) -> HashMap<String, String> {
    let text = std::fs::read_to_string(repo(path)).expect(path);
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

/// A unit's path, as it is on this machine: /etc/baton/... and /usr/local/bin/baton map into
/// the test's host directory and the binary under test.
fn on_host(arg: &str, host: &Path) -> String {
    if arg == "/usr/local/bin/baton" {
        return BATON.to_owned();
    }
    match arg.strip_prefix("/etc/baton/") {
        Some(rest) => host.join("etc").join(rest).display().to_string(),
        None => arg.to_owned(),
    }
}

/// `KEY=VALUE` lines of an environment file.
fn env_file(path: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn private(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// `baton config init` for one raft host whose /etc/baton is `etc`, written to
/// `etc/node.toml`, with the database given by `database` (`["--database-url-file", PATH]` as
/// the README does, or `["--database-url", URL]`); panics with its stderr if it refuses.
fn config_init(
    id: &str,
    http_port: u16,
    peers: &str,
    database: [&str; 2],
    etc: &Path,
    extra: &[&str],
) {
    let _ = std::fs::remove_file(etc.join("node.toml"));
    let out = Command::new(BATON)
        .args(["config", "init", "--node-id", id, "--backend", "raft"])
        .args(["--listen", &format!("127.0.0.1:{http_port}")])
        .args(["--peers", peers])
        .args(database)
        .arg("--cluster-secret-file")
        .arg(etc.join("cluster-secret"))
        .arg("--state-dir")
        .arg(etc.with_file_name("var-lib-baton"))
        .args(extra)
        .arg("--out")
        .arg(etc.join("node.toml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The node started the way the unit starts it.
struct Host {
    id: String,
    http: String,
    log: PathBuf,
    proc: Option<Child>,
}

impl Host {
    fn start(id: &str, http: &str, dir: &Path, service: &HashMap<String, String>) -> Host {
        let exec = &service["ExecStart"];
        let argv: Vec<String> = exec.split_whitespace().map(|a| on_host(a, dir)).collect();
        let env = env_file(Path::new(&on_host(&service["EnvironmentFile"], dir)));
        let log = dir.join("node.log");
        let out = std::fs::File::create(&log).unwrap();
        let proc = Command::new(&argv[0])
            .args(&argv[1..])
            .envs(env)
            .env_remove("RUST_LOG")
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("start the unit's ExecStart");
        Host {
            id: id.to_owned(),
            http: http.to_owned(),
            log,
            proc: Some(proc),
        }
    }

    /// The unit's stop: KillSignal, then wait up to TimeoutStopSec; the exit status.
    fn stop(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let mut p = self.proc.take()?;
        // SAFETY: a signal to the process this test started.
        unsafe { libc::kill(p.id() as i32, libc::SIGTERM) };
        let until = Instant::now() + timeout;
        while Instant::now() < until {
            if let Ok(Some(status)) = p.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = p.kill();
        let _ = p.wait();
        None
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            let _ = p.kill();
            let _ = p.wait();
        }
    }
}

async fn leader(client: &NodeClient, hosts: &[Host]) -> Option<usize> {
    for (i, h) in hosts.iter().enumerate() {
        if h.proc.is_none() {
            continue;
        }
        if let Ok(r) = client.get(&h.http, "/status").await {
            if r.json()["role"] == "leader" {
                return Some(i);
            }
        }
    }
    None
}

async fn wait_leader(client: &NodeClient, hosts: &[Host], not: Option<usize>) -> usize {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(i) = leader(client, hosts).await.filter(|i| Some(*i) != not) {
            return i;
        }
        let tails: Vec<String> = hosts
            .iter()
            .map(|h| format!("== {}\n{}", h.id, log_tail(&h.log, 20)))
            .collect();
        assert!(
            Instant::now() < until,
            "no leader within 60 s\n{}",
            tails.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deploy_walk_runs_three_hosts_from_config_init_and_the_units() {
    let pg = ScratchPg::start()
        .await
        .expect("a private PostgreSQL, migrated");
    let dir = tempfile::tempdir().unwrap();
    let service = unit("deploy/baton-node.service");
    assert_eq!(service["KillSignal"], "SIGTERM");
    let stop_timeout = Duration::from_secs(service["TimeoutStopSec"].parse().unwrap());
    let http = free_ports(3).unwrap();
    let peer = free_ports(3).unwrap();
    let peers: Vec<String> = (0..3)
        .map(|i| format!("n{}=127.0.0.1:{}/{}", i + 1, http[i], peer[i]))
        .collect();
    let admin_token = "deploy-walk-admin-token-0123456789";

    // Step 2, on the "admin host": one role per node, each URL in a 0600 file.
    let admin_url = pg.server.admin_url();
    let secrets = dir.path().join("admin").join("baton-secrets");
    let out = Command::new(BATON)
        .args([
            "db",
            "init",
            "--admin-url",
            &admin_url,
            "--nodes",
            "n1,n2,n3",
        ])
        .arg("--out")
        .arg(&secrets)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(mode(&secrets), 0o700);
    let mut node_urls = Vec::new();
    for id in ["n1", "n2", "n3"] {
        let file = secrets.join(format!("baton_node_{id}.url"));
        assert!(
            said.contains(&format!("baton_node_{id}: new password")),
            "{said}"
        );
        assert_eq!(mode(&file), 0o600, "{}", file.display());
        let url = std::fs::read_to_string(&file).unwrap().trim().to_owned();
        assert!(
            url.starts_with(&format!("postgres://baton_node_{id}:")),
            "{id}'s URL"
        );
        node_urls.push(url);
    }
    // `db init --nodes` (the README's line) turned require_node_roles on by itself.
    let required: bool = connect_as(&admin_url)
        .await
        .query_one("SELECT require_node_roles FROM baton.settings", &[])
        .await
        .unwrap()
        .get(0);
    assert!(required, "db init --nodes left require_node_roles off");

    let mut hosts = Vec::new();
    for (i, port) in http.iter().copied().enumerate() {
        // Each "host": /etc/baton (0600 files) and /var/lib/baton.
        let host = dir.path().join(format!("host{}", i + 1));
        let etc = host.join("etc");
        std::fs::create_dir_all(&etc).unwrap();
        private(
            &etc.join("cluster-secret"),
            "deploy-walk-cluster-secret-0123456789\n",
        );
        private(
            &etc.join("baton.env"),
            &format!("BATON_ADMIN_TOKEN={admin_token}\n"),
        );
        let id = format!("n{}", i + 1);
        // Only this node's URL file comes to its host (`scp -p`: still 0600); config init reads
        // it, and the copy goes once the URL is in node.toml.
        let url_file = etc.join(format!("baton_node_{id}.url"));
        std::fs::copy(secrets.join(format!("baton_node_{id}.url")), &url_file).unwrap();
        assert_eq!(mode(&url_file), 0o600);
        let file_arg = url_file.to_str().unwrap();
        config_init(
            &id,
            port,
            &peers.join(","),
            ["--database-url-file", file_arg],
            &etc,
            &[],
        );
        std::fs::remove_file(&url_file).unwrap();
        assert_eq!(mode(&etc.join("node.toml")), 0o600);
        let toml = std::fs::read_to_string(etc.join("node.toml")).unwrap();
        assert!(
            toml.contains(&format!("database_url = \"{}\"", node_urls[i])),
            "{id}'s node.toml lacks its own role's URL"
        );
        hosts.push(Host::start(
            &id,
            &format!("127.0.0.1:{port}"),
            &host,
            &service,
        ));
    }

    let client = NodeClient::new(Duration::from_secs(5));
    let first = wait_leader(&client, &hosts, None).await;
    let mut served = None;
    let until = Instant::now() + Duration::from_secs(30);
    while served.is_none() {
        let r = client.post(&hosts[first].http, "/next").await;
        served = r.ok().filter(|r| r.status == 200);
        assert!(Instant::now() < until, "no ID from the leader within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let served_by = hosts[first].id.clone();
    // The admin token is the environment file's: without it a step-down is refused.
    let refused = client.post(&hosts[first].http, "/stepdown").await.unwrap();
    assert_eq!(refused.status, 401, "{:?}", refused.body);
    let admin = NodeClient::new(Duration::from_secs(30)).with_admin_token(Some(admin_token));
    // On a loaded machine raft may have moved the lease on its own since `first` served: then
    // the step-down goes to whoever leads now (a 409 names it; a 503 says none is known yet), at
    // most 5 times.
    let mut first = first;
    let mut r = admin.post(&hosts[first].http, "/stepdown").await.unwrap();
    for _ in 0..5 {
        if !matches!(r.status.as_u16(), 409 | 503) {
            break;
        }
        first = wait_leader(&client, &hosts, None).await;
        r = admin.post(&hosts[first].http, "/stepdown").await.unwrap();
    }
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    let second = wait_leader(&client, &hosts, Some(first)).await;
    // The unit's stop: SIGTERM, a graceful demotion, exit 0 within TimeoutStopSec.
    let status = hosts[second].stop(stop_timeout);
    assert!(
        status.is_some_and(|s| s.success()),
        "{} did not stop cleanly on SIGTERM: {status:?}\n{}",
        hosts[second].id,
        log_tail(&hosts[second].log, 30)
    );
    let third = wait_leader(&client, &hosts, Some(second)).await;
    eprintln!(
        "deploy walk: {} led, stepped down to {}, which stopped on SIGTERM; {} leads",
        hosts[first].id, hosts[second].id, hosts[third].id
    );
    // No secret in any log: the admin token, the cluster secret, the database passwords.
    let passwords: Vec<&str> = node_urls.iter().map(|u| password_of(u)).collect();
    for h in &hosts {
        let log = std::fs::read_to_string(&h.log).unwrap();
        assert!(!log.contains(admin_token) && !log.contains("deploy-walk-cluster-secret"));
        for p in &passwords {
            assert!(!log.contains(p), "{}'s log holds a database password", h.id);
        }
    }

    // Each node connected as its own role, none as the shared one.
    let db = connect_as(&admin_url).await;
    let logins: Vec<String> = db
        .query(
            "SELECT DISTINCT usename::text FROM pg_stat_activity WHERE usename::text LIKE 'baton%'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(!logins.is_empty(), "no node is connected");
    for login in &logins {
        assert!(
            ["baton_node_n1", "baton_node_n2", "baton_node_n3"].contains(&login.as_str()),
            "a connection as {login}"
        );
    }
    // Every fenced write of a term carries one holder, a node of this fleet; the first leader's
    // (it served IDs) among them. With require_node_roles on, only node roles wrote them, and a
    // node role writes only as its own holder (below).
    let terms = db
        .query(
            "SELECT token, array_agg(DISTINCT holder) FROM baton.fence_log GROUP BY token ORDER BY token",
            &[],
        )
        .await
        .unwrap();
    let mut holders = Vec::new();
    for t in &terms {
        let (token, h): (i64, Vec<String>) = (t.get(0), t.get(1));
        assert_eq!(h.len(), 1, "term {token} written by {h:?}");
        assert!(
            ["n1", "n2", "n3"].contains(&h[0].as_str()),
            "term {token}: {h:?}"
        );
        holders.push(h[0].clone());
    }
    assert!(
        holders.contains(&served_by),
        "{served_by} served IDs but wrote nothing under its name: {holders:?}"
    );
    // n1's role may not write as n2 (42501), while as n1 it gets as far as the fence's token
    // check (a stale token: BF409); the shared role is refused outright.
    assert_eq!(
        fence_assert_as(&node_urls[0], "n2").await.as_deref(),
        Some("42501")
    );
    assert_eq!(
        fence_assert_as(&node_urls[0], "n1").await.as_deref(),
        Some("BF409")
    );
    assert_eq!(
        fence_assert_as(&pg.server.app_url(), "n1").await.as_deref(),
        Some("42501")
    );
}

/// A file's permission bits.
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// The password in `postgres://role:PASSWORD@host...`.
fn password_of(url: &str) -> &str {
    let rest = url.strip_prefix("postgres://").expect("a postgres:// URL");
    let (userinfo, _) = rest.split_once('@').expect("user info");
    let (_, password) = userinfo.split_once(':').expect("a password");
    assert!(password.len() >= 32, "a generated password");
    password
}

async fn connect_as(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    client
}

/// `baton.fence_assert` with token 1 on a resource of its own, as the login of `url`, naming
/// `holder`: the SQLSTATE it is refused with (`None`: accepted).
async fn fence_assert_as(url: &str, holder: &str) -> Option<String> {
    let r = connect_as(url)
        .await
        .query_one(
            "SELECT baton.fence_assert('deploy-walk', 1, $1)",
            &[&holder],
        )
        .await;
    r.err()
        .map(|e| e.code().expect("a database error").code().to_owned())
}

/// deploy/baton-run.service's command line, with a config `config init --child-stop-margin`
/// derived for it, passes `baton run`'s own timing check (it stops at the next step: no
/// PostgreSQL here, so it is stopped once it got past the config). On raft.toml's own 150 ms
/// lease `baton run` derives a lease that fits the margin itself; told an election timeout that
/// cannot hold it, it refuses and names the flags.
#[test]
fn the_baton_run_unit_starts_with_a_config_derived_for_its_margin() {
    let service = unit("deploy/baton-run.service");
    assert_eq!(
        service["KillMode"], "mixed",
        "systemd must not signal the program itself"
    );
    let exec: Vec<&str> = service["ExecStart"].split_whitespace().collect();
    let margin = exec
        .iter()
        .position(|a| *a == "--child-stop-margin")
        .map(|p| exec[p + 1])
        .expect("the unit passes --child-stop-margin");
    let dir = tempfile::tempdir().unwrap();
    let etc = dir.path().join("etc");
    std::fs::create_dir_all(&etc).unwrap();
    private(
        &etc.join("cluster-secret"),
        "unit-test-cluster-secret-0123456789\n",
    );
    let http = free_ports(2).unwrap();
    let peers = format!("n1=127.0.0.1:{}/{}", http[0], http[1]);
    let init = |extra: &[&str]| {
        config_init(
            "n1",
            http[0],
            &peers,
            [
                "--database-url",
                "postgres://baton_node_n1@127.0.0.1:1/baton",
            ],
            &etc,
            extra,
        )
    };
    let run = |extra: &[&str]| {
        let mut argv: Vec<String> = exec.iter().map(|a| on_host(a, dir.path())).collect();
        let at = argv
            .iter()
            .position(|a| a == "run")
            .expect("the unit runs `baton run`")
            + 1;
        argv.splice(at..at, extra.iter().map(|a| a.to_string()));
        // The program: whatever it is, it never starts here (no database, no term).
        let mut p = Command::new(&argv[0])
            .args(&argv[1..])
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_secs(2));
        if let Ok(Some(_)) = p.try_wait() {
            let out = p.wait_with_output().unwrap();
            return Some(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        let _ = p.kill();
        let _ = p.wait();
        None
    };
    // Without the derived timing, baton run derives it and runs; told raft.toml's own election
    // timeout, which cannot hold the margin, it refuses and names the flags.
    init(&[]);
    assert_eq!(
        run(&[]),
        None,
        "baton run did not derive a lease for its margin"
    );
    let refused = run(&["--election-timeout", "150-250"])
        .expect("baton run refuses an election timeout that cannot hold its margin");
    assert!(
        refused.contains("--election-timeout") && refused.contains("--child-stop-margin"),
        "{refused}"
    );
    // With config init's derived timing, baton run gets past its config and runs.
    init(&["--child-stop-margin", margin]);
    assert_eq!(run(&[]), None, "baton run exited with the derived config");
}
