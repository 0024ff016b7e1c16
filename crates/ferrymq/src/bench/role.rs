//! A producer or consumer on an OS thread of its own.

use anyhow::{anyhow, Context};
use tokio::sync::oneshot;

/// One producer or consumer: an OS thread running a single-threaded runtime, so that a client's
/// tasks and the loop using them share one thread (no cross-thread wake-ups on the hot path),
/// like a single-threaded application would.
pub(super) struct Role<T> {
    thread: std::thread::JoinHandle<()>,
    done: oneshot::Receiver<anyhow::Result<T>>,
}

impl<T: Send + 'static> Role<T> {
    pub(super) fn spawn<F, Fut>(name: String, make: F) -> anyhow::Result<Role<T>>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = anyhow::Result<T>>,
    {
        let (done_tx, done) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                precise_sleeps();
                let result = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime.block_on(make()),
                    Err(error) => Err(anyhow::Error::from(error).context("cannot start a runtime")),
                };
                let _ = done_tx.send(result);
            })
            .with_context(|| format!("cannot start thread {name}"))?;
        Ok(Role { thread, done })
    }

    pub(super) fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    pub(super) async fn finish(self) -> anyhow::Result<T> {
        let result = self
            .done
            .await
            .unwrap_or_else(|_| Err(anyhow!("the thread ended without a result (panic)")));
        // The thread has sent its result and only drops its runtime now.
        let thread = self.thread;
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        result
    }
}

/// Lets this thread's sleeps end when asked: Linux otherwise rounds a sleep up by the 50 µs
/// default timer slack, which a 10 k msg/s schedule would count as latency.
fn precise_sleeps() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and only affects the calling thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
    }
}
