//! Durable raft storage in `<state_dir>/raft/`: the vote, the log and the (trivial) state
//! machine's snapshot, each write fsync'ed before openraft is told it is done, so a restarted node
//! never forgets a term it voted in and never reuses or lowers one.
//!
//! * `vote.json` — the last saved vote, replaced atomically (write temp, fsync, rename, fsync dir).
//! * `log.jsonl` — an operation log (`append` / `truncate_after` / `purge`), one JSON line each,
//!   fsync'ed per call and replayed on open. A torn last line (a crash mid-write) is cut off.
//!   Rewritten compactly (atomically) when dead operations dominate, so it stays small.
//! * `snapshot.json` — the state machine: the last applied log id and membership at the last
//!   snapshot, and (K > 1) the shard lease table as it was then. The log is purged only up to a
//!   snapshot, so log + snapshot always cover everything. A `snapshot.json` written before
//!   shards existed (the meta alone) still opens, with an empty table.
//!
//! At K = 1 the state machine stores nothing else: leadership is the product, not data. At
//! K > 1 it also holds the shard lease table ([`super::lease_table`]): who holds each shard, at
//! which epoch (the shard's fencing token).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Seek, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::{Stream, StreamExt};
use openraft::storage::{EntryResponder, IOFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{LogState, OptionalSend, RaftLogReader, RaftSnapshotBuilder};
use serde::{Deserialize, Serialize};

use super::lease_table::{LeaseTable, Leases, ShardOutcome};
use super::types::{
    Entry, LogId, Snapshot, SnapshotData, SnapshotMeta, StoredMembership, TypeConfig, Vote,
};

/// Rewrite `log.jsonl` when it holds this many more operations than live entries.
const COMPACT_SLACK: usize = 256;

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum LogOp {
    Append(Entry),
    TruncateAfter(Option<LogId>),
    Purge(LogId),
}

struct LogInner {
    dir: PathBuf,
    vote: Option<Vote>,
    entries: BTreeMap<u64, Entry>,
    last_purged: Option<LogId>,
    file: File,
    ops_in_file: usize,
}

/// The raft log and vote. Cheap to clone; all clones share one file handle and one lock, so a
/// restarted `Raft` on the same elector reuses the same store (never two writers on one file).
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<LogInner>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// How long a vote write waits for a descriptor before the storage error stands.
const VOTE_WRITE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// EMFILE or ENFILE: this process, or the system, has no descriptor free right now.
fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

/// Replaces `dir/name` with `bytes` atomically and durably.
fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let staged = stage(dir, name, bytes)?;
    drop(staged);
    put_in_place(dir, name)
}

