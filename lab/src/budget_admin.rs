//! `baton budget`: the operator's view of the fleet-wide failure budget (`[failure_budget]`),
//! and its reset. A shard's budget is spent once `failed_terms` of its terms failed within the
//! window; its nodes then stop campaigning until enough failures have left the window, or until
//! `baton budget reset`.
//!
//! Both run as the database's superuser (`--admin-url`), never as the application role.

use anyhow::Context;
use baton::config::{parse_duration_ms, FailureBudgetConfig};
use baton::shard::ShardId;
use tokio_postgres::{Client, NoTls};

/// `baton budget ...`
#[derive(clap::Subcommand)]
pub enum BudgetCmd {
    /// The shard's failed terms within the window, whether that spends the budget, and the
    /// latest failures and resets.
    Status {
        /// The database superuser's URL (postgres://postgres@HOST:5432/DB). Without a password
        /// in it, PGPASSWORD, ~/.pgpass (or PGPASSFILE) or a prompt on a terminal gives it.
        #[arg(long)]
        admin_url: String,
        /// The shard (0 on an unsharded fleet).
        #[arg(long, default_value_t = 0)]
        shard: u32,
        /// The window, as the nodes' `[failure_budget] window_ms` (e.g. 10m, 600000).
        #[arg(long, value_parser = parse_duration_ms, default_value_t = FailureBudgetConfig::default().window_ms)]
        window: u64,
        /// The limit, as the nodes' `[failure_budget] failed_terms`.
        #[arg(long, default_value_t = FailureBudgetConfig::default().failed_terms)]
        failed_terms: u32,
    },
    /// Reset the shard's budget: the failed terms recorded so far no longer count, and its nodes
    /// campaign again at their next look (`[failure_budget] recheck_ms`). Logged in
    /// `baton.failure_budget_resets`. Fix what made the work fail first. (The library's
    /// `baton::work::fence::reset_failure_budget`.)
    Reset {
        /// The database superuser's URL (postgres://postgres@HOST:5432/DB). Without a password
        /// in it, PGPASSWORD, ~/.pgpass (or PGPASSFILE) or a prompt on a terminal gives it.
        #[arg(long)]
        admin_url: String,
        /// The shard (0 on an unsharded fleet).
        #[arg(long, default_value_t = 0)]
        shard: u32,
    },
}

/// Runs one `baton budget` command, printing what it finds or did.
pub async fn run(cmd: BudgetCmd) -> anyhow::Result<()> {
    match cmd {
        BudgetCmd::Status {
            admin_url,
            shard,
            window,
            failed_terms,
        } => {
            let admin_url = crate::admin_url::prepare(&admin_url, false).await?.url;
            let (client, conn) = tokio_postgres::connect(&admin_url, NoTls)
                .await
                .context("connecting as the resource's superuser (--admin-url)")?;
            tokio::spawn(conn);
            let limits = FailureBudgetConfig {
                failed_terms,
                window_ms: window,
                ..FailureBudgetConfig::default()
            };
            print!("{}", status(&client, ShardId(shard), &limits).await?);
        }
        BudgetCmd::Reset { admin_url, shard } => {
            let admin_url = crate::admin_url::prepare(&admin_url, false).await?.url;
            let cleared = baton::work::fence::reset_failure_budget(&admin_url, ShardId(shard))
                .await
                .context("resetting the failure budget (run `baton migrate` first?)")?;
            println!(
                "shard {shard}: failure budget reset ({cleared} failed term(s) no longer count); its nodes campaign again at their next look"
            );
        }
    }
    Ok(())
}

/// A plain-text report of shard `shard`'s budget under `limits`.
pub async fn status(
    client: &Client,
    shard: ShardId,
    limits: &FailureBudgetConfig,
) -> anyhow::Result<String> {
    let resource = shard.resource(baton::work::fence::FAILURE_BUDGET_RESOURCE);
    let window_ms = i64::try_from(limits.window_ms)?;
    let limit = i32::try_from(limits.failed_terms)?;
    let b = client
        .query_one(
            "SELECT failed_terms, exhausted, reopens_in_ms FROM baton.failure_budget($1, $2, $3)",
            &[&resource, &window_ms, &limit],
        )
        .await
        .context("reading the failure budget (run `baton migrate` first?)")?;
    let mut out = format!(
        "shard {}: {} failed term(s) of {limit} within {window_ms} ms: {}\n",
        shard.0,
        b.get::<_, i32>(0),
        if b.get::<_, bool>(1) {
            format!(
                "SPENT, nodes do not campaign; reopens in {} ms",
                b.get::<_, Option<i64>>(2).unwrap_or(0)
            )
        } else {
            "open".to_owned()
        }
    );
    let failures = client
        .query(
            "SELECT failed_at::text, token, holder, detail FROM baton.failed_terms
              WHERE domain = baton.fence_domain($1) ORDER BY failed_at DESC LIMIT 10",
            &[&resource],
        )
        .await?;
    out += &format!("latest {} failed term(s):\n", failures.len());
    for r in failures {
        out += &format!(
            "  {} term {} on {}: {}\n",
            r.get::<_, String>(0),
            r.get::<_, i64>(1),
            r.get::<_, String>(2),
            r.get::<_, String>(3)
        );
    }
    let resets = client
        .query(
            "SELECT reset_at::text, by_role, cleared FROM baton.failure_budget_resets
              WHERE domain = baton.fence_domain($1) ORDER BY reset_at DESC LIMIT 3",
            &[&resource],
        )
        .await?;
    for r in resets {
        out += &format!(
            "reset {} by {} ({} failed term(s) cleared)\n",
            r.get::<_, String>(0),
            r.get::<_, String>(1),
            r.get::<_, i32>(2)
        );
    }
    Ok(out)
}
