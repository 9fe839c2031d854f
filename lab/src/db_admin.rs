//! `baton db`: a database set up for a service that embeds baton, in one step
//! (`baton::work::db`). Both commands run as the database's superuser (`--admin-url`, whose
//! password may come from PGPASSWORD or ~/.pgpass: see `admin_url`).

use std::path::{Path, PathBuf};

use anyhow::Context;
use baton::backends::BackendKind;
use baton::work::db::{InitOptions, InitReport};

/// `baton db ...`
#[derive(clap::Subcommand)]
pub enum DbCmd {
    /// Create or upgrade the schema, and every login role with a generated password: one
    /// baton_node_<id> per --nodes (the resource then requires them: require_node_roles on),
    /// baton_lease with --backend pg-lease, and baton_app only without --nodes or with
    /// --shared-app-role. Each new role's URL is written to DIR/<role>.url (0600) with --out,
    /// else printed once. A role that already has a password keeps it unless --rotate. Ends
    /// with the next command to run.
    Init {
        /// The database superuser's URL (postgres://postgres@HOST:5432/DB). Without a password
        /// in it, PGPASSWORD, ~/.pgpass (or PGPASSFILE) or a prompt on a terminal gives it.
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
        /// Create the admin URL's database first when it does not exist.
        #[arg(long)]
        create_database: bool,
        /// Opt out of per-node roles: every node shares baton_app (it gets a URL), and the
        /// resource does not require node roles, so baton_app may write as any holder.
        #[arg(long)]
        shared_app_role: bool,
    },
    /// Let the application role and every node role read and write TABLE, and use the
    /// sequences it owns (a serial or identity column's).
    Grant {
        /// The database superuser's URL (postgres://postgres@HOST:5432/DB). Without a password
        /// in it, PGPASSWORD, ~/.pgpass (or PGPASSFILE) or a prompt on a terminal gives it.
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
            create_database,
            shared_app_role,
        } => {
            let admin = crate::admin_url::prepare(&admin_url, create_database).await?;
            if let Some(dir) = &out {
                private_dir(dir)?;
            }
            let opts = InitOptions {
                nodes,
                pg_lease: backend == BackendKind::PgLease,
                rotate,
                shared_app_role,
            };
            let report = baton::work::db::init(&admin.url, &opts).await?;
            if let Some(db) = &admin.created {
                println!("created database {db}");
            }
            print!("{}", write_report(&report, out.as_deref())?);
            print!("{}", next_steps(&opts, out.as_deref(), &admin.shown));
        }
        DbCmd::Grant { admin_url, table } => {
            let admin_url = crate::admin_url::prepare(&admin_url, false).await?.url;
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
    match report.require_node_roles {
        Some(true) => {
            text += "require_node_roles on: only the node roles write through the fence, each as its own node; baton_app: not for nodes (no URL; --shared-app-role opts out)\n"
        }
        Some(false) => {
            text += "require_node_roles off (--shared-app-role): a baton_app session may write as any holder\n"
        }
        None => {}
    }
    Ok(text)
}

/// What to run after `db init`: grant the program's tables, then (with node roles) each
/// host's config; the last line is a command.
pub fn next_steps(opts: &InitOptions, out: Option<&Path>, admin_shown: &str) -> String {
    let mut text = format!(
        "next, for each table your program writes: baton db grant --admin-url '{admin_shown}' TABLE\n"
    );
    let Some(first) = opts.nodes.first() else {
        return text;
    };
    let url_file = |role: &str| match out {
        Some(dir) => dir.join(format!("{role}.url")).display().to_string(),
        None => format!("{role}.url (the URL above, in a 0600 file)"),
    };
    let backend = if opts.pg_lease {
        format!(
            " --backend pg-lease --lease-url-file {}",
            url_file(baton::backends::pg_lease::LEASE_ROLE)
        )
    } else {
        let peers: Vec<String> = opts
            .nodes
            .iter()
            .map(|id| format!("{id}=HOST_{id}:7001/7101"))
            .collect();
        format!(" --peers {}", peers.join(","))
    };
    let others = if opts.nodes.len() > 1 {
        format!(" (then likewise on {}'s)", opts.nodes[1..].join("'s, "))
    } else {
        String::new()
    };
    text += &format!(
        "next, on {first}'s host{others}, with only its own URL file copied there: baton config init --node-id {first}{backend} --database-url-file {} --out /etc/baton/node.toml\n",
        url_file(&baton::work::fence::node_role(first))
    );
    text
}
