//! The owner's side: migrations, roles, and the operator's resets (`baton migrate`,
//! `baton db`, `baton fence reset`, `baton budget reset`).

use crate::pg::admin_session;
use crate::shard::ShardId;

use super::*;

/// Applies the roles and the schema as a superuser (`admin_url`), then optionally sets the
/// resource-side fencing switch. Idempotent and safe to run concurrently.
pub async fn migrate(admin_url: &str, fencing: Option<bool>) -> Result<(), FenceError> {
    let (client, conn_task) = admin_session(admin_url).await?;
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK_KEY])
        .await?;
    client.batch_execute(ROLES_SQL).await?;
    client.batch_execute(&role_timeouts_sql(APP_ROLE)).await?;
    let db: String = client
        .query_one("SELECT current_database()", &[])
        .await?
        .get(0);
    client
        .batch_execute(&format!(
            "GRANT CREATE ON DATABASE \"{}\" TO baton_owner",
            db.replace('"', "\"\"")
        ))
        .await?;
    // Existing objects created before ownership was settled belong to the owner too.
    client
        .batch_execute("DO $$ BEGIN IF EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'baton') THEN ALTER SCHEMA baton OWNER TO baton_owner; END IF; END $$;")
        .await?;
    apply_schema(&client).await?;
    if let Some(on) = fencing {
        client
            .execute("UPDATE baton.settings SET fencing = $1", &[&on])
            .await?;
    }
    client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK_KEY])
        .await?;
    drop(client);
    let _ = conn_task.await;
    Ok(())
}

/// Applies [`SCHEMA_FILES`] in order as `baton_owner`, in one transaction: all of them, or (on
/// an error, which names the file) none.
async fn apply_schema(client: &tokio_postgres::Client) -> Result<(), FenceError> {
    client
        .batch_execute("BEGIN; SET LOCAL ROLE baton_owner")
        .await?;
    for (file, sql) in SCHEMA_FILES {
        if let Err(e) = client.batch_execute(sql).await {
            // The session stays usable for the migration lock's release.
            client.batch_execute("ROLLBACK").await?;
            return Err(match FenceError::from(e) {
                FenceError::Unavailable(why) => FenceError::Unavailable(format!("{file}: {why}")),
                other => other,
            });
        }
    }
    Ok(client.batch_execute("COMMIT").await?)
}

/// `ALTER ROLE ... SET` statements applying [`ROLE_TIMEOUTS`] to `role`.
fn role_timeouts_sql(role: &str) -> String {
    ROLE_TIMEOUTS
        .iter()
        .map(|(k, v)| format!("ALTER ROLE {} SET {k} = '{v}';", quote_ident(role)))
        .collect()
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// The per-node role of `node_id`: a session of it may write only as holder `node_id`.
pub fn node_role(node_id: &str) -> String {
    format!("baton_node_{node_id}")
}

/// Creates (or updates) the per-node role of `node_id` with `password`, as a superuser
/// (`admin_url`): a member of the application role, with its session timeouts. A node that
/// connects as it writes only as holder `node_id`, whatever it claims. Run [`migrate`] first.
/// Node ids are 1 to 40 characters of `[A-Za-z0-9_-]`.
pub async fn provision_node_role(
    admin_url: &str,
    node_id: &str,
    password: &str,
) -> Result<String, FenceError> {
    let (role, sql) = node_role_sql(node_id, password)?;
    admin_batch(admin_url, &sql).await?;
    Ok(role)
}

/// The role of `node_id` and the statements that create or update it with `password` (plain, or
/// a SCRAM verifier, which the server stores as it is); refuses a node id that cannot name one.
pub(crate) fn node_role_sql(node_id: &str, password: &str) -> Result<(String, String), FenceError> {
    let valid = (1..=40).contains(&node_id.len())
        && node_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid {
        return Err(FenceError::Schema(format!(
            "node id {node_id:?} cannot name a role: 1 to 40 of [A-Za-z0-9_-]"
        )));
    }
    let role = node_role(node_id);
    let (ident, name) = (quote_ident(&role), quote_literal(&role));
    let sql = format!(
        "DO $$ BEGIN
           IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {name}) THEN CREATE ROLE {ident}; END IF;
         END $$;
         ALTER ROLE {ident} LOGIN PASSWORD {password};
         GRANT {APP_ROLE} TO {ident};
         {timeouts}",
        password = quote_literal(password),
        timeouts = role_timeouts_sql(&role),
    );
    Ok((role, sql))
}

