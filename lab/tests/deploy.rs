//! deploy/README.md's walk, run: three hosts' configs from `baton config init`, the cluster
//! secret and the admin token where the README puts them (a 0600 file, the unit's environment
//! file), and `baton node` started exactly as deploy/baton-node.service starts it (its
//! ExecStart and EnvironmentFile, with /etc/baton and /usr/local/bin mapped into a temp dir:
//! there is no systemd here, so this is the equivalent). Then: one leader, IDs served, a
//! step-down that needs the token from the environment file, a SIGTERM stop (the unit's
//! KillSignal) that exits 0 within TimeoutStopSec, and the baton-run unit's command line
//! accepted by the CLI with the config `config init --child-stop-margin` wrote.

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
/// `etc/node.toml`; panics with its stderr if it refuses.
fn config_init(
    id: &str,
    http_port: u16,
    peers: &str,
    database_url: &str,
    etc: &Path,
    extra: &[&str],
) {
    let _ = std::fs::remove_file(etc.join("node.toml"));
    let out = Command::new(BATON)
        .args(["config", "init", "--node-id", id, "--backend", "raft"])
        .args(["--listen", &format!("127.0.0.1:{http_port}")])
        .args(["--peers", peers, "--database-url", database_url])
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
        config_init(&id, port, &peers.join(","), &pg.server.app_url(), &etc, &[]);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(etc.join("node.toml"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
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
    // No secret in any log.
    for h in &hosts {
        let log = std::fs::read_to_string(&h.log).unwrap();
        assert!(!log.contains(admin_token) && !log.contains("deploy-walk-cluster-secret"));
    }
}

/// deploy/baton-run.service's command line, with a config `config init --child-stop-margin`
/// derived for it, passes `baton run`'s own timing check (it stops at the next step: no
/// PostgreSQL here, so it is stopped once it got past the config).
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
            "postgres://baton_app@127.0.0.1:1/baton",
            &etc,
            extra,
        )
    };
    let run = || {
        let argv: Vec<String> = exec.iter().map(|a| on_host(a, dir.path())).collect();
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
    // Without the derived timing, baton run refuses, naming the flags.
    init(&[]);
    let refused = run().expect("baton run refuses raft.toml's 150 ms lease");
    assert!(
        refused.contains("--election-timeout") && refused.contains("--child-stop-margin"),
        "{refused}"
    );
    // With it, baton run gets past its config and runs.
    init(&["--child-stop-margin", margin]);
    assert_eq!(run(), None, "baton run exited with the derived config");
}
