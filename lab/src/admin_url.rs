//! The `--admin-url` of every administrative command (`baton migrate`, `baton db`, `baton
//! fence`, `baton budget`), in one place: a URL without a password gets it the way PostgreSQL's
//! own tools (psql, createdb) do, from `PGPASSWORD`, then the password file (`PGPASSFILE`, else
//! `~/.pgpass`, lines `host:port:database:user:password` with `*` for any), then a prompt when
//! stdin is a terminal; the connection is tried once before the command runs, so a missing
//! password or database is said plainly, with what to do about it; `baton db init
//! --create-database` creates a missing database.

use std::io::{BufRead, IsTerminal, Write};
use std::str::FromStr;

use anyhow::{anyhow, Context};
use tokio_postgres::config::Host;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Config, NoTls};

/// An admin URL ready to use: `url` carries the password if one was found, `created` names the
/// database [`prepare`] created.
#[derive(Debug)]
pub struct AdminUrl {
    /// The URL to connect with (may carry a password: never print it; print [`AdminUrl::shown`]).
    pub url: String,
    /// The same URL without its password, for messages and the next command to run.
    pub shown: String,
    /// The database created because it did not exist and `--create-database` said to.
    pub created: Option<String>,
}

/// Fills in `url`'s password if it has none ([`with_password_from_env`]), then connects once:
/// a missing password or database fails here with what to do about it, and a missing database
/// is created (`CREATE DATABASE` from the server's `postgres` database) when `create_database`.
pub async fn prepare(url: &str, create_database: bool) -> anyhow::Result<AdminUrl> {
    let url = with_password_from_env(url)?;
    let cfg = Config::from_str(&url).map_err(|e| anyhow!("--admin-url: {e}"))?;
    let shown = shown(&cfg);
    let mut created = None;
    if let Err(e) = try_connect(&cfg).await {
        if e.code() == Some(&SqlState::INVALID_CATALOG_NAME) {
            let db = dbname(&cfg);
            if !create_database {
                return Err(anyhow!("{}", missing_database(&cfg, &db)));
            }
            create(&cfg, &db).await?;
            created = Some(db);
        } else {
            return Err(explain(&e, &cfg, &shown));
        }
    }
    Ok(AdminUrl {
        url,
        shown,
        created,
    })
}

async fn try_connect(cfg: &Config) -> Result<(), tokio_postgres::Error> {
    let (client, conn) = cfg.connect(NoTls).await?;
    let driver = tokio::spawn(conn);
    drop(client);
    let _ = driver.await;
    Ok(())
}

/// `CREATE DATABASE db` through the server's `postgres` database (where createdb connects).
async fn create(cfg: &Config, db: &str) -> anyhow::Result<()> {
    let mut maintenance = cfg.clone();
    maintenance.dbname("postgres");
    let (client, conn) = maintenance
        .connect(NoTls)
        .await
        .context("connecting to the server's postgres database to create the database")?;
    let driver = tokio::spawn(conn);
    let done = client
        .batch_execute(&format!("CREATE DATABASE {}", ident(db)))
        .await;
    drop(client);
    let _ = driver.await;
    done.with_context(|| format!("CREATE DATABASE {}", ident(db)))
}

/// What went wrong connecting, and what to do about it.
fn explain(e: &tokio_postgres::Error, cfg: &Config, shown: &str) -> anyhow::Error {
    let text = baton_error_text(e);
    if cfg.get_password().is_none() && text.contains("password missing") {
        return anyhow!(
            "{shown} has no password and the server asks for one: put it in PGPASSWORD, or in \
             ~/.pgpass (or the file PGPASSFILE names) as a line \
             `{}:{}:{}:{}:PASSWORD` (mode 0600), or in the URL; on a terminal baton asks for it",
            pgpass_host(cfg),
            port(cfg),
            dbname(cfg),
            user(cfg)
        );
    }
    anyhow!("connecting to {shown}: {text}")
}

/// An error with its sources (tokio-postgres puts the server's message below "db error").
fn baton_error_text(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let more = c.to_string();
        if !s.contains(&more) {
            s.push_str(": ");
            s.push_str(&more);
        }
        cur = c.source();
    }
    s
}

/// The error for a database that is not there: the commands that would make it.
fn missing_database(cfg: &Config, db: &str) -> String {
    let host = match cfg.get_hosts().first() {
        Some(Host::Tcp(h)) => format!(" -h {h}"),
        Some(Host::Unix(p)) => format!(" -h {}", p.display()),
        None => String::new(),
    };
    format!(
        "database {db:?} does not exist on {}. Create it: run `baton db init` again with \
         --create-database, or as the superuser: createdb{host} -p {} -U {} {db} (in SQL: \
         CREATE DATABASE {};)",
        shown(cfg),
        port(cfg),
        user(cfg),
        ident(db)
    )
}

