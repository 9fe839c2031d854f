//! Small helpers for spawned tasks.

use tokio::task::JoinHandle;

/// Aborts the task when dropped, so a helper task ends with whatever started it (a campaign, a
/// benchmark), on every path out, errors and cancellation included.
pub struct AbortOnDrop(pub JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
