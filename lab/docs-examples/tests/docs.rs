//! Every example in README.md and docs/*.md runs as written (and the command lines of deploy/'s
//! pages parse), read from the Markdown itself, never from a copy:
//!
//! - ```` ```rust ```` blocks are compiled into the `docs-examples` binary by build.rs (a block
//!   that drifts from the API fails the build); those with a `main` not marked `no_run` are run
//!   here as a node against a private PostgreSQL, stopped with SIGINT, and must exit 0;
//! - the library walk of README.md and docs/library.md runs end to end: the page's own
//!   `baton db init` line, its SQL, its `baton db grant` line, its `# node.toml` and its job,
//!   until the job's rows are in the page's table;
//! - ```` ```sql ```` blocks run in order on a database made by `baton db init`, as the role
//!   their first line names (`-- as baton_node_n1`), else as the superuser;
//! - every shell line that starts with `baton` parses with the real command line
//!   (`Cli::try_parse_from`);
//! - ```` ```toml ```` blocks parse, and a block headed `# node.toml` loads and validates as a
//!   node config;
//! - the dependency line README gives is the form this crate depends on baton with.

#[path = "../src/markdown.rs"]
mod markdown;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use baton_lab::cli::{Cli, Cmd};
use baton_lab::fleet::servers::PgServer;
use clap::Parser;
use markdown::Block;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(file: &str) -> String {
    std::fs::read_to_string(root().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// README.md and docs/*.md: every kind of block is checked in these.
fn doc_files() -> Vec<String> {
    markdown::doc_files(&root())
}

/// Shell lines are also checked in the operator's pages.
fn shell_files() -> Vec<String> {
    let mut files = doc_files();
    files.extend([
        "deploy/README.md".to_string(),
        "deploy/security.md".to_string(),
    ]);
    files
}

fn blocks_of(file: &str, lang: &[&str]) -> Vec<Block> {
    markdown::blocks(&read(file))
        .into_iter()
        .filter(|b| lang.contains(&b.lang.as_str()))
        .collect()
}

// ---- shell lines -----------------------------------------------------------------------------

/// Shell words of one command line, as sh splits them (quotes, backslashes, `$(...)` kept whole),
/// up to the first `#` comment, pipe, `;`, `&&`, `||` or redirection; a `<placeholder>` inside
/// a word stays in it.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    word.push(q);
                }
            }
            '"' => {
                in_word = true;
                while let Some(q) = chars.next() {
                    match q {
                        '"' => break,
                        '\\' => word.extend(chars.next()),
                        _ => word.push(q),
                    }
                }
            }
            '\\' => {
                in_word = true;
                word.extend(chars.next());
            }
            '$' if chars.peek() == Some(&'(') => {
                in_word = true;
                let mut depth = 0;
                word.push('$');
                for q in chars.by_ref() {
                    word.push(q);
                    match q {
                        '(' => depth += 1,
                        ')' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                }
            }
            '#' if !in_word => break,
            // `<password>` inside a word is the docs' placeholder, not a redirection.
            '<' | '>' if in_word => word.push(c),
            '|' | ';' | '&' | '>' | '<' => break,
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// The `baton ...` command lines of a shell block: continuation lines joined, a `$ ` prompt and
/// leading `VAR=value` assignments dropped. Each with its line in the file.
fn baton_lines(block: &Block) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let mut logical = String::new();
    let mut start = 0;
    for (i, line) in block.text.lines().enumerate() {
        if logical.is_empty() {
            start = block.line + 1 + i;
        }
        if let Some(head) = line.strip_suffix('\\') {
            logical.push_str(head);
            logical.push(' ');
            continue;
        }
        logical.push_str(line);
        let text = std::mem::take(&mut logical);
        let text = text.trim_start().trim_start_matches("$ ");
        let words: Vec<String> = shell_words(text)
            .into_iter()
            .skip_while(|w| {
                w.contains('=')
                    && !w.starts_with('-')
                    && w.split('=').next().is_some_and(|k| {
                        !k.is_empty() && k.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                    })
            })
            .collect();
        if words.first().map(String::as_str) == Some("baton") {
            out.push((start, words));
        }
    }
    out
}

fn shell_blocks(file: &str) -> Vec<Block> {
    blocks_of(file, &["sh", "bash", "shell", "console"])
}

