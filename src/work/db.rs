//! Database setup in one step, for a service that embeds baton (`baton db init`, `baton db
//! grant` run these). Everything runs as the database's superuser (`admin_url`), once, before the
//! nodes start. The roles:
//!
//! * `baton_owner` (cannot log in) owns the `baton` schema and its `SECURITY DEFINER` functions.
//! * `baton_app` may call the fence's functions, and write the tables [`grant`]ed to it. It is
//!   the group the node roles belong to; it logs in (and [`init`] gives it a password) only when
//!   no node roles are asked for, or [`InitOptions::shared_app_role`] says one role is shared.
//! * `baton_node_<id>`, one per node: a member of `baton_app` (so it has the same grants) whose
//!   sessions write only as holder `<id>`, whatever they claim. Nodes connect as these: once
//!   [`init`] has made them, the resource requires them (`require_node_roles`), and a session of
//!   `baton_app` can no longer write as any holder.
//! * `baton_lease` (the pg-lease backend only) owns the lease schema and nothing else.
//!
//! [`init`] gives each login role it creates a random password, sent to the server as a SCRAM
//! verifier (the password itself never leaves this process), and returns each role's URL once.
//! It never replaces the password of a role that has one unless asked to ([`InitOptions::rotate`]):
//! running it again upgrades the schema and leaves the running fleet's credentials alone.

use std::str::FromStr;

use rand::Rng;
use tokio_postgres::config::Host;

use crate::config::Secret;
use crate::pg::admin_session;
use crate::work::fence::{self, FenceError, APP_ROLE};

/// What [`init`] sets up.
#[derive(Clone, Debug, Default)]
pub struct InitOptions {
    /// Node ids to create a role `baton_node_<id>` for (1 to 40 of `[A-Za-z0-9_-]` each).
    pub nodes: Vec<String>,
    /// Also set up the pg-lease backend's store and its role `baton_lease`.
    pub pg_lease: bool,
    /// Replace the passwords of roles that already have one (their old URLs stop working).
    pub rotate: bool,
    /// One role shared by every node (`baton_app`), the opt-out: the resource does not require
    /// per-node roles (`require_node_roles` off), so a `baton_app` session may write as any
    /// holder, and `baton_app` gets a password (and a URL) even with `nodes`. Without it,
    /// `nodes` turns `require_node_roles` on and `baton_app` gets no URL.
    pub shared_app_role: bool,
}

/// A login role whose password [`init`] set just now, and its connection URL.
#[derive(Clone, Debug)]
pub struct Login {
    /// The role, e.g. `baton_node_n1`.
    pub role: String,
    /// `postgres://role:password@host:port/db`, on the admin URL's server and database. Its
    /// `Debug` is redacted: only [`Secret::expose`] shows it.
    pub url: Secret,
}

/// What [`init`] did to the login roles.
#[derive(Clone, Debug, Default)]
pub struct InitReport {
    /// Roles given a new password, with their URLs: the only time these are shown.
    pub logins: Vec<Login>,
    /// Roles that already had a password, left as they were (see [`InitOptions::rotate`]).
    pub kept: Vec<String>,
    /// What [`init`] set the resource's `require_node_roles` to: `Some(true)` when it made node
    /// roles, `Some(false)` with [`InitOptions::shared_app_role`], `None` when it left it.
    pub require_node_roles: Option<bool>,
}

/// Creates or upgrades the schema ([`fence::migrate`]), the pg-lease store if asked, and every
/// login role with a generated password (see the module docs); with node roles, the resource
/// then requires them (unless [`InitOptions::shared_app_role`]). Bad input (a node id that
/// cannot name a role, an admin URL that does not parse, pg-lease in a build without it) is
/// refused before anything is changed. Idempotent; safe to run again (it keeps existing
/// passwords).
pub async fn init(admin_url: &str, opts: &InitOptions) -> Result<InitReport, FenceError> {
    let server = tokio_postgres::Config::from_str(admin_url)
        .map_err(|e| FenceError::Invalid(format!("admin URL: {e}")))?;
    let require_node_roles = if opts.shared_app_role {
        Some(false)
    } else if opts.nodes.is_empty() {
        None
    } else {
        Some(true)
    };
    // (role, the node id when it is a node's role). The shared role logs in only when the
    // nodes may use it.
    let mut roles: Vec<(String, Option<&str>)> = Vec::new();
    if require_node_roles != Some(true) {
        roles.push((APP_ROLE.to_owned(), None));
    }
    if opts.pg_lease {
        roles.push((lease_role()?.to_owned(), None));
    }
    for id in &opts.nodes {
        let (role, _) =
            fence::node_role_sql(id, "").map_err(|e| FenceError::Invalid(e.to_string()))?;
        roles.push((role, Some(id)));
    }

    fence::migrate(admin_url, None).await?;
    #[cfg(feature = "pg-lease")]
    if opts.pg_lease {
        crate::backends::pg_lease::provision(admin_url)
            .await
            .map_err(|e| FenceError::Unavailable(e.to_string()))?;
    }

    let (client, driver) = admin_session(admin_url).await?;
    let set_up = async {
        let mut report = InitReport::default();
        for (role, node_id) in roles {
            let has_password: Option<bool> = client
                .query_opt(
                    "SELECT rolpassword IS NOT NULL FROM pg_authid WHERE rolname = $1",
                    &[&role],
                )
                .await?
                .map(|r| r.get(0));
            if has_password == Some(true) && !opts.rotate {
                report.kept.push(role);
                continue;
            }
            let password = random_password();
            let verifier = postgres_protocol::password::scram_sha_256(password.as_bytes());
            let sql = match node_id {
                Some(id) => fence::node_role_sql(id, &verifier)?.1,
                None => fence::login_password_sql(&role, &verifier),
            };
            client.batch_execute(&sql).await?;
            let url = login_url(&server, &role, &password);
            report.logins.push(Login {
                role,
                url: Secret::new(url),
            });
        }
        // Last, once every node role can log in: from here on only they may write.
        if let Some(on) = require_node_roles {
            client
                .batch_execute(&format!(
                    "UPDATE baton.settings SET require_node_roles = {on};"
                ))
                .await?;
            report.require_node_roles = Some(on);
        }
        Ok::<_, FenceError>(report)
    }
    .await;
    drop(client);
    let _ = driver.await;
    set_up
}

