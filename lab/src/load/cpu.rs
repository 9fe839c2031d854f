//! CPU time per thread (`/proc/<pid>/task/<tid>/stat`), sampled before and after a window: which
//! side of a benchmark ran out of CPU first, the node's threads or the generator's.
//!
//! On a machine where the generator shares the cores with the node it measures, "is the node the
//! limit?" is a question about threads: a thread busy all of the window cannot go faster, and
//! whichever side owns it is the limit.

use serde::Serialize;

/// One thread's CPU time so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadTicks {
    pub tid: u32,
    /// The thread's name (`comm`), e.g. `baton-http-0`.
    pub name: String,
    /// User + system time, in clock ticks.
    pub ticks: u64,
}

/// One thread's share of a window: 1.0 = busy the whole window (one core).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ThreadBusy {
    pub name: String,
    pub tid: u32,
    pub busy: f64,
}

/// Every thread of `pid` now (empty if the process is gone or `/proc` says nothing).
pub fn threads_of(pid: u32) -> Vec<ThreadTicks> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Some(t) = std::fs::read_to_string(e.path().join("stat"))
            .ok()
            .and_then(|s| parse_stat(tid, &s))
        {
            out.push(t);
        }
    }
    out
}

/// `tid (comm) state ppid ... utime stime ...`: utime and stime are fields 14 and 15; `comm` may
/// hold spaces and parentheses, so the fields are counted from its last `)`.
pub fn parse_stat(tid: u32, stat: &str) -> Option<ThreadTicks> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_owned();
    let rest: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    // rest[0] is field 3 (state): utime (14) is rest[11], stime (15) rest[12].
    let utime: u64 = rest.get(11)?.parse().ok()?;
    let stime: u64 = rest.get(12)?.parse().ok()?;
    Some(ThreadTicks {
        tid,
        name,
        ticks: utime + stime,
    })
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`, 100 almost everywhere).
pub fn ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// Each thread's share of a `seconds` window between two samples of one process, busiest first
/// (threads that came or went in between are left out).
pub fn busy_between(
    before: &[ThreadTicks],
    after: &[ThreadTicks],
    seconds: f64,
) -> Vec<ThreadBusy> {
    if seconds <= 0.0 {
        return Vec::new();
    }
    let hz = ticks_per_second();
    let mut out: Vec<ThreadBusy> = after
        .iter()
        .filter_map(|a| {
            let b = before.iter().find(|b| b.tid == a.tid)?;
            Some(ThreadBusy {
                name: a.name.clone(),
                tid: a.tid,
                busy: a.ticks.saturating_sub(b.ticks) as f64 / hz / seconds,
            })
        })
        .collect();
    out.sort_by(|x, y| y.busy.total_cmp(&x.busy));
    out
}

/// Threads of one process over a window, as a report carries them.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ProcessThreads {
    /// What the process is (`leader node n2`, `generator`).
    pub what: String,
    pub pid: u32,
    /// The window's length, s.
    pub seconds: f64,
    /// All its threads together, in cores.
    pub total_cores: f64,
    /// Its busiest threads, busiest first (at most [`TOP_THREADS`]).
    pub busiest: Vec<ThreadBusy>,
    /// Its sequencer commit threads (`baton-commit-*`, `[http] commit_threads`), busy or not:
    /// the serial stage's thread, whose CPU per ID issue 31 asks for, is seldom among the
    /// busiest.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub commit_threads: Vec<ThreadBusy>,
}

/// The prefix of a sequencer commit thread's name (`src/http/mod.rs` names them).
pub const COMMIT_THREAD_PREFIX: &str = "baton-commit-";

impl ProcessThreads {
    /// µs of CPU on the commit threads per ID, at `ids_per_s` over this window: the serial
    /// stage's cost per ID, read from thread counters (`None` without a commit thread).
    pub fn commit_us_per_id(&self, ids_per_s: f64) -> Option<f64> {
        if self.commit_threads.is_empty() || ids_per_s <= 0.0 {
            return None;
        }
        let busy: f64 = self.commit_threads.iter().map(|t| t.busy).sum();
        Some(busy * 1e6 / ids_per_s)
    }
}

/// Threads a [`ProcessThreads`] lists.
pub const TOP_THREADS: usize = 6;

/// A window over processes: sample at the start, [`Window::finish`] at the end.
pub struct Window {
    started: std::time::Instant,
    procs: Vec<(String, u32, Vec<ThreadTicks>)>,
}

impl Window {
    /// Starts a window over `procs` (`(what, pid)`).
    pub fn start(procs: &[(String, u32)]) -> Window {
        Window {
            started: std::time::Instant::now(),
            procs: procs
                .iter()
                .map(|(w, p)| (w.clone(), *p, threads_of(*p)))
                .collect(),
        }
    }

    /// Each process's threads over the window; `only` keeps the threads whose name starts with
    /// it (per process, `None`: all).
    pub fn finish(self, only: &[Option<&str>]) -> Vec<ProcessThreads> {
        let secs = self.started.elapsed().as_secs_f64();
        self.procs
            .into_iter()
            .enumerate()
            .map(|(i, (what, pid, before))| {
                let mut busy = busy_between(&before, &threads_of(pid), secs);
                if let Some(Some(prefix)) = only.get(i) {
                    busy.retain(|t| t.name.starts_with(prefix));
                }
                let total_cores = busy.iter().map(|t| t.busy).sum();
                let commit_threads = busy
                    .iter()
                    .filter(|t| t.name.starts_with(COMMIT_THREAD_PREFIX))
                    .cloned()
                    .collect();
                busy.retain(|t| t.busy >= 0.005);
                busy.truncate(TOP_THREADS);
                ProcessThreads {
                    what,
                    pid,
                    seconds: secs,
                    total_cores,
                    busiest: busy,
                    commit_threads,
                }
            })
            .collect()
    }
}

/// The load generator's threads as a [`ProcessThreads`], from the busy shares the load itself
/// measured ([`crate::load::Summary::generator_threads_busy`]: its threads live only as long as
/// one run, so a window sampled from outside would miss them).
pub fn generator(busy: &[f64], seconds: f64) -> ProcessThreads {
    ProcessThreads {
        what: "generator".into(),
        pid: std::process::id(),
        seconds,
        total_cores: busy.iter().sum(),
        busiest: busy
            .iter()
            .take(TOP_THREADS)
            .map(|b| ThreadBusy {
                name: "baton-load".into(),
                tid: 0,
                busy: *b,
            })
            .collect(),
        commit_threads: Vec::new(),
    }
}

/// One line per process: `leader node n2 (pid 7): 1.42 cores; baton-http-0 97%, ...`.
pub fn render(procs: &[ProcessThreads]) -> String {
    let mut out = String::new();
    for p in procs {
        let threads: Vec<String> = p
            .busiest
            .iter()
            .map(|t| format!("{} {:.0}%", t.name, t.busy * 100.0))
            .collect();
        out.push_str(&format!(
            "  {} (pid {}): {:.2} cores; {}\n",
            p.what,
            p.pid,
            p.total_cores,
            threads.join(", ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_count_from_the_last_parenthesis() {
        let stat = "4242 (baton-http-0) S 1 2 3 4 5 6 7 8 9 10 250 31 0 0 20 0 1 0 99 0 0";
        let t = parse_stat(4242, stat).unwrap();
        assert_eq!((t.name.as_str(), t.ticks), ("baton-http-0", 281));
        // A name with spaces and a parenthesis in it.
        let stat = "7 (a (b) c) R 1 2 3 4 5 6 7 8 9 10 5 6 0 0";
        let t = parse_stat(7, stat).unwrap();
        assert_eq!((t.name.as_str(), t.ticks), ("a (b) c", 11));
        assert!(parse_stat(1, "1 (x) S 1 2").is_none());
    }

    #[test]
    fn busy_is_ticks_over_the_window_busiest_first() {
        let hz = ticks_per_second();
        let t = |tid, ticks| ThreadTicks {
            tid,
            name: format!("t{tid}"),
            ticks,
        };
        let before = [t(1, 0), t(2, 10), t(3, 0)];
        let after = [t(1, hz as u64), t(2, 10 + hz as u64 * 2), t(4, 500)];
        let b = busy_between(&before, &after, 2.0);
        assert_eq!(b.len(), 2, "thread 3 left, thread 4 came: neither counts");
        assert_eq!((b[0].tid, b[0].busy), (2, 1.0));
        assert_eq!((b[1].tid, b[1].busy), (1, 0.5));
    }

    #[test]
    fn a_commit_thread_is_reported_busy_or_not_and_its_cpu_per_id_is_busy_over_the_rate() {
        let me = std::process::id();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let idle = std::thread::Builder::new()
            .name(format!("{COMMIT_THREAD_PREFIX}0"))
            .spawn(move || stop_rx.recv().ok())
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let w = Window::start(&[("me".into(), me)]);
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let p = w.finish(&[None]).remove(0);
        stop_tx.send(()).unwrap();
        idle.join().unwrap();
        assert!(
            !p.busiest
                .iter()
                .any(|t| t.name.starts_with(COMMIT_THREAD_PREFIX)),
            "an idle thread is not among the busiest: {:?}",
            p.busiest
        );
        assert_eq!(
            p.commit_threads
                .iter()
                .map(|t| t.name.as_str())
                .collect::<Vec<_>>(),
            ["baton-commit-0"]
        );
        // A quarter of a core at 500k IDs/s is 0.5 µs per ID; no commit thread, no figure.
        let mut q = p.clone();
        q.commit_threads[0].busy = 0.25;
        assert_eq!(q.commit_us_per_id(500_000.0), Some(0.5));
        q.commit_threads.clear();
        assert_eq!(q.commit_us_per_id(500_000.0), None);
    }

    #[test]
    fn this_process_threads_are_seen() {
        let me = std::process::id();
        let w = Window::start(&[("me".into(), me)]);
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let p = w.finish(&[None]);
        assert_eq!(p.len(), 1);
        assert!(!p[0].busiest.is_empty(), "{p:?}");
    }
}
