//! Setting up and operating the fenced resource the way a library user does, against a private
//! PostgreSQL that each test starts: the migration and the pg-lease store say nothing at INFO;
//! a fence reset lets a new election backend's terms in.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use baton::backends::pg_lease::PgLeaseElector;
use baton::backends::{BackendKind, Elector};
use baton::config::NodeConfig;
use baton::elector::FenceToken;
use baton::work::FenceError;
use baton_lab::fleet::servers::ScratchPg;

/// Everything logged in this test binary, at DEBUG and above, as the `fmt` subscriber writes it
/// (the driver's `log` records included, as a service's subscriber would see them).
fn captured_logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = logs.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || Captured(sink.clone()))
            .init();
        logs
    })
}

struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The captured lines logged at `level` (`INFO`, `DEBUG`, ...) that mention `text`.
fn logged(level: &str, text: &str) -> Vec<String> {
    let logs = captured_logs().lock().unwrap();
    String::from_utf8_lossy(&logs)
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some(level) && l.contains(text))
        .map(str::to_owned)
        .collect()
}

/// PostgreSQL's notices about idempotent DDL ("function ... does not exist, skipping",
/// "relation ... already exists, skipping") are DEBUG: a migration, run twice, and two pg-lease
/// starts on one store log none of them at INFO or above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_and_pg_lease_starts_are_quiet_at_info() {
    captured_logs();
    let pg = ScratchPg::start()
        .await
        .expect("a private PostgreSQL, migrated");
    baton::work::fence::migrate(&pg.server.admin_url(), None)
        .await
        .unwrap();
    let mut cfg = NodeConfig {
        node_id: "quiet".into(),
        ..NodeConfig::for_backend(BackendKind::PgLease)
    };
    cfg.pg_lease.database_url = pg.server.lease_url();
    for _ in 0..2 {
        // Each new elector makes sure of its schema (`CREATE ... IF NOT EXISTS`) on first use.
        let elector = PgLeaseElector::connect(&cfg).await.unwrap();
        elector.leader().await.unwrap();
        elector.close().await.unwrap();
    }
    let noisy: Vec<String> = ["INFO", "WARN", "ERROR"]
        .iter()
        .flat_map(|level| logged(level, "skipping"))
        .collect();
    assert!(noisy.is_empty(), "notices above DEBUG: {noisy:#?}");
    // The notices were there (so this test can fail): the migration's, at DEBUG.
    assert!(
        !logged("DEBUG", "does not exist, skipping").is_empty(),
        "the migration sent no notice at all: nothing was tested"
    );
}

/// Moving a fleet from pg-lease to raft on the same database: the fence is at pg-lease's epoch
/// (77) and raft's first term is 1, so every raft term would be refused until one passed 77.
/// `fence::reset` to 0 (the fleet stopped) lets the new backend's first term in; a bad request
/// changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_reset_lets_a_new_backends_first_term_in() {
    let pg = ScratchPg::start()
        .await
        .expect("a private PostgreSQL, migrated");
    let resource = baton::config::ResourceConfig {
        database_url: pg.server.app_url(),
        ..Default::default()
    };
    let fence = baton::work::Fence::new(&resource, "n1").unwrap();
    fence
        .begin("ledger", FenceToken(77))
        .await
        .unwrap()
        .commit()
        .await
        .unwrap();
    let refused = fence.begin("ledger", FenceToken(1)).await;
    assert!(
        matches!(refused, Err(FenceError::Rejected { max_token: 77, .. })),
        "before the reset a term-1 write must be refused: {:?}",
        refused.err()
    );

    let admin = pg.server.admin_url();
    let bad = baton::work::fence::reset(&admin, -1).await;
    assert!(matches!(bad, Err(FenceError::Invalid(_))), "{bad:?}");
    let replaced = baton::work::fence::reset(&admin, 0).await.unwrap();
    assert_eq!(
        replaced,
        (77, "n1".to_owned()),
        "the bad request changed nothing"
    );

    fence
        .begin("ledger", FenceToken(1))
        .await
        .unwrap()
        .commit()
        .await
        .unwrap();
}

/// A loopback address nobody listens on right now.
fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

async fn sql(url: &str, text: &str) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    client.simple_query("SELECT 1").await?;
    client.query(text, &[]).await
}