/// `ALTER ROLE role LOGIN PASSWORD password`, quoted.
pub(crate) fn login_password_sql(role: &str, password: &str) -> String {
    format!(
        "ALTER ROLE {} LOGIN PASSWORD {};",
        quote_ident(role),
        quote_literal(password)
    )
}

/// Sets the fence's `max_token` to `max_token` (holder `operator`), as a superuser
/// (`admin_url`), in one transaction with its `fence_log` record (op `operator-reset`); returns
/// the `(max_token, holder)` it replaced. `baton fence reset` runs it.
///
/// Two uses. Recovery from a poisoned `max_token` (a holder of the application role's
/// credentials, or a bug, claimed a token far above any real term: the fence then refuses every
/// new term, safely and forever). And switching the election backend on the same database:
/// tokens of different backends are not comparable (pg-lease's epoch may be at 77 when raft's
/// terms start again at 1, and the fence would refuse raft's terms until one passed 77).
///
/// Stop every node's leader work first (the whole fleet, when switching backends), and pick
/// `max_token` at or above the highest token any still-running node could hold: a stale node
/// holding a token above it could write again. A negative `max_token` is refused, nothing changed.
pub async fn reset(admin_url: &str, max_token: i64) -> Result<(i64, String), FenceError> {
    if max_token < 0 {
        return Err(FenceError::Invalid(format!(
            "max_token must be >= 0, got {max_token}"
        )));
    }
    let (client, conn_task) = admin_session(admin_url).await?;
    let replaced = async {
        client.batch_execute("BEGIN").await?;
        let before = client
            .query_one(
                "SELECT max_token, holder FROM baton.fenced_resource WHERE name = baton.fence_domain() FOR UPDATE",
                &[],
            )
            .await?;
        client
            .execute(
                "UPDATE baton.fenced_resource SET max_token = $1, holder = 'operator', updated_at = clock_timestamp()
                  WHERE name = baton.fence_domain()",
                &[&max_token],
            )
            .await?;
        client
            .execute(
                "INSERT INTO baton.fence_log (resource, token, holder, op) VALUES (baton.fence_domain(), $1, 'operator', 'operator-reset')",
                &[&max_token],
            )
            .await?;
        client.batch_execute("COMMIT").await?;
        Ok::<_, tokio_postgres::Error>((before.get(0), before.get(1)))
    }
    .await;
    // On an error the session ends here, and the server rolls the transaction back.
    drop(client);
    let _ = conn_task.await;
    Ok(replaced?)
}

/// Resets `shard`'s fleet-wide failure budget, as a superuser (`admin_url`): the failed terms
/// recorded so far no longer count, and the nodes campaign again at their next look (within
/// `[failure_budget] recheck_ms`). Logged in `baton.failure_budget_resets` (when, by whom, how
/// many). Returns how many failed terms counted since the previous reset (whatever their age,
/// up to the 7 days the resource keeps). `baton budget reset` runs it. Fix what made the work
/// fail first: a budget reset over a work that still fails only buys another round of failures.
pub async fn reset_failure_budget(admin_url: &str, shard: ShardId) -> Result<u32, FenceError> {
    let (client, conn_task) = admin_session(admin_url).await?;
    let cleared = client
        .query_one(
            "SELECT cleared_terms FROM baton.failure_budget_reset($1)",
            &[&shard.resource(FAILURE_BUDGET_RESOURCE)],
        )
        .await;
    drop(client);
    let _ = conn_task.await;
    Ok(u32::try_from(cleared?.get::<_, i32>(0)).unwrap_or(0))
}

/// Sets whether the resource refuses sessions of the shared application role (only per-node
/// roles may write), as a superuser.
pub async fn set_require_node_roles(admin_url: &str, on: bool) -> Result<(), FenceError> {
    admin_batch(
        admin_url,
        &format!("UPDATE baton.settings SET require_node_roles = {on};"),
    )
    .await
}

async fn admin_batch(admin_url: &str, sql: &str) -> Result<(), FenceError> {
    let (client, conn_task) = admin_session(admin_url).await?;
    let done = client.batch_execute(sql).await;
    drop(client);
    let _ = conn_task.await;
    Ok(done?)
}
