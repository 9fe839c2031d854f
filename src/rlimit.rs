//! The descriptor limit. A node's sockets (clients, peers, database pool) and files
//! all draw on RLIMIT_NOFILE, whose soft limit is often 1,024 while the hard limit allows far
//! more: the node raises the soft limit to the hard one at start-up, and sizes its client
//! connection cap from the result.
//!
//! Also the client thread's scheduling priority ([`nice_this_thread`]): what the kernel runs
//! first when the machine is saturated.

/// RLIMIT_NOFILE as the node runs with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NofileLimit {
    /// The soft limit in force (what `open` and `accept` hit).
    pub soft: u64,
    /// The hard limit: the most the soft limit may be raised to without privileges.
    pub hard: u64,
    /// The soft limit before the node raised it.
    pub soft_before: u64,
}

/// Reading the limit failed (raising it is best effort and never an error).
#[derive(Debug, thiserror::Error)]
pub enum RlimitError {
    /// `getrlimit` failed.
    #[error("getrlimit(RLIMIT_NOFILE): {0}")]
    Get(std::io::Error),
}

/// Raises the soft descriptor limit to the hard limit where the kernel allows it; a refusal is
/// not fatal (the node runs with the limit it has, and its connection cap follows it).
// `rlim_t` is u64 here but u32 on 32-bit Linux targets: the casts are what makes it u64 there.
#[allow(clippy::unnecessary_cast)]
pub fn raise_nofile_soft_limit() -> Result<NofileLimit, RlimitError> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(RlimitError::Get(std::io::Error::last_os_error()));
    }
    let soft_before = lim.rlim_cur as u64;
    let hard = lim.rlim_max as u64;
    let mut soft = soft_before;
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            soft = hard;
        } else {
            tracing::warn!(
                error = %std::io::Error::last_os_error(),
                soft_before,
                hard,
                "could not raise the descriptor soft limit"
            );
        }
    }
    Ok(NofileLimit {
        soft,
        hard,
        soft_before,
    })
}

/// Sets the calling thread's nice value (Linux: `setpriority` on a thread id applies to that
/// thread alone). Best effort: a refusal is logged, and the thread runs at the process's
/// priority. Raising a nice value never needs privileges.
pub fn nice_this_thread(nice: i32) {
    if nice == 0 {
        return;
    }
    // SAFETY: gettid has no preconditions; setpriority only reads its arguments.
    let tid = unsafe { libc::gettid() };
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) } != 0 {
        tracing::warn!(nice, error = %std::io::Error::last_os_error(), "could not lower the client thread's priority");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soft_limit_ends_at_the_hard_limit_where_allowed() {
        let l = raise_nofile_soft_limit().unwrap();
        assert!(l.soft >= l.soft_before);
        assert!(l.soft <= l.hard);
        // Raising is always allowed up to the hard limit for an unprivileged process.
        assert_eq!(l.soft, l.hard);
    }

    #[test]
    fn nice_applies_to_the_calling_thread_only() {
        fn this_threads_nice() -> i32 {
            unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
        }
        let before = this_threads_nice();
        let inside = std::thread::spawn(|| {
            nice_this_thread(7);
            this_threads_nice()
        })
        .join()
        .unwrap();
        assert_eq!(inside, (before + 7).min(19));
        assert_eq!(
            this_threads_nice(),
            before,
            "the spawning thread keeps its priority"
        );
    }
}