/// README's library walk, start to first fenced row: `db::init` (roles with generated passwords,
/// a node role's URL), the service creates its table (a `bigserial` id), `db::grant` (the table and
/// its sequence), a node started from `NodeConfig::default()` (raft, one member) as the generated
/// node role, and its job's fenced insert lands. Bad input changes nothing; a second `init`
/// keeps every password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_walk_from_nothing_to_a_fenced_row() {
    use baton::work::db::{self, InitOptions};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("pg");
    let server = tokio::task::spawn_blocking(move || {
        baton_lab::fleet::servers::PgServer::start_on_free_port(&root)
    })
    .await
    .unwrap()
    .expect("a private PostgreSQL");
    let server = StopOnDrop(server);
    let admin = server.0.admin_url();
    let schema_exists = || async {
        sql(&admin, "SELECT to_regnamespace('baton') IS NOT NULL")
            .await
            .unwrap()[0]
            .get::<_, bool>(0)
    };

    let bad = InitOptions {
        nodes: vec!["n1".into(), "no spaces".into()],
        ..Default::default()
    };
    let refused = db::init(&admin, &bad).await;
    assert!(
        matches!(refused, Err(FenceError::Invalid(_))),
        "{refused:?}"
    );
    assert!(
        !schema_exists().await,
        "a refused init changed the database"
    );

    let opts = InitOptions {
        nodes: vec!["n1".into()],
        ..Default::default()
    };
    let report = db::init(&admin, &opts).await.unwrap();
    assert!(schema_exists().await);
    let roles: Vec<&str> = report.logins.iter().map(|l| l.role.as_str()).collect();
    assert_eq!(roles, ["baton_node_n1"], "new logins: {report:?}");
    // With node roles the resource requires them, and baton_app is not offered to nodes.
    assert!(report.kept.is_empty(), "{report:?}");
    assert_eq!(report.require_node_roles, Some(true));
    let node_url = report.logins[0].url.expose().to_owned();
    assert!(
        !format!("{report:?}").contains(&node_url),
        "a URL with its password in Debug"
    );
    let verifier: String = sql(
        &admin,
        "SELECT rolpassword FROM pg_authid WHERE rolname = 'baton_node_n1'",
    )
    .await
    .unwrap()[0]
        .get(0);
    assert!(
        verifier.starts_with("SCRAM-SHA-256$"),
        "stored as {verifier:.14}"
    );

    sql(&admin, "CREATE TABLE ledger (id bigserial PRIMARY KEY, token bigint NOT NULL, holder text NOT NULL)")
        .await
        .unwrap();
    let denied = sql(
        &node_url,
        "INSERT INTO ledger (token, holder) VALUES (1, 'n1')",
    )
    .await;
    assert!(denied.is_err(), "the node role wrote before the grant");
    let missing = db::grant(&admin, "no_such_table").await;
    assert!(
        matches!(missing, Err(FenceError::Invalid(_))),
        "{missing:?}"
    );
    let sequences = db::grant(&admin, "ledger").await.unwrap();
    assert_eq!(sequences, ["ledger_id_seq"]);

    let state = dir.path().join("n1");
    std::fs::create_dir_all(&state).unwrap();
    let mut cfg = NodeConfig {
        node_id: "n1".into(),
        state_dir: state,
        ..NodeConfig::default()
    };
    cfg.raft.peers = vec![baton::config::PeerSpec {
        id: "n1".into(),
        addr: free_addr(),
        peer_addr: free_addr(),
    }];
    cfg.resource.database_url = node_url.clone();
    cfg.sequencer.enabled = false;
    cfg.scheduler.enabled = false;
    let node = baton::node::NodeBuilder::new(cfg)
        .with_job("ledger", |mut term| async move {
            let tx = term.fence().begin("ledger", term.token()).await?;
            let insert = "INSERT INTO ledger (token, holder) VALUES ($1, $2)";
            tx.client()
                .execute(insert, &[&term.token().0, &term.holder()])
                .await?;
            tx.commit().await?;
            term.stopping().await;
            Ok(())
        })
        .start()
        .await
        .expect("start a node from the defaults");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let rows = loop {
        let rows = sql(&admin, "SELECT id, token, holder FROM ledger")
            .await
            .unwrap();
        if !rows.is_empty() || std::time::Instant::now() > until {
            break rows;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    node.shutdown().await.unwrap();
    assert_eq!(rows.len(), 1, "no fenced row within 20 s");
    assert_eq!(rows[0].get::<_, String>(2), "n1");
    assert!(rows[0].get::<_, i64>(1) >= 1);

    // Run again: nothing rotated, the node's URL still works.
    let again = db::init(&admin, &opts).await.unwrap();
    assert!(again.logins.is_empty(), "{again:?}");
    sql(&node_url, "SELECT 1")
        .await
        .expect("the node's URL after a second init");

    // The same from the command line: a new node's URL in a 0600 file, the grant reported, and
    // a bad node id refused.
    let out = dir.path().join("secrets");
    let baton = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_baton"))
            .args(args)
            .output()
            .expect("run baton")
    };
    let init = baton(
        &[
            "db",
            "init",
            "--admin-url",
            &admin,
            "--nodes",
            "n1,n2",
            "--out",
        ]
        .iter()
        .copied()
        .chain([out.to_str().unwrap()])
        .collect::<Vec<_>>(),
    );
    let said = String::from_utf8_lossy(&init.stdout).into_owned();
    assert!(
        init.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&init.stderr)
    );
    assert!(
        said.contains("baton_node_n1: has a password, kept"),
        "{said}"
    );
    // No role's URL on stdout with --out (the admin URL in the next command has no password).
    assert!(
        !said.contains("postgres://baton_")
            && !said.contains(&server.0.password("postgres").unwrap()),
        "a URL with a password on stdout with --out: {said}"
    );
    let file = out.join("baton_node_n2.url");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    let n2_url = std::fs::read_to_string(&file).unwrap();
    sql(n2_url.trim(), "SELECT 1")
        .await
        .expect("the URL baton db init wrote");
    let granted = baton(&["db", "grant", "--admin-url", &admin, "ledger"]);
    assert!(granted.status.success());
    assert!(String::from_utf8_lossy(&granted.stdout).contains("ledger_id_seq"));
    let bad = baton(&["db", "init", "--admin-url", &admin, "--nodes", "bad id"]);
    assert!(!bad.status.success(), "a bad node id was accepted");
}