/// The first half of [`write_atomic`]: `bytes` written and synced to `dir/name.tmp`, whose
/// handle is returned positioned at its end. Nothing `name` names has changed yet.
fn stage(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<File> {
    let mut f = File::create(dir.join(format!("{name}.tmp")))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(f)
}

/// The second half of [`write_atomic`]: the staged file renamed over `name`, durably.
fn put_in_place(dir: &Path, name: &str) -> io::Result<()> {
    fs::rename(dir.join(format!("{name}.tmp")), dir.join(name))?;
    fsync_dir(dir)
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> io::Result<Option<T>> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn to_line(op: &LogOp) -> io::Result<Vec<u8>> {
    let mut line = serde_json::to_vec(op).map_err(io::Error::other)?;
    line.push(b'\n');
    Ok(line)
}

impl LogInner {
    fn apply(&mut self, op: LogOp) {
        match op {
            LogOp::Append(e) => {
                self.entries.insert(e.log_id.index, e);
            }
            LogOp::TruncateAfter(after) => {
                let keep_to = after.map(|l| l.index);
                let from = keep_to.map_or(0, |i| i + 1);
                self.entries.split_off(&from);
            }
            LogOp::Purge(upto) => {
                let rest = self.entries.split_off(&(upto.index + 1));
                self.entries = rest;
                if self.last_purged.is_none() || self.last_purged < Some(upto) {
                    self.last_purged = Some(upto);
                }
            }
        }
    }

    fn write_ops(&mut self, ops: &[LogOp]) -> io::Result<()> {
        let mut buf = Vec::new();
        for op in ops {
            buf.extend(to_line(op)?);
        }
        self.file.write_all(&buf)?;
        self.file.sync_data()?;
        self.ops_in_file += ops.len();
        Ok(())
    }

    /// Rewrites the op log as `purge(last_purged)` + one `append` per live entry. Compaction
    /// only saves space: out of descriptors before anything changed (the staged copy could not
    /// be opened), it is left for the next write rather than failing the storage, which would
    /// stop the raft member for good (as a vote write would, see `save_vote`). Later appends go
    /// through the staged copy's own handle, so no reopen can fail after the rename and leave
    /// them writing to the replaced file.
    fn compact(&mut self) -> io::Result<()> {
        let mut buf = Vec::new();
        if let Some(p) = &self.last_purged {
            buf.extend(to_line(&LogOp::Purge(*p))?);
        }
        for e in self.entries.values() {
            buf.extend(to_line(&LogOp::Append(e.clone()))?);
        }
        let staged = match stage(&self.dir, "log.jsonl", &buf) {
            Ok(f) => f,
            Err(e) if out_of_descriptors(&e) => {
                tracing::warn!(error = %e, "raft: no descriptor to compact the log; later");
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        put_in_place(&self.dir, "log.jsonl")?;
        self.file = staged;
        self.ops_in_file = self.entries.len() + usize::from(self.last_purged.is_some());
        Ok(())
    }

    fn maybe_compact(&mut self) -> io::Result<()> {
        if self.ops_in_file > self.entries.len() + COMPACT_SLACK {
            self.compact()?;
        }
        Ok(())
    }
}

impl LogStore {
    /// Opens (or creates) the store in `dir`, replaying the op log.
    pub fn open(dir: &Path) -> io::Result<LogStore> {
        fs::create_dir_all(dir)?;
        let vote: Option<Vote> = read_json(&dir.join("vote.json"))?;
        let path = dir.join("log.jsonl");
        let mut inner = LogInner {
            dir: dir.to_owned(),
            vote,
            entries: BTreeMap::new(),
            last_purged: None,
            file: OpenOptions::new().create(true).append(true).open(&path)?,
            ops_in_file: 0,
        };
        let mut good_len = 0u64;
        let mut torn = false;
        {
            let mut reader = BufReader::new(File::open(&path)?);
            let mut line = String::new();
            loop {
                line.clear();
                let n = reader.read_line(&mut line)?;
                if n == 0 {
                    break;
                }
                let complete = line.ends_with('\n');
                match serde_json::from_str::<LogOp>(line.trim_end()) {
                    Ok(op) if complete => {
                        inner.apply(op);
                        inner.ops_in_file += 1;
                        good_len += n as u64;
                    }
                    _ => {
                        torn = true;
                        break;
                    }
                }
            }
        }
        if torn {
            tracing::warn!(path = %path.display(), at = good_len, "raft log: cutting off a torn tail");
            let f = OpenOptions::new().write(true).open(&path)?;
            f.set_len(good_len)?;
            f.sync_all()?;
            inner.file = OpenOptions::new().append(true).open(&path)?;
            inner.file.seek(io::SeekFrom::End(0))?;
        }
        Ok(LogStore {
            inner: Arc::new(Mutex::new(inner)),
        })
    }

    /// The highest term this store has voted in (for tests and diagnostics).
    pub fn saved_vote(&self) -> Option<Vote> {
        lock(&self.inner).vote
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let g = lock(&self.inner);
        Ok(g.entries.range(range).map(|(_, e)| e.clone()).collect())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(lock(&self.inner).vote)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let g = lock(&self.inner);
        let last = g
            .entries
            .values()
            .next_back()
            .map(|e| e.log_id)
            .or(g.last_purged);
        Ok(LogState {
            last_purged_log_id: g.last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let bytes = serde_json::to_vec(vote).map_err(io::Error::other)?;
        // Writing the vote opens a file. Out of descriptors (a flood of client connections, a
        // lowered limit) that fails, and openraft stops a member whose storage fails, for good:
        // the node then stays a candidate that never hears its leader. A descriptor shortage
        // passes (the node steps down and sheds clients), so it is waited out for a bounded time;
        // raft goes nowhere meanwhile (the vote is not taken until it is on disk).
        let until = std::time::Instant::now() + VOTE_WRITE_PATIENCE;
        loop {
            let written = {
                let g = lock(&self.inner);
                write_atomic(&g.dir, "vote.json", &bytes)
            };
            match written {
                Ok(()) => break,
                Err(e) if out_of_descriptors(&e) && std::time::Instant::now() < until => {
                    tracing::warn!(error = %e, "raft: no descriptor to write the vote; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                Err(e) => return Err(e),
            }
        }
        lock(&self.inner).vote = Some(*vote);
        Ok(())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let ops: Vec<LogOp> = entries.into_iter().map(LogOp::Append).collect();
        let result = {
            let mut g = lock(&self.inner);
            match g.write_ops(&ops) {
                Ok(()) => {
                    for op in ops {
                        g.apply(op);
                    }
                    Ok(())
                }
                Err(e) => Err(e),
            }
        };
        match result {
            Ok(()) => {
                callback.io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.io_completed(Err(io::Error::new(e.kind(), e.to_string())));
                Err(e)
            }
        }
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let mut g = lock(&self.inner);
        let op = LogOp::TruncateAfter(last_log_id);
        g.write_ops(std::slice::from_ref(&op))?;
        g.apply(op);
        g.maybe_compact()
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        let mut g = lock(&self.inner);
        let op = LogOp::Purge(log_id);
        g.write_ops(std::slice::from_ref(&op))?;
        g.apply(op);
        g.maybe_compact()
    }
}

struct SmInner {
    dir: PathBuf,
    last_applied: Option<LogId>,
    membership: StoredMembership,
    /// The newest snapshot: its meta and its payload (the table as it was then).
    snapshot: Option<(SnapshotMeta, SnapshotData)>,
    /// The shard lease table (empty at K = 1) and this node's own clocks for it.
    leases: Leases,
}

/// `snapshot.json`: the meta and the shard lease table. A file written before shards existed
/// holds the meta alone (read with an empty table).
#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    meta: SnapshotMeta,
    #[serde(default)]
    table: LeaseTable,
}

/// Reads `snapshot.json` in either layout. Each is parsed straight from the bytes (not through
/// `#[serde(untagged)]`, whose buffering cannot read the membership's numeric map keys).
fn read_snapshot_file(path: &Path) -> io::Result<Option<SnapshotFile>> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    if let Ok(file) = serde_json::from_slice::<SnapshotFile>(&bytes) {
        return Ok(Some(file));
    }
    match serde_json::from_slice::<SnapshotMeta>(&bytes) {
        Ok(meta) => Ok(Some(SnapshotFile {
            meta,
            table: LeaseTable::default(),
        })),
        Err(e) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {e}", path.display()),
        )),
    }
}

/// The state machine: what it last applied, the membership, and the shard lease table.
#[derive(Clone)]
pub struct StateMachine {
    inner: Arc<Mutex<SmInner>>,
}

fn table_bytes(table: &LeaseTable) -> io::Result<SnapshotData> {
    if table.is_empty() {
        return Ok(Vec::new());
    }
    serde_json::to_vec(table).map_err(io::Error::other)
}

fn table_from(bytes: &[u8]) -> io::Result<LeaseTable> {
    if bytes.is_empty() {
        return Ok(LeaseTable::default());
    }
    serde_json::from_slice(bytes).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("snapshot's shard table: {e}"),
        )
    })
}

impl StateMachine {
    /// Opens (creating if needed) the state machine's files in `dir`.
    pub fn open(dir: &Path) -> io::Result<StateMachine> {
        fs::create_dir_all(dir)?;
        let (meta, table) = match read_snapshot_file(&dir.join("snapshot.json"))? {
            Some(f) => (Some(f.meta), f.table),
            None => (None, LeaseTable::default()),
        };
        let (last_applied, membership) = match &meta {
            Some(m) => (m.last_log_id, m.last_membership.clone()),
            None => (None, StoredMembership::default()),
        };
        let snapshot = match meta {
            Some(m) => Some((m, table_bytes(&table)?)),
            None => None,
        };
        Ok(StateMachine {
            inner: Arc::new(Mutex::new(SmInner {
                dir: dir.to_owned(),
                last_applied,
                membership,
                snapshot,
                leases: Leases::restored(table, std::time::Instant::now()),
            })),
        })
    }

    fn persist_snapshot(g: &mut SmInner, meta: SnapshotMeta, data: SnapshotData) -> io::Result<()> {
        let file = SnapshotFile {
            meta: meta.clone(),
            table: table_from(&data)?,
        };
        let bytes = serde_json::to_vec(&file).map_err(io::Error::other)?;
        write_atomic(&g.dir, "snapshot.json", &bytes)?;
        g.snapshot = Some((meta, data));
        Ok(())
    }

    /// Runs `f` on the shard lease table under the state machine's lock (what apply holds), so
    /// a judgement made in `f` sees every entry applied so far and none half-applied.
    pub(crate) fn with_leases<T>(&self, f: impl FnOnce(&mut Leases) -> T) -> T {
        f(&mut lock(&self.inner).leases)
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let mut g = lock(&self.inner);
        let meta = SnapshotMeta {
            last_log_id: g.last_applied,
            last_membership: g.membership.clone(),
        };
        let data = table_bytes(g.leases.table())?;
        Self::persist_snapshot(&mut g, meta.clone(), data.clone())?;
        Ok(Snapshot {
            meta,
            snapshot: data,
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = StateMachine;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        let g = lock(&self.inner);
        Ok((g.last_applied, g.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            let outcome = {
                let mut g = lock(&self.inner);
                if let Some(m) = openraft::entry::RaftEntry::get_membership(&entry) {
                    g.membership = StoredMembership::new(Some(entry.log_id), m);
                }
                g.last_applied = Some(entry.log_id);
                match &entry.payload {
                    openraft::EntryPayload::Normal(cmd) => g.leases.apply(
                        cmd,
                        entry.log_id.committed_leader_id().term,
                        std::time::Instant::now(),
                    ),
                    _ => ShardOutcome::None,
                }
            };
            if let Some(r) = responder {
                r.send(outcome);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotData,
    ) -> Result<(), io::Error> {
        let table = table_from(&snapshot)?;
        let mut g = lock(&self.inner);
        Self::persist_snapshot(&mut g, meta.clone(), snapshot)?;
        g.last_applied = meta.last_log_id;
        g.membership = meta.last_membership.clone();
        g.leases = Leases::restored(table, std::time::Instant::now());
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        let g = lock(&self.inner);
        Ok(g.snapshot.clone().map(|(meta, data)| Snapshot {
            meta,
            snapshot: data,
        }))
    }
}

#[cfg(test)]
mod tests {
    use openraft::entry::RaftEntry;
    use openraft::vote::RaftLeaderId;

    use super::*;

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(
            openraft::impls::leader_id_std::LeaderId::<u64, u64>::new(term, 1).to_committed(),
            index,
        )
    }

    #[tokio::test]
    async fn log_and_vote_survive_reopen_with_truncate_and_purge() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut s = LogStore::open(dir.path()).unwrap();
            s.save_vote(&Vote::new(7, 2)).await.unwrap();
            let entries: Vec<Entry> = (1..=10).map(|i| Entry::new_blank(log_id(7, i))).collect();
            s.append(entries, IOFlushed::noop()).await.unwrap();
            s.truncate_after(Some(log_id(7, 8))).await.unwrap();
            s.purge(log_id(7, 3)).await.unwrap();
        }
        let mut s = LogStore::open(dir.path()).unwrap();
        assert_eq!(s.read_vote().await.unwrap(), Some(Vote::new(7, 2)));
        let st = s.get_log_state().await.unwrap();
        assert_eq!(st.last_purged_log_id, Some(log_id(7, 3)));
        assert_eq!(st.last_log_id, Some(log_id(7, 8)));
        let got = s.try_get_log_entries(0..100).await.unwrap();
        assert_eq!(
            got.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
            vec![4, 5, 6, 7, 8]
        );
    }

    #[tokio::test]
    async fn the_shard_table_rides_in_snapshots_and_an_old_snapshot_still_opens() {
        use crate::backends::raft::lease_table::{Holder, ShardCmd};
        let dir = tempfile::tempdir().unwrap();
        // A snapshot.json written before shards: the meta alone, with a real membership (its
        // map of members has numeric keys, which JSON writes as strings).
        let members: std::collections::BTreeSet<u64> = [1, 2, 3].into();
        let nodes: BTreeMap<u64, openraft::BasicNode> = members
            .iter()
            .map(|id| (*id, openraft::BasicNode::new(format!("127.0.0.1:{id}"))))
            .collect();
        let old = SnapshotMeta {
            last_log_id: Some(log_id(3, 10)),
            last_membership: StoredMembership::new(
                Some(log_id(1, 1)),
                openraft::Membership::new(vec![members], nodes).unwrap(),
            ),
        };
        fs::write(
            dir.path().join("snapshot.json"),
            serde_json::to_vec(&old).unwrap(),
        )
        .unwrap();
        let mut sm = StateMachine::open(dir.path()).unwrap();
        let (applied, membership) = sm.applied_state().await.unwrap();
        assert_eq!(applied, Some(log_id(3, 10)));
        assert_eq!(membership, old.last_membership);
        assert!(sm.with_leases(|l| l.table().is_empty()));
        // A grant, then a snapshot: reopened, and installed elsewhere, the table is the same.
        let grant = ShardCmd::Grant {
            shard: 2,
            holder: Holder {
                id: "n1-x".into(),
                node: "n1".into(),
                info: "{}".into(),
            },
            expect: 0,
            term: 3,
        };
        sm.with_leases(|l| l.apply(&grant, 3, std::time::Instant::now()));
        let snap = sm.build_snapshot().await.unwrap();
        let table = sm.with_leases(|l| l.table().clone());
        assert_eq!(table.slot(2).map(|s| s.epoch), Some(3));
        let mut reopened = StateMachine::open(dir.path()).unwrap();
        assert_eq!(reopened.with_leases(|l| l.table().clone()), table);
        assert_eq!(
            reopened.applied_state().await.unwrap().1,
            old.last_membership
        );
        let other = tempfile::tempdir().unwrap();
        let mut fresh = StateMachine::open(other.path()).unwrap();
        fresh
            .install_snapshot(&snap.meta, snap.snapshot.clone())
            .await
            .unwrap();
        assert_eq!(fresh.with_leases(|l| l.table().clone()), table);
        let current = fresh.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.snapshot, snap.snapshot);
    }

    #[tokio::test]
    async fn torn_tail_is_cut_and_log_compacts() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut s = LogStore::open(dir.path()).unwrap();
            for i in 1..=(COMPACT_SLACK as u64 + 20) {
                s.append([Entry::new_blank(log_id(1, i))], IOFlushed::noop())
                    .await
                    .unwrap();
                s.purge(log_id(1, i.saturating_sub(2).max(1)))
                    .await
                    .unwrap();
            }
        }
        let lines = fs::read_to_string(dir.path().join("log.jsonl"))
            .unwrap()
            .lines()
            .count();
        assert!(
            lines < COMPACT_SLACK + 10,
            "log was not compacted: {lines} lines"
        );
        // A crash mid-write leaves half a line.
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.path().join("log.jsonl"))
            .unwrap();
        f.write_all(b"{\"append\":{\"log_id\"").unwrap();
        drop(f);
        let mut s = LogStore::open(dir.path()).unwrap();
        let st = s.get_log_state().await.unwrap();
        assert_eq!(
            st.last_log_id.map(|l| l.index),
            Some(COMPACT_SLACK as u64 + 20)
        );
        s.append(
            [Entry::new_blank(log_id(2, COMPACT_SLACK as u64 + 21))],
            IOFlushed::noop(),
        )
        .await
        .unwrap();
        let mut s = LogStore::open(dir.path()).unwrap();
        let st = s.get_log_state().await.unwrap();
        assert_eq!(st.last_log_id, Some(log_id(2, COMPACT_SLACK as u64 + 21)));
    }
}
