//! `baton db`: a database set up for a service that embeds baton, in one step
//! (`baton::work::db`). Both commands run as the database's superuser (`--admin-url`).

use std::path::{Path, PathBuf};

use anyhow::Context;
use baton::backends::BackendKind;
use baton::work::db::{InitOptions, InitReport};

/// `baton db ...`
#[derive(clap::Subcommand)]
pub enum DbCmd {
    /// Create or upgrade the schema, and every login role with a generated password: baton_app,
    /// one baton_node_<id> per --nodes, baton_lease with --backend pg-lease. Each new role's URL
    /// is written to DIR/<role>.url (0600) with --out, else printed once. A role that already has
    /// a password keeps it unless --rotate.
    Init {
        /// The database superuser's URL, password included (postgres://postgres:PW@HOST:5432/DB).
        #[arg(long)]
        admin_url: String,
        /// Node ids, comma-separated (n1,n2,n3).
        #[arg(long, value_delimiter = ',')]
        nodes: Vec<String>,
        /// The election backend the fleet will use (pg-lease also needs its store and role).
        #[arg(long, default_value = "raft")]
        backend: BackendKind,
        /// Write each URL to DIR/<role>.url (0600) instead of printing it.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Replace the passwords of roles that already have one (their old URLs stop working).
        #[arg(long)]
        rotate: bool,
    },
    /// Let the application role and every node role read and write TABLE, and use the
    /// sequences it owns (a serial or identity column's).
    Grant {
        /// The database superuser's URL, password included (postgres://postgres:PW@HOST:5432/DB).
        #[arg(long)]
        admin_url: String,
        /// The table, as SQL names it (ledger, app.ledger, "Ledger").
        table: String,
    },
}

/// Runs one `baton db` command, printing what it did.
pub async fn run(cmd: DbCmd) -> anyhow::Result<()> {
    match cmd {
        DbCmd::Init {
            admin_url,
            nodes,
            backend,
            out,
            rotate,
        } => {
            if let Some(dir) = &out {
                private_dir(dir)?;
            }
            let opts = InitOptions {
                nodes,
                pg_lease: backend == BackendKind::PgLease,
                rotate,
            };
            let report = baton::work::db::init(&admin_url, &opts).await?;
            print!("{}", write_report(&report, out.as_deref())?);
        }
        DbCmd::Grant { admin_url, table } => {
            let sequences = baton::work::db::grant(&admin_url, &table).await?;
            println!(
                "granted SELECT, INSERT, UPDATE, DELETE on {table} to {} (and its node roles); sequences: {}",
                baton::work::fence::APP_ROLE,
                if sequences.is_empty() { "none".into() } else { sequences.join(", ") }
            );
        }
    }
    Ok(())
}

/// `dir`, created 0700 if it is not there.
fn private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))
}

/// Writes each new URL to `out/<role>.url` (0600), or puts it in the text when there is no
/// `out`; the text to print.
pub fn write_report(report: &InitReport, out: Option<&Path>) -> anyhow::Result<String> {
    let mut text = String::from("schema migrated\n");
    for login in &report.logins {
        match out {
            Some(dir) => {
                let path = dir.join(format!("{}.url", login.role));
                crate::fleet::write_private(&path, format!("{}\n", login.url.expose()))
                    .with_context(|| format!("writing {}", path.display()))?;
                text += &format!("{}: new password, URL in {}\n", login.role, path.display());
            }
            None => text += &format!("{}: {}\n", login.role, login.url.expose()),
        }
    }
    for role in &report.kept {
        text += &format!("{role}: has a password, kept (--rotate replaces it)\n");
    }
    Ok(text)
}