/// Stops a bare private server however the test ends.
struct StopOnDrop(baton_lab::fleet::servers::PgServer);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// `baton` with `args` and `env`, run to completion: (success, stdout, stderr). stdin is not a
/// terminal, so nothing can prompt.
fn baton_cli(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_baton"));
    cmd.args(args)
        .env_remove("PGPASSWORD")
        .env_remove("PGPASSFILE")
        .stdin(std::process::Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run baton");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A fenced write as `holder` at `token`, through `url`'s role.
async fn fenced_write(url: &str, holder: &str, token: i64) -> Result<(), FenceError> {
    let resource = baton::config::ResourceConfig {
        database_url: url.to_owned(),
        ..Default::default()
    };
    let fence = baton::work::Fence::new(&resource, holder).unwrap();
    fence
        .begin("issue43", FenceToken(token))
        .await?
        .commit()
        .await
}

/// Issue 43: `baton db init --nodes` made one role per node but left `require_node_roles`
/// off, so the shared `baton_app` role could still write as any holder (only `baton fleet`
/// turned the switch on). Now the resource requires the node roles: a fenced write as holder n1
/// through baton_app is refused, the same write through n1's own role lands, and db init hands
/// out no baton_app URL. `--shared-app-role` is the explicit opt-out for one shared role.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn db_init_with_nodes_requires_them_so_the_app_role_cannot_write_as_a_node() {
    let pg = ScratchPg::start()
        .await
        .expect("a private PostgreSQL, migrated");
    let admin = pg.server.admin_url();
    // The shared role writes as n1 before db init (the switch is off on a fresh resource).
    fenced_write(&pg.server.app_url(), "n1", 1)
        .await
        .expect("baton_app writes as n1 before db init --nodes");

    let out = pg.dir.path().join("secrets");
    let out_arg = out.to_str().unwrap();
    let (ok, said, err) = baton_cli(
        &[
            "db",
            "init",
            "--admin-url",
            &admin,
            "--nodes",
            "n1,n2",
            "--out",
            out_arg,
        ],
        &[],
    );
    assert!(ok, "{said}{err}");
    eprintln!("baton db init --nodes n1,n2 --out DIR said:\n{said}");
    assert!(
        !said.contains("baton_app") || said.contains("baton_app: not for nodes"),
        "db init offered baton_app to the nodes: {said}"
    );
    assert!(!out.join("baton_app.url").exists(), "{said}");
    assert!(said.contains("require_node_roles on"), "{said}");
    let last = said.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("next") && last.contains("baton config init --node-id n1"),
        "the output does not end with the next command: {said}"
    );

    let refused = fenced_write(&pg.server.app_url(), "n1", 2).await;
    assert!(
        refused.is_err(),
        "baton_app still writes as holder n1 after db init --nodes"
    );
    let n1_url = std::fs::read_to_string(out.join("baton_node_n1.url")).unwrap();
    fenced_write(n1_url.trim(), "n1", 2)
        .await
        .expect("n1's own role writes as n1");
    let cross = fenced_write(n1_url.trim(), "n2", 3).await;
    assert!(cross.is_err(), "n1's role wrote as n2");

    // The opt-out: one shared role, said out loud.
    let (ok, said, err) = baton_cli(
        &["db", "init", "--admin-url", &admin, "--shared-app-role"],
        &[],
    );
    assert!(ok, "{said}{err}");
    assert!(said.contains("require_node_roles off"), "{said}");
    fenced_write(&pg.server.app_url(), "n2", 4)
        .await
        .expect("baton_app writes again with --shared-app-role");
}

