//! `baton fence`: the operator's view of the fenced resource, and the way back from a poisoned
//! `max_token` (a holder of the application role's credentials, or a bug, claimed a token far
//! above any real term: the fence then refuses every new term, safely and forever).
//!
//! Both run as the database's superuser (`--admin-url`), never as the application role.

use anyhow::Context;
use tokio_postgres::{Client, NoTls};

/// `baton fence ...`
#[derive(clap::Subcommand)]
pub enum FenceCmd {
    /// The fence row, the switch, the sequences and cursors, and the latest refusals with reasons.
    Status {
        /// The database superuser's URL (postgres://postgres@HOST:5432/DB). Without a password
        /// in it, PGPASSWORD, ~/.pgpass (or PGPASSFILE) or a prompt on a terminal gives it.
        #[arg(long)]
        admin_url: String,
        /// How many of the latest rejections to show.
        #[arg(long, default_value_t = 10)]
        rejections: i64,
    },
    /// Set the fence's max_token to TOKEN (recovery from a poisoned max_token, or a switch of
    /// election backend on the same database: `--max-token 0` lets the new backend's first term
    /// in). Stop the fleet's leader work first, and pick TOKEN at or above the highest token a
    /// node still running could hold: a stale node holding a token above TOKEN could write again.
    /// Recorded in fence_log as op `operator-reset`. (The library's `baton::work::fence::reset`.)
    Reset {
        /// The database superuser's URL (postgres://postgres@HOST:5432/DB). Without a password
        /// in it, PGPASSWORD, ~/.pgpass (or PGPASSFILE) or a prompt on a terminal gives it.
        #[arg(long)]
        admin_url: String,
        /// The new max_token (0 lets a new backend's first term in).
        #[arg(long)]
        max_token: i64,
        /// Required: this lowers the fence on purpose.
        #[arg(long)]
        yes: bool,
    },
}

/// Runs one `baton fence` command, printing what it finds or did.
pub async fn run(cmd: FenceCmd) -> anyhow::Result<()> {
    match cmd {
        FenceCmd::Status {
            admin_url,
            rejections,
        } => {
            let admin_url = crate::admin_url::prepare(&admin_url, false).await?.url;
            print!("{}", status(&connect(&admin_url).await?, rejections).await?)
        }
        FenceCmd::Reset {
            admin_url,
            max_token,
            yes,
        } => {
            anyhow::ensure!(
                yes,
                "`baton fence reset` lowers the fence on purpose: pass --yes"
            );
            let admin_url = crate::admin_url::prepare(&admin_url, false).await?.url;
            let (before, _) = baton::work::fence::reset(&admin_url, max_token).await?;
            println!("fence max_token {before} -> {max_token} (holder 'operator'), recorded in fence_log");
        }
    }
    Ok(())
}

async fn connect(admin_url: &str) -> anyhow::Result<Client> {
    let (client, conn) = tokio_postgres::connect(admin_url, NoTls)
        .await
        .context("connecting as the resource's superuser (--admin-url)")?;
    tokio::spawn(conn);
    Ok(client)
}

/// A plain-text report of the fence's state.
pub async fn status(client: &Client, rejections: i64) -> anyhow::Result<String> {
    let mut out = String::new();
    let fence = client
        .query_one(
            "SELECT r.max_token, r.holder, r.updated_at::text, s.fencing, s.max_seq_advance
               FROM baton.fenced_resource r, baton.settings s WHERE r.name = baton.fence_domain()",
            &[],
        )
        .await
        .context("reading the fence row (run `baton migrate` first?)")?;
    out += &format!(
        "fence: max_token {} holder {:?} since {}; fencing {}; max_seq_advance {}\n",
        fence.get::<_, i64>(0),
        fence.get::<_, String>(1),
        fence.get::<_, String>(2),
        if fence.get::<_, bool>(3) { "on" } else { "OFF" },
        fence.get::<_, i64>(4),
    );
    for r in client
        .query(
            "SELECT name, last_seq, owner_token FROM baton.sequence ORDER BY name",
            &[],
        )
        .await?
    {
        out += &format!(
            "sequence {}: last_seq {} owner_token {}\n",
            r.get::<_, String>(0),
            r.get::<_, i64>(1),
            r.get::<_, i64>(2)
        );
    }
    let refused = client
        .query(
            "SELECT at::text, resource, op, reason, token, holder, max_token, max_holder
               FROM baton.fence_rejections ORDER BY id DESC LIMIT $1",
            &[&rejections],
        )
        .await?;
    out += &format!("latest {} rejection(s):\n", refused.len());
    for r in refused {
        out += &format!(
            "  {} {} on {} ({}): token {} holder {:?} vs max_token {} holder {:?}\n",
            r.get::<_, String>(0),
            r.get::<_, String>(2),
            r.get::<_, String>(1),
            r.get::<_, String>(3),
            r.get::<_, i64>(4),
            r.get::<_, String>(5),
            r.get::<_, i64>(6),
            r.get::<_, String>(7),
        );
    }
    Ok(out)
}