#[test]
fn every_baton_command_line_parses_with_the_real_cli() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for file in shell_files() {
        for block in shell_blocks(&file) {
            for (line, words) in baton_lines(&block) {
                checked += 1;
                if let Err(e) = Cli::try_parse_from(&words) {
                    let first = e.to_string().lines().next().unwrap_or_default().to_owned();
                    failures.push(format!("{file}:{line}: `{}`: {first}", words.join(" ")));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        checked >= 10,
        "only {checked} baton lines found in the docs"
    );
}

/// The checker itself refuses what the real CLI refuses, and reads the shapes the docs use.
#[test]
fn the_shell_reader_splits_lines_as_sh_does() {
    let block = Block {
        lang: "sh".into(),
        flags: vec![],
        line: 1,
        text: "$ RUST_LOG=info baton db init --admin-url 'postgres://p:w@db/app' \\\n  --nodes n1,n2 # roles\n\
               baton fleet status --json | jq .\nbaton exp churn --backend etcd\n"
            .into(),
    };
    let lines = baton_lines(&block);
    assert_eq!(
        lines[0].1,
        [
            "baton",
            "db",
            "init",
            "--admin-url",
            "postgres://p:w@db/app",
            "--nodes",
            "n1,n2"
        ]
    );
    assert_eq!(lines[0].0, 2);
    assert_eq!(lines[1].1, ["baton", "fleet", "status", "--json"]);
    assert!(Cli::try_parse_from(&lines[0].1).is_ok());
    // `baton exp` takes --backends: the line a README once offered is refused.
    assert!(Cli::try_parse_from(&lines[2].1).is_err());
}

// ---- TOML ------------------------------------------------------------------------------------

#[test]
fn every_toml_block_parses_and_node_configs_validate() {
    let mut failures = Vec::new();
    let mut node_configs = 0;
    for file in doc_files() {
        for block in blocks_of(&file, &["toml"]) {
            if let Err(e) = block.text.parse::<toml::Table>() {
                failures.push(format!("{file}:{}: not TOML: {e}", block.line));
                continue;
            }
            if block.text.lines().next() == Some("# node.toml") {
                node_configs += 1;
                match toml::from_str::<baton::config::NodeConfig>(&block.text) {
                    Ok(cfg) => {
                        if let Err(e) = cfg.validate() {
                            failures
                                .push(format!("{file}:{}: invalid node config: {e}", block.line));
                        }
                    }
                    Err(e) => {
                        failures.push(format!("{file}:{}: not a node config: {e}", block.line))
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        node_configs >= 2,
        "README and docs/library.md each show a `# node.toml`"
    );
}

/// README's dependency line is the form this crate uses: a path to the clone, no default
/// features, and features this crate (so the suite) compiles the examples with.
#[test]
fn the_readme_dependency_line_is_the_form_the_examples_build_with() {
    let ours: toml::Table = read("lab/docs-examples/Cargo.toml").parse().unwrap();
    let ours = &ours["dependencies"]["baton"];
    let our_features: Vec<&str> = ours["features"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    let mut found = 0;
    for file in ["README.md", "docs/library.md"] {
        for block in blocks_of(file, &["toml"]) {
            let table: toml::Table = block.text.parse().unwrap();
            let Some(dep) = table.get("dependencies").and_then(|d| d.get("baton")) else {
                continue;
            };
            found += 1;
            let at = format!("{file}:{}", block.line);
            // The suite builds the path form; the git form names the same crate until it is
            // published.
            assert!(
                dep.get("path").is_some() || dep.get("git").is_some(),
                "{at}: neither a path nor a git dependency: {dep}"
            );
            assert!(ours.get("path").is_some());
            assert_eq!(
                dep.get("default-features").and_then(|v| v.as_bool()),
                Some(false),
                "{at}"
            );
            for f in dep["features"].as_array().unwrap() {
                let f = f.as_str().unwrap();
                assert!(
                    our_features.contains(&f),
                    "{at}: feature {f} is not built by the suite"
                );
            }
        }
    }
    assert!(
        found >= 1,
        "README.md shows no `[dependencies] baton = ...` block"
    );
}

// ---- a private PostgreSQL --------------------------------------------------------------------

struct Pg {
    server: PgServer,
    _dir: tempfile::TempDir,
}

impl Drop for Pg {
    fn drop(&mut self) {
        self.server.stop();
    }
}

impl Pg {
    async fn start() -> Pg {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("pg");
        let server = tokio::task::spawn_blocking(move || PgServer::start_on_free_port(&root))
            .await
            .unwrap()
            .expect("a private PostgreSQL");
        Pg { server, _dir: dir }
    }

    /// The superuser's URL for database `db`, as it is (`db init --create-database` makes it).
    fn url_for(&self, db: &str) -> String {
        with_database(&self.server.admin_url(), db)
    }

    /// The superuser's URL for database `db`, which is created if it is not there.
    async fn admin_url(&self, db: &str) -> String {
        let admin = self.server.admin_url();
        let (client, conn) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        let exists = client
            .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&db])
            .await
            .unwrap()
            .is_some();
        if !exists {
            client
                .batch_execute(&format!("CREATE DATABASE \"{db}\""))
                .await
                .unwrap();
        }
        with_database(&admin, db)
    }
}

/// `url` with its database (the path) replaced.
fn with_database(url: &str, db: &str) -> String {
    let (head, _) = url.rsplit_once('/').unwrap();
    format!("{head}/{db}")
}

/// The database a URL names (`postgres://u:p@h:5432/app?x=y` → `app`).
fn database_of(url: &str) -> String {
    let path = url.rsplit_once('/').map(|(_, p)| p).unwrap_or("");
    path.split('?').next().unwrap_or("").to_string()
}

/// The server's own words for a failed statement.
fn db_error(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

async fn client(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    tokio::spawn(conn);
    client
}

/// Runs one parsed `baton db ...` line through the real command's code.
async fn run_db_line(words: &[String]) {
    match Cli::try_parse_from(words).unwrap().cmd {
        Cmd::Db { cmd } => baton_lab::db_admin::run(cmd).await.unwrap(),
        _ => panic!("not a `baton db` line: {words:?}"),
    }
}

/// `words` with `flag`'s value replaced.
fn with_flag(words: &[String], flag: &str, value: &str) -> Vec<String> {
    let mut out = words.to_vec();
    let at = out
        .iter()
        .position(|w| w == flag)
        .unwrap_or_else(|| panic!("{flag} not in {words:?}"));
    out[at + 1] = value.to_string();
    out
}

fn sql_blocks(file: &str) -> Vec<Block> {
    blocks_of(file, &["sql"])
}

/// The table the walk's SQL creates: `CREATE TABLE name (...)`.
fn created_table(blocks: &[Block]) -> Option<String> {
    blocks.iter().find_map(|b| {
        let at = b.text.find("CREATE TABLE ")?;
        let rest = &b.text[at + "CREATE TABLE ".len()..];
        Some(
            rest.split(|c: char| c.is_whitespace() || c == '(')
                .next()?
                .to_string(),
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sql_block_runs_on_a_database_made_by_db_init() {
    let pg = Pg::start().await;
    let admin = pg.admin_url("docs").await;
    let secrets = tempfile::tempdir().unwrap();
    let init: Vec<String> = [
        "baton",
        "db",
        "init",
        "--admin-url",
        &admin,
        "--nodes",
        "n1,n2,n3",
        "--backend",
        "pg-lease",
        "--out",
        secrets.path().to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    run_db_line(&init).await;
    let db = client(&admin).await;
    db.batch_execute(
        "CREATE TABLE ledger (id bigserial PRIMARY KEY, token bigint NOT NULL, holder text NOT NULL, n bigint NOT NULL)",
    )
    .await
    .unwrap();
    let grant: Vec<String> = ["baton", "db", "grant", "--admin-url", &admin, "ledger"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    run_db_line(&grant).await;
    let mut ran = 0;
    let mut failures = Vec::new();
    for file in doc_files() {
        for block in sql_blocks(&file) {
            if block.text.contains("CREATE TABLE ledger") {
                continue; // made above, as every page's walk makes it
            }
            ran += 1;
            let role = sql_role(&block);
            let url = match role.as_str() {
                "postgres" => admin.clone(),
                role => match std::fs::read_to_string(secrets.path().join(format!("{role}.url"))) {
                    Ok(url) => url.trim().to_string(),
                    Err(_) => {
                        failures.push(format!(
                            "{file}:{}: no role {role} from db init",
                            block.line
                        ));
                        continue;
                    }
                },
            };
            if let Err(e) = client(&url).await.batch_execute(&block.text).await {
                failures.push(format!(
                    "{file}:{} (as {role}): {}",
                    block.line,
                    db_error(&e)
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(ran >= 1, "no SQL block ran");
}

/// Who runs an SQL block: the role its first line names (`-- as baton_node_n1`), else the
/// superuser (`postgres`).
fn sql_role(block: &Block) -> String {
    block
        .text
        .lines()
        .next()
        .and_then(|l| l.trim().strip_prefix("-- as "))
        .map(|r| {
            r.split_whitespace()
                .next()
                .unwrap_or("postgres")
                .to_string()
        })
        .unwrap_or_else(|| "postgres".into())
}

// ---- the walk and the programs ---------------------------------------------------------------

/// A node program from the docs, running.
struct Program {
    child: Child,
    name: String,
}

impl Program {
    fn start(name: &str, config: &Path, log: &Path) -> Program {
        let log = std::fs::File::create(log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_docs-examples"))
            .env("BATON_DOC_BLOCK", name)
            .env("RUST_LOG", "baton=info")
            .arg(config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        Program {
            child,
            name: name.into(),
        }
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// SIGINT (Ctrl-C), then its exit status within `within`.
    fn interrupt(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let until = Instant::now() + within;
        while Instant::now() < until {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The compiled blocks, from the binary's own list: `(name, file, line, runs)`.
fn compiled_blocks() -> Vec<(String, String, usize, bool)> {
    let out = Command::new(env!("CARGO_BIN_EXE_docs-examples"))
        .output()
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let parts: Vec<&str> = l.split(' ').collect();
            let (file, line) = parts[1].rsplit_once(':').unwrap();
            (
                parts[0].to_string(),
                file.to_string(),
                line.parse().unwrap(),
                parts[2] == "run",
            )
        })
        .collect()
}

/// The page's `# node.toml`, with what only the reader's machine knows put in: each
/// `database_url` becomes the URL `baton db init` wrote for the role it names (secrets/ROLE.url;
/// a role the private server had made already keeps its password, so its URL is built from
/// that), and `state_dir` a fresh directory.
fn node_config_for(file: &str, pg: &Pg, db: &str, secrets: &Path, state: &Path) -> String {
    let block = blocks_of(file, &["toml"])
        .into_iter()
        .find(|b| b.text.lines().next() == Some("# node.toml"))
        .unwrap_or_else(|| panic!("{file} shows no `# node.toml`"));
    let mut table: toml::Table = block.text.parse().unwrap();
    fn fill(table: &mut toml::Table, pg: &Pg, db: &str, secrets: &Path, state: &Path) {
        for (key, value) in table.iter_mut() {
            match value {
                toml::Value::Table(t) => fill(t, pg, db, secrets, state),
                toml::Value::String(s) if key == "database_url" => {
                    let role = s
                        .trim_start_matches("postgres://")
                        .trim_start_matches("postgresql://")
                        .split([':', '@'])
                        .next()
                        .unwrap()
                        .to_string();
                    *s = match std::fs::read_to_string(secrets.join(format!("{role}.url"))) {
                        Ok(url) => url.trim().to_string(),
                        Err(_) => with_database(&pg.server.url_as(&role, "127.0.0.1"), db),
                    };
                }
                toml::Value::String(s) if key == "state_dir" => {
                    *s = state.display().to_string();
                }
                _ => {}
            }
        }
    }
    fill(&mut table, pg, db, secrets, state);
    toml::to_string(&table).unwrap()
}

/// Runs `file`'s library walk: its `baton db init` line, its SQL, its `baton db grant` line, its
/// node config and its job, until the job's rows are in the table the page created. Returns
/// the block that ran as the walk's job, and the walk's own server (each walk has one: the
/// roles `db init` makes are the server's, and a second walk must find none).
async fn walk(file: &str, work: &Path) -> (String, Pg) {
    let pg = Pg::start().await;
    let pg_ref = &pg;
    let lines: Vec<Vec<String>> = shell_blocks(file)
        .iter()
        .flat_map(baton_lines)
        .map(|(_, words)| words)
        .collect();
    let find = |sub: &str| {
        lines
            .iter()
            .find(|w| w.len() > 2 && w[1] == "db" && w[2] == sub)
            .unwrap_or_else(|| panic!("{file} shows no `baton db {sub}` line"))
            .clone()
    };
    let (init, grant) = (find("init"), find("grant"));
    let db = database_of(&init[init.iter().position(|w| w == "--admin-url").unwrap() + 1]);
    let admin = if init.iter().any(|w| w == "--create-database") {
        pg_ref.url_for(&db)
    } else {
        pg_ref.admin_url(&db).await
    };
    let secrets = work.join("secrets");
    let mut init = with_flag(&init, "--admin-url", &admin);
    if init.iter().any(|w| w == "--out") {
        init = with_flag(&init, "--out", secrets.to_str().unwrap());
    }
    run_db_line(&init).await;
    let sql = sql_blocks(file);
    let table = created_table(&sql).unwrap_or_else(|| panic!("{file}: no CREATE TABLE"));
    let db_client = client(&admin).await;
    for block in &sql {
        db_client
            .batch_execute(&block.text)
            .await
            .unwrap_or_else(|e| panic!("{file}:{}: {}", block.line, db_error(&e)));
    }
    run_db_line(&with_flag(&grant, "--admin-url", &admin)).await;

    let state = work.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let config = work.join("node.toml");
    std::fs::write(
        &config,
        node_config_for(file, pg_ref, &db, &secrets, &state),
    )
    .unwrap();
    let (name, ..) = compiled_blocks()
        .into_iter()
        .find(|(_, f, _, run)| f == file && *run)
        .unwrap_or_else(|| panic!("{file} has no runnable ```rust block"));
    let log = work.join("job.log");
    let mut job = Program::start(&name, &config, &log);
    let count = format!("SELECT count(*) FROM {table}");
    let until = Instant::now() + Duration::from_secs(60);
    let rows = loop {
        let rows: i64 = db_client.query_one(&count, &[]).await.unwrap().get(0);
        if rows >= 3 || Instant::now() > until {
            break rows;
        }
        if let Some(status) = job.exited() {
            panic!(
                "{file}: {name} exited {status} before writing\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        rows >= 3,
        "{file}: {name} wrote {rows} rows to {table} in 60 s\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let status = job.interrupt(Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| s.success()),
        "{file}: {name} after Ctrl-C: {status:?}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    // Every row was written by this node's term, through the fence.
    let written: Vec<(i64, String)> = db_client
        .query(&format!("SELECT token, holder FROM {table}"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let max_token: i64 = db_client
        .query_one("SELECT max(max_token) FROM baton.fenced_resource", &[])
        .await
        .unwrap()
        .get(0);
    for (token, holder) in &written {
        assert!(
            *token >= 1 && *token <= max_token,
            "{file}: row token {token}"
        );
        assert_eq!(holder, "n1", "{file}: a row from another holder");
    }
    (name, pg)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_walk_and_every_program_run_as_written() {
    let work = tempfile::tempdir().unwrap();
    let mut walked = Vec::new();
    let mut last_pg = None;
    for file in ["README.md", "docs/library.md"] {
        let dir = work.path().join(file.replace('/', "_"));
        std::fs::create_dir_all(&dir).unwrap();
        let (name, pg) = walk(file, &dir).await;
        walked.push(name);
        last_pg = Some(pg);
    }
    let _pg = last_pg;

    // Every other program block runs on the last walk's database and config: it starts, leads
    // for a while, stops on Ctrl-C, and exits 0.
    let base = work.path().join("docs_library.md");
    let config = base.join("node.toml");
    for (name, file, line, run) in compiled_blocks() {
        if !run || walked.contains(&name) {
            continue;
        }
        let state = base.join(&name);
        std::fs::create_dir_all(&state).unwrap();
        let mut cfg: toml::Table = std::fs::read_to_string(&config).unwrap().parse().unwrap();
        cfg.insert("state_dir".into(), state.display().to_string().into());
        let own = base.join(format!("{name}.toml"));
        std::fs::write(&own, toml::to_string(&cfg).unwrap()).unwrap();
        let log = base.join(format!("{name}.log"));
        let mut program = Program::start(&name, &own, &log);
        tokio::time::sleep(Duration::from_secs(4)).await;
        let early = program.exited();
        assert!(
            early.is_none(),
            "{file}:{line}: {} exited on its own: {early:?}\n{}",
            program.name,
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        let status = program.interrupt(Duration::from_secs(30));
        assert!(
            status.is_some_and(|s| s.success()),
            "{file}:{line}: {name} after Ctrl-C: {status:?}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
}

/// README stays a ten-minute read (≤ 250 lines, ≤ 2,500 words) and FINDINGS a findings note
/// (≤ 800 lines, its history in experiments/notebook/); user docs cite neither the notebook's
/// section numbers nor files users do not have.
#[test]
fn the_readme_and_findings_stay_short_and_cite_no_history() {
    let readme = read("README.md");
    let lines = readme.lines().count();
    let words = readme.split_whitespace().count();
    assert!(lines <= 250, "README.md has {lines} lines (≤ 250)");
    assert!(words <= 2500, "README.md has {words} words (≤ 2,500)");
    let findings = read("experiments/FINDINGS.md").lines().count();
    assert!(findings <= 800, "experiments/FINDINGS.md has {findings} lines (≤ 800): history goes to experiments/notebook/");
    for file in doc_files() {
        let text = read(&file);
        for (i, line) in text.lines().enumerate() {
            assert!(
                !line.contains('§'),
                "{file}:{}: a § reference: {line}",
                i + 1
            );
            assert!(
                !line.contains("../shared"),
                "{file}:{}: cites ../shared: {line}",
                i + 1
            );
            assert!(
                !line.contains("notebook/"),
                "{file}:{}: cites the notebook: {line}",
                i + 1
            );
        }
    }
}