/// Lets the application role (and so every node role, its members) read and write `table`
/// (`SELECT, INSERT, UPDATE, DELETE`) and use the sequences the table owns (a `serial` or
/// `identity` column's: an insert needs them). `table` is a table name as SQL reads it
/// (`ledger`, `app.ledger`, `"Ledger"`). Returns the sequences granted. A table that does not
/// exist is refused and nothing is granted.
pub async fn grant(admin_url: &str, table: &str) -> Result<Vec<String>, FenceError> {
    let (client, driver) = admin_session(admin_url).await?;
    let granted = async {
        client.batch_execute("BEGIN").await?;
        // regclass resolves the name (or fails), and its text is the name safely quoted.
        let table = match client
            .query_one("SELECT $1::text::regclass::text", &[&table])
            .await
        {
            Ok(row) => row.get::<_, String>(0),
            Err(e) => {
                let why = e.as_db_error().map(|d| d.message().to_owned());
                return Err(FenceError::Invalid(format!(
                    "no table {table:?}: {}",
                    why.unwrap_or_else(|| e.to_string())
                )));
            }
        };
        let sequences: Vec<String> = client
            .query(
                "SELECT s.oid::regclass::text FROM pg_depend d JOIN pg_class s ON s.oid = d.objid
                  WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass
                    AND d.refobjid = $1::text::regclass AND s.relkind = 'S'
                    AND d.deptype IN ('a', 'i')
                  ORDER BY 1",
                &[&table],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let mut sql =
            format!("GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE {table} TO {APP_ROLE};");
        for s in &sequences {
            sql += &format!("GRANT USAGE, SELECT ON SEQUENCE {s} TO {APP_ROLE};");
        }
        client.batch_execute(&sql).await?;
        client.batch_execute("COMMIT").await?;
        Ok::<_, FenceError>(sequences)
    }
    .await;
    // On an error the session ends here, and the server rolls the transaction back.
    drop(client);
    let _ = driver.await;
    granted
}

/// The pg-lease role, or why this build cannot set it up.
fn lease_role() -> Result<&'static str, FenceError> {
    #[cfg(feature = "pg-lease")]
    return Ok(crate::backends::pg_lease::LEASE_ROLE);
    #[cfg(not(feature = "pg-lease"))]
    Err(FenceError::Invalid(
        "pg-lease asked for, but this build of baton has no pg-lease (cargo feature `pg-lease`)"
            .into(),
    ))
}

/// 24 random bytes, hex: nothing in it needs quoting in SQL or escaping in a URL.
fn random_password() -> String {
    let bytes: [u8; 24] = rand::thread_rng().gen();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `role`'s URL on the server and database of `server` (the admin URL's).
fn login_url(server: &tokio_postgres::Config, role: &str, password: &str) -> String {
    let port = server.get_ports().first().copied().unwrap_or(5432);
    let db = server
        .get_dbname()
        .or(server.get_user())
        .unwrap_or("postgres");
    match server.get_hosts().first() {
        Some(Host::Unix(dir)) => format!(
            "postgres://{role}:{password}@/{db}?host={}&port={port}",
            dir.display()
        ),
        Some(Host::Tcp(host)) if host.contains(':') => {
            format!("postgres://{role}:{password}@[{host}]:{port}/{db}")
        }
        Some(Host::Tcp(host)) => format!("postgres://{role}:{password}@{host}:{port}/{db}"),
        None => format!("postgres://{role}:{password}@localhost:{port}/{db}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_keep_the_admin_urls_server_and_database() {
        let admin = |u: &str| tokio_postgres::Config::from_str(u).unwrap();
        assert_eq!(
            login_url(
                &admin("postgres://postgres:pw@127.0.0.1:5433/app"),
                "baton_app",
                "ab12"
            ),
            "postgres://baton_app:ab12@127.0.0.1:5433/app"
        );
        assert_eq!(
            login_url(
                &admin("host=/run/pg port=5432 user=postgres dbname=app"),
                "r",
                "p"
            ),
            "postgres://r:p@/app?host=/run/pg&port=5432"
        );
        let p = random_password();
        assert_eq!(p.len(), 48);
        assert!(p.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(p, random_password());
    }
}