/// `admin`'s URL without its password, and the password.
fn without_password(pg: &ScratchPg) -> (String, String) {
    let password = pg.server.password("postgres").unwrap();
    let admin = pg.server.admin_url();
    let bare = admin.replacen(&format!(":{password}@"), "@", 1);
    assert_ne!(bare, admin);
    (bare, password)
}

/// Issue 43: `baton migrate --admin-url postgres://postgres@db/baton` failed "password
/// missing": the admin commands now take the password the way PostgreSQL's own tools do, from
/// `PGPASSWORD` or a password file (`PGPASSFILE`, else `~/.pgpass`), when the URL has none;
/// without either (and no terminal to prompt on) the error says where to put it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_commands_take_pgpassword_and_pgpass_when_the_url_has_no_password() {
    let pg = ScratchPg::start()
        .await
        .expect("a private PostgreSQL, migrated");
    let (bare, password) = without_password(&pg);
    let home = tempfile::tempdir().unwrap();
    let home_arg = home.path().to_str().unwrap();

    let (ok, said, err) = baton_cli(&["migrate", "--admin-url", &bare], &[("HOME", home_arg)]);
    assert!(!ok, "migrated without a password: {said}");
    assert!(
        err.contains("PGPASSWORD") && err.contains(".pgpass"),
        "the error does not say where the password goes: {err}"
    );

    let (ok, said, err) = baton_cli(
        &["migrate", "--admin-url", &bare],
        &[("HOME", home_arg), ("PGPASSWORD", &password)],
    );
    assert!(ok, "PGPASSWORD not honoured: {said}{err}");

    // ~/.pgpass: a wildcard line for another user first, then ours; 0600, as libpq wants it.
    let port = pg.server.port;
    let pgpass = home.path().join(".pgpass");
    std::fs::write(
        &pgpass,
        format!("# comment\n*:*:*:someone_else:nope\n127.0.0.1:{port}:baton:postgres:{password}\n"),
    )
    .unwrap();
    std::fs::set_permissions(&pgpass, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let (ok, said, err) = baton_cli(&["migrate", "--admin-url", &bare], &[("HOME", home_arg)]);
    assert!(ok, "~/.pgpass not honoured: {said}{err}");
    sql(
        &pg.server.admin_url(),
        "CREATE TABLE ledger43 (id bigserial PRIMARY KEY)",
    )
    .await
    .unwrap();
    let (ok, said, err) = baton_cli(
        &["db", "grant", "--admin-url", &bare, "ledger43"],
        &[("HOME", home_arg)],
    );
    assert!(ok, "db grant did not read ~/.pgpass: {said}{err}");

    // PGPASSFILE names another file (and HOME's is not read then).
    let elsewhere = home.path().join("elsewhere");
    std::fs::rename(&pgpass, &elsewhere).unwrap();
    let (ok, said, err) = baton_cli(
        &["db", "init", "--admin-url", &bare, "--nodes", "n9"],
        &[
            ("HOME", home_arg),
            ("PGPASSFILE", elsewhere.to_str().unwrap()),
        ],
    );
    assert!(ok, "PGPASSFILE not honoured: {said}{err}");
    assert!(!said.contains(&password), "the admin password on stdout");
}

/// Issue 43: `database "baton" does not exist` came next, and neither the docs nor the tool
/// said how to make it. `db init` names the command when the database is missing, and creates
/// it with `--create-database`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn db_init_names_or_runs_the_create_database_it_needs() {
    let pg = ScratchPg::start()
        .await
        .expect("a private PostgreSQL, migrated");
    let (bare, password) = without_password(&pg);
    let missing = bare.replace("/baton", "/app_db");
    let env = [("PGPASSWORD", password.as_str())];
    let (ok, said, err) = baton_cli(
        &["db", "init", "--admin-url", &missing, "--nodes", "n1"],
        &env,
    );
    assert!(!ok, "{said}");
    assert!(
        err.contains("does not exist")
            && err.contains("--create-database")
            && err.contains("CREATE DATABASE app_db"),
        "the error does not say how to create the database: {err}"
    );
    let create = [
        "db",
        "init",
        "--admin-url",
        &missing,
        "--nodes",
        "n1",
        "--create-database",
    ];
    let (ok, said, err) = baton_cli(&create, &env);
    assert!(ok, "{said}{err}");
    assert!(said.contains("created database app_db"), "{said}");
    // Again: it exists now, and that is fine.
    let (ok, said, err) = baton_cli(&create, &env);
    assert!(ok, "{said}{err}");
}