/// `name` as an SQL identifier: bare when it is a plain lower-case name, else quoted.
fn ident(name: &str) -> String {
    let plain = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain {
        name.to_owned()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

fn user(cfg: &Config) -> String {
    cfg.get_user()
        .map(str::to_owned)
        .or_else(default_user)
        .unwrap_or_else(|| "postgres".into())
}

/// Who libpq connects as when the URL names nobody: `PGUSER`, else the OS user.
fn default_user() -> Option<String> {
    std::env::var("PGUSER")
        .ok()
        .or_else(|| std::env::var("USER").ok())
        .filter(|u| !u.is_empty())
}

fn port(cfg: &Config) -> u16 {
    cfg.get_ports().first().copied().unwrap_or(5432)
}

fn dbname(cfg: &Config) -> String {
    cfg.get_dbname()
        .map(str::to_owned)
        .unwrap_or_else(|| user(cfg))
}

/// The host as a password file line names it: a socket directory is `localhost`, as in libpq.
fn pgpass_host(cfg: &Config) -> String {
    match cfg.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        _ => "localhost".into(),
    }
}

/// `cfg` as a URL without its password.
pub fn shown(cfg: &Config) -> String {
    let (user, port, db) = (user(cfg), port(cfg), dbname(cfg));
    match cfg.get_hosts().first() {
        Some(Host::Tcp(h)) if h.contains(':') => format!("postgres://{user}@[{h}]:{port}/{db}"),
        Some(Host::Tcp(h)) => format!("postgres://{user}@{h}:{port}/{db}"),
        Some(Host::Unix(p)) => {
            format!("postgres://{user}@/{db}?host={}&port={port}", p.display())
        }
        None => format!("postgres://{user}@localhost:{port}/{db}"),
    }
}

/// `url` with a password from the environment when it has none: `PGPASSWORD`, else the
/// password file's first matching line, else (stdin a terminal) what the user types at a
/// prompt; `url` itself when none of them gives one.
pub fn with_password_from_env(url: &str) -> anyhow::Result<String> {
    let cfg = Config::from_str(url).map_err(|e| anyhow!("--admin-url: {e}"))?;
    if cfg.get_password().is_some() {
        return Ok(url.to_owned());
    }
    let user = user(&cfg);
    let password = std::env::var("PGPASSWORD")
        .ok()
        .filter(|p| !p.is_empty())
        .or_else(|| {
            let file = password_file()?;
            let text = read_password_file(&file)?;
            pgpass_lookup(&text, &pgpass_host(&cfg), port(&cfg), &dbname(&cfg), &user)
        })
        .or_else(|| prompt(&user));
    Ok(match password {
        Some(p) => with_password(url, &user, &p),
        None => url.to_owned(),
    })
}

/// `PGPASSFILE`, else `~/.pgpass`.
fn password_file() -> Option<std::path::PathBuf> {
    match std::env::var_os("PGPASSFILE") {
        Some(f) if !f.is_empty() => Some(f.into()),
        _ => std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".pgpass")),
    }
}

/// The password file's text, unless it is missing, not a plain file, or readable by group or
/// others (libpq ignores such a file too, and says so).
fn read_password_file(path: &std::path::Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() {
        return None;
    }
    if meta.permissions().mode() & 0o077 != 0 {
        eprintln!(
            "WARNING: password file \"{}\" has group or world access; permissions should be u=rw (0600) or less",
            path.display()
        );
        return None;
    }
    std::fs::read_to_string(path).ok()
}

/// The password of the first line of a password file that matches (`*` matches anything;
/// `\:` and `\\` are a literal colon and backslash), as libpq reads it.
pub fn pgpass_lookup(text: &str, host: &str, port: u16, db: &str, user: &str) -> Option<String> {
    let port = port.to_string();
    for line in text.lines() {
        let line = line.trim_end_matches('\r');
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields = split_pgpass(line);
        if fields.len() < 5 {
            continue;
        }
        let want = [host, port.as_str(), db, user];
        if fields[..4]
            .iter()
            .zip(want)
            .all(|(f, w)| f == "*" || f == w)
        {
            return Some(fields[4].clone());
        }
    }
    None
}

/// A password file line's five fields (the last takes the rest of the line).
fn split_pgpass(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    fields.last_mut().unwrap().push(n);
                }
            }
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => fields.last_mut().unwrap().push(c),
        }
    }
    fields
}

