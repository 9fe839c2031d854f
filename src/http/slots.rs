//! Connection slots: at most `max` client connections at once. When every slot is taken, a new
//! connection takes the slot of the connection that has gone longest without progress (no
//! request past its body being served), rather than being refused: otherwise a flood of slow
//! connections, each held until its timeout, would lock every new client out (a pooled HTTP
//! client racing a fresh connect against its idle one would see nothing but refusals). Only
//! when every slot is serving a request is the newcomer refused (503).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::Notify;

/// One admitted connection, shared by its task, its requests and the slot table.
#[derive(Debug)]
pub(crate) struct ConnState {
    id: u64,
    /// When this connection last made progress (accepted, a request head in, a response out),
    /// in µs since the table's epoch.
    last_progress_us: AtomicU64,
    /// Requests on this connection whose body is in and which are being served.
    serving: AtomicU32,
    /// Told when the connection loses its slot; its task then drops the connection.
    pub(crate) evicted: Notify,
    was_evicted: AtomicBool,
    epoch: Instant,
}

impl ConnState {
    fn now_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// A request head arrived or a response went out.
    pub(crate) fn progressed(&self) {
        self.last_progress_us
            .store(self.now_us(), Ordering::Relaxed);
    }

    /// Marks a request as being served (its body is in) until the guard drops: a connection
    /// serving a request is never evicted.
    pub(crate) fn serving(self: &Arc<Self>) -> ServingGuard {
        self.serving.fetch_add(1, Ordering::Relaxed);
        ServingGuard(self.clone())
    }
}

pub(crate) struct ServingGuard(Arc<ConnState>);

impl Drop for ServingGuard {
    fn drop(&mut self) {
        self.0.serving.fetch_sub(1, Ordering::Relaxed);
        self.0.progressed();
    }
}

/// How a new connection was admitted.
pub(crate) enum Admission {
    /// A free slot.
    Free(Arc<ConnState>),
    /// The slot of a connection without progress, which has been told to go.
    Evicted(Arc<ConnState>),
    /// Every slot is serving a request.
    Full,
}

pub(crate) struct Slots {
    max: usize,
    epoch: Instant,
    table: Mutex<Table>,
    /// Evicted connections whose task has not yet dropped them: each still holds a descriptor.
    closing: AtomicUsize,
    /// Told whenever a connection is released.
    pub(crate) released: Notify,
}

/// Evicted connections allowed to be still closing before the accept loop waits for them: this
/// bounds the descriptors in use at `max + MAX_CLOSING` even when evictions outrun the tasks
/// that close them.
pub(crate) const MAX_CLOSING: usize = 64;

#[derive(Default)]
struct Table {
    next_id: u64,
    conns: HashMap<u64, Arc<ConnState>>,
}

impl Slots {
    pub(crate) fn new(max: usize) -> Slots {
        Slots {
            max,
            epoch: Instant::now(),
            table: Mutex::new(Table::default()),
            closing: AtomicUsize::new(0),
            released: Notify::new(),
        }
    }

    /// Whether so many evicted connections are still closing that the accept loop should wait.
    pub(crate) fn too_many_closing(&self) -> bool {
        self.closing.load(Ordering::Relaxed) >= MAX_CLOSING
    }

    pub(crate) fn admit(&self) -> Admission {
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let evicted = if t.conns.len() >= self.max {
            let Some(victim) = stalest_idle(&t.conns) else {
                return Admission::Full;
            };
            t.conns.remove(&victim.id);
            victim.was_evicted.store(true, Ordering::Relaxed);
            self.closing.fetch_add(1, Ordering::Relaxed);
            victim.evicted.notify_one();
            true
        } else {
            false
        };
        let id = t.next_id;
        t.next_id += 1;
        let conn = Arc::new(ConnState {
            id,
            last_progress_us: AtomicU64::new(0),
            serving: AtomicU32::new(0),
            evicted: Notify::new(),
            was_evicted: AtomicBool::new(false),
            epoch: self.epoch,
        });
        conn.progressed();
        t.conns.insert(id, conn.clone());
        if evicted {
            Admission::Evicted(conn)
        } else {
            Admission::Free(conn)
        }
    }

    /// The connection is gone (closed, timed out or evicted): its slot is free.
    pub(crate) fn release(&self, conn: &ConnState) {
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        t.conns.remove(&conn.id);
        if conn.was_evicted.load(Ordering::Relaxed) {
            self.closing.fetch_sub(1, Ordering::Relaxed);
        }
        drop(t);
        self.released.notify_waiters();
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.table.lock().unwrap().conns.len()
    }
}

/// The connection serving no request that made progress longest ago.
fn stalest_idle(conns: &HashMap<u64, Arc<ConnState>>) -> Option<Arc<ConnState>> {
    conns
        .values()
        .filter(|c| c.serving.load(Ordering::Relaxed) == 0)
        .min_by_key(|c| (c.last_progress_us.load(Ordering::Relaxed), c.id))
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(a: Admission) -> Arc<ConnState> {
        match a {
            Admission::Free(c) | Admission::Evicted(c) => c,
            Admission::Full => panic!("refused"),
        }
    }

    #[test]
    fn free_slots_then_the_stalest_idle_connection_is_evicted() {
        let slots = Slots::new(3);
        let a = conn(slots.admit());
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = conn(slots.admit());
        std::thread::sleep(std::time::Duration::from_millis(2));
        let c = conn(slots.admit());
        assert_eq!(slots.len(), 3);
        // `a` just answered a request: `b` is now the stalest.
        a.progressed();
        let d = slots.admit();
        assert!(matches!(d, Admission::Evicted(_)));
        assert_eq!(slots.len(), 3);
        // Evicted: b's task is told (a stored permit, so it sees it even if it polls later).
        tokio_test_notified(&b);
        let _ = (c, d);
    }

    #[test]
    fn a_connection_serving_a_request_keeps_its_slot() {
        let slots = Slots::new(2);
        let a = conn(slots.admit());
        let b = conn(slots.admit());
        let _ga = a.serving();
        let _gb = b.serving();
        assert!(matches!(slots.admit(), Admission::Full));
        drop(_gb);
        assert!(matches!(slots.admit(), Admission::Evicted(_)));
    }

    #[test]
    fn evictions_not_yet_closed_are_counted() {
        let slots = Slots::new(1);
        let mut conns = vec![conn(slots.admit())];
        for _ in 0..MAX_CLOSING {
            assert!(!slots.too_many_closing());
            conns.push(conn(slots.admit()));
        }
        assert!(slots.too_many_closing());
        // The evicted connections' tasks release them: room again.
        for c in &conns[..MAX_CLOSING] {
            slots.release(c);
        }
        assert!(!slots.too_many_closing());
    }

    #[test]
    fn release_frees_the_slot() {
        let slots = Slots::new(1);
        let a = conn(slots.admit());
        slots.release(&a);
        assert!(matches!(slots.admit(), Admission::Free(_)));
    }

    fn tokio_test_notified(c: &Arc<ConnState>) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(1), c.evicted.notified())
                .await
                .expect("the evicted connection was told");
        });
    }
}
