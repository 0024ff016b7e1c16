//! The async runtime openraft runs on: tokio, with a random source that can be seeded.
//!
//! openraft draws its election timeouts from `AsyncRuntime::thread_rng()`. With tokio's own
//! runtime that is the OS-seeded thread RNG, which makes elections unreplayable. [`SeededRuntime`]
//! delegates everything to tokio but draws from a thread-local `StdRng` that a simulation can
//! seed with [`seed_thread_rng`]. In production nothing seeds it and it starts from OS entropy.
//!
//! Invariant: on a current-thread tokio runtime every Raft task runs on the seeding thread, so
//! one seed gives one sequence of election timeouts.

use std::cell::RefCell;
use std::future::Future;
use std::time::Duration;

use openraft::async_runtime::TokioOneShotSender;
use openraft::{AsyncRuntime, OptionalSend, TokioInstant};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

thread_local! {
    static THREAD_RNG: RefCell<StdRng> = RefCell::new(StdRng::from_entropy());
}

/// Reseeds this thread's random source used by openraft (election timeouts).
pub fn seed_thread_rng(seed: u64) {
    THREAD_RNG.with(|rng| *rng.borrow_mut() = StdRng::seed_from_u64(seed));
}

/// A handle to the calling thread's seedable random source.
#[derive(Debug, Clone, Copy, Default)]
pub struct SeededThreadRng;

impl RngCore for SeededThreadRng {
    fn next_u32(&mut self) -> u32 {
        THREAD_RNG.with(|rng| rng.borrow_mut().next_u32())
    }

    fn next_u64(&mut self) -> u64 {
        THREAD_RNG.with(|rng| rng.borrow_mut().next_u64())
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        THREAD_RNG.with(|rng| rng.borrow_mut().fill_bytes(dest))
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        THREAD_RNG.with(|rng| rng.borrow_mut().try_fill_bytes(dest))
    }
}

/// tokio, with [`SeededThreadRng`] as openraft's random source.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SeededRuntime;

impl AsyncRuntime for SeededRuntime {
    type JoinError = tokio::task::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = tokio::task::JoinHandle<T>;
    type Sleep = tokio::time::Sleep;
    type Instant = TokioInstant;
    type TimeoutError = tokio::time::error::Elapsed;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = tokio::time::Timeout<T>;
    type ThreadLocalRng = SeededThreadRng;
    type OneshotSender<T: OptionalSend> = TokioOneShotSender<T>;
    type OneshotReceiverError = tokio::sync::oneshot::error::RecvError;
    type OneshotReceiver<T: OptionalSend> = tokio::sync::oneshot::Receiver<T>;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        tokio::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        tokio::time::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        tokio::time::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        tokio::time::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        tokio::time::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        join_error.is_panic()
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        SeededThreadRng
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (TokioOneShotSender(tx), rx)
    }
}
