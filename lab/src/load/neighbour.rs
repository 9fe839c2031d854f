//! A reproducible CPU neighbour for benchmarks and experiments: `stress-ng` at a set load,
//! killed with its whole process group when dropped.

use anyhow::Context as _;

/// A `stress-ng` CPU neighbour, killed (its whole process group) on drop.
pub struct Neighbour(Option<std::process::Child>);

impl Neighbour {
    /// `stress-ng --cpu 2 --cpu-load CPU_PERCENT --cpu-load-slice SLICE_MS` (0: none), in this
    /// command's session or (`own_session`) in one of its own.
    pub fn spawn(cpu_percent: u32, slice_ms: u32, own_session: bool) -> anyhow::Result<Neighbour> {
        if cpu_percent == 0 {
            return Ok(Neighbour(None));
        }
        anyhow::ensure!(
            cpu_percent <= 100,
            "--neighbour-cpu-percent {cpu_percent} > 100"
        );
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new("stress-ng");
        cmd.args([
            "--cpu",
            "2",
            "--cpu-load",
            &cpu_percent.to_string(),
            "--cpu-load-slice",
            &slice_ms.to_string(),
            "--quiet",
        ])
        .stdout(std::process::Stdio::null());
        if own_session {
            // SAFETY: setsid is async-signal-safe and touches no memory of the parent. A new
            // session is also a new process group, so Drop's kill of the group still applies.
            unsafe {
                cmd.pre_exec(|| {
                    libc::setsid();
                    Ok(())
                });
            }
        } else {
            cmd.process_group(0);
        }
        let child = cmd
            .spawn()
            .context("starting stress-ng (Debian package stress-ng: scripts/ensure-deps.sh)")?;
        Ok(Neighbour(Some(child)))
    }
}

impl Drop for Neighbour {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            // SAFETY: kill(2) on our own child's process group; no memory is touched.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
        }
    }
}