/// Asks for `user`'s password on the terminal, without echo; `None` when stdin is not a
/// terminal (a script, a unit, a test) or nothing was typed.
fn prompt(user: &str) -> Option<String> {
    use std::os::fd::AsRawFd;
    if !std::io::stdin().is_terminal() {
        return None;
    }
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .ok()?;
    let fd = tty.as_raw_fd();
    // SAFETY: termios is plain data; tcgetattr fills it for a terminal fd we hold open.
    let mut term: libc::termios = unsafe { std::mem::zeroed() };
    if unsafe { libc::tcgetattr(fd, &mut term) } != 0 {
        return None;
    }
    let saved = term;
    term.c_lflag &= !libc::ECHO;
    term.c_lflag |= libc::ECHONL;
    // SAFETY: as above; the saved settings are put back below whatever the read did.
    unsafe { libc::tcsetattr(fd, libc::TCSANOW, &term) };
    let _ = write!(&tty, "Password for user {user}: ");
    let _ = (&tty).flush();
    let mut line = String::new();
    let read = std::io::BufReader::new(&tty).read_line(&mut line);
    unsafe { libc::tcsetattr(fd, libc::TCSANOW, &saved) };
    read.ok()?;
    let password = line.trim_end_matches(['\n', '\r']).to_owned();
    (!password.is_empty()).then_some(password)
}

/// `url` (which has no password) with `password` for `user` in it: in the userinfo of a
/// `postgres://` URL (percent-encoded; the user added when the URL names none), else as a
/// `password='...'` pair of a key-value string.
pub fn with_password(url: &str, user: &str, password: &str) -> String {
    for scheme in ["postgresql://", "postgres://"] {
        let Some(rest) = url.strip_prefix(scheme) else {
            continue;
        };
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let pw = percent_encode(password);
        return match authority.rfind('@') {
            Some(at) => {
                let (userinfo, hosts) = authority.split_at(at);
                let name = userinfo.split(':').next().unwrap_or_default();
                let name = if name.is_empty() {
                    percent_encode(user)
                } else {
                    name.to_owned()
                };
                format!("{scheme}{name}:{pw}{hosts}{tail}")
            }
            None => format!("{scheme}{}:{pw}@{authority}{tail}", percent_encode(user)),
        };
    }
    format!(
        "{url} password='{}'",
        password.replace('\\', "\\\\").replace('\'', "\\'")
    )
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_file_matches_as_libpq_reads_it() {
        let text = "# admin host\n\
                    db:5432:baton:someone:nope\n\
                    *:*:other:postgres:wrong-db\n\
                    db:5432:*:postgres:pa\\:ss\\\\word:with:colons\n\
                    *:*:*:*:fallback\n";
        assert_eq!(
            pgpass_lookup(text, "db", 5432, "baton", "postgres").as_deref(),
            Some("pa:ss\\word:with:colons")
        );
        assert_eq!(
            pgpass_lookup(text, "db", 5432, "baton", "someone").as_deref(),
            Some("nope")
        );
        assert_eq!(
            pgpass_lookup(text, "db", 6432, "baton", "postgres").as_deref(),
            Some("fallback")
        );
        assert_eq!(
            pgpass_lookup("db:5432:baton:postgres\n", "db", 5432, "baton", "postgres"),
            None
        );
    }

    #[test]
    fn the_password_goes_into_either_form_of_url() {
        let check = |url: &str, want_user: &str| {
            let with = with_password(url, "postgres", "p@ss:w/rd 'x'");
            let cfg = Config::from_str(&with).unwrap_or_else(|e| panic!("{with}: {e}"));
            assert_eq!(cfg.get_password(), Some(&b"p@ss:w/rd 'x'"[..]), "{with}");
            assert_eq!(cfg.get_user(), Some(want_user), "{with}");
        };
        check("postgres://admin@db:5432/baton", "admin");
        check("postgresql://admin@db/baton?sslmode=disable", "admin");
        check("postgres://db:5432/baton", "postgres");
        check("postgres://admin@/baton?host=/run/postgresql", "admin");
        check("host=db port=5432 user=admin dbname=baton", "admin");
        // A URL that has a password is left alone.
        std::env::set_var("PGPASSWORD", "from-env");
        assert_eq!(
            with_password_from_env("postgres://a:given@db/x").unwrap(),
            "postgres://a:given@db/x"
        );
        let filled = with_password_from_env("postgres://a@db/x").unwrap();
        assert_eq!(
            Config::from_str(&filled).unwrap().get_password(),
            Some(&b"from-env"[..])
        );
        std::env::remove_var("PGPASSWORD");
    }

    #[test]
    fn messages_show_the_url_without_its_password() {
        let cfg = Config::from_str("postgres://postgres:secret@db:5433/app").unwrap();
        assert_eq!(shown(&cfg), "postgres://postgres@db:5433/app");
        let m = missing_database(&cfg, "app");
        assert!(m.contains("createdb -h db -p 5433 -U postgres app"), "{m}");
        assert!(
            m.contains("CREATE DATABASE app;") && !m.contains("secret"),
            "{m}"
        );
        assert_eq!(ident("App"), "\"App\"");
    }
}
