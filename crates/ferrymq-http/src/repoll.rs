//! A connection's task that wakes itself is polled again at once, not rescheduled.
//!
//! hyper hands a request body to its handler through a channel whose two ends live in the same
//! task: the connection's dispatcher sends, the handler receives. When the handler takes a chunk,
//! the channel wakes the sender's waker, which is the connection's own task, while that task is
//! being polled. Tokio treats a task woken during its own poll as one that yielded: it queues it
//! again behind the others and wakes a parked worker to come and take it, which costs a futex
//! wake, a context switch and a poll that finds nothing to do, for every request with a body.
//!
//! [`Repoll`] gives the future it wraps a waker of its own. A wake that arrives while the future
//! is being polled (from this thread or any other) is noted, and the future is polled again
//! before the task returns to the scheduler; a wake at any other time goes to the task's waker as
//! usual. Invariants:
//! - No wake is lost: the state goes back to idle only when no wake came during the poll, and a
//!   wake that finds it idle goes to the task's waker, which is stored before the first poll.
//! - The extra polls are bounded ([`REPOLLS_MAX`]), and none is made once the task has used up
//!   its cooperative budget: past either, the wake goes to the scheduler as it would have.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering::AcqRel, Ordering::Acquire, Ordering::Release};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

/// Polls in a row given to a future that keeps waking itself before it goes back to the
/// scheduler: a request with a body wakes its task once or twice; more is a future that yields
/// on purpose, and it should then yield.
const REPOLLS_MAX: u32 = 4;

/// Not being polled: a wake goes to the task's waker.
const IDLE: u8 = 0;
/// Being polled, no wake yet.
const POLLING: u8 = 1;
/// Being polled, and woken since the poll began: poll again.
const WOKEN: u8 = 2;

struct Signal {
    state: AtomicU8,
    /// The waker of the task that polls the future, as of its latest poll.
    task: parking_lot::Mutex<Option<Waker>>,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut state = self.state.load(Acquire);
        loop {
            match state {
                WOKEN => return,
                POLLING => match self
                    .state
                    .compare_exchange_weak(POLLING, WOKEN, AcqRel, Acquire)
                {
                    Ok(_) => return,
                    Err(now) => state = now,
                },
                _ => {
                    if let Some(task) = self.task.lock().as_ref() {
                        task.wake_by_ref();
                    }
                    return;
                }
            }
        }
    }
}

/// `inner`, polled again at once when it wakes itself during a poll (see the module doc).
pub(crate) struct Repoll<F> {
    inner: Pin<Box<F>>,
    signal: Arc<Signal>,
    waker: Waker,
}

impl<F: Future> Repoll<F> {
    pub(crate) fn new(inner: F) -> Self {
        let signal = Arc::new(Signal {
            state: AtomicU8::new(IDLE),
            task: parking_lot::Mutex::new(None),
        });
        Repoll {
            inner: Box::pin(inner),
            waker: Waker::from(signal.clone()),
            signal,
        }
    }
}

impl<F: Future> Future for Repoll<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        {
            let mut task = this.signal.task.lock();
            if !task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        let state = &this.signal.state;
        let previous = state.swap(POLLING, AcqRel);
        debug_assert_ne!(
            previous, POLLING,
            "a Repoll is polled by one task at a time"
        );
        let mut own = Context::from_waker(&this.waker);
        let mut repolls = 0;
        loop {
            if let Poll::Ready(output) = this.inner.as_mut().poll(&mut own) {
                state.store(IDLE, Release);
                return Poll::Ready(output);
            }
            match state.compare_exchange(POLLING, IDLE, AcqRel, Acquire) {
                Ok(_) => return Poll::Pending,
                Err(woken) => {
                    debug_assert_eq!(woken, WOKEN);
                    if repolls == REPOLLS_MAX || !tokio::task::coop::has_budget_remaining() {
                        state.store(IDLE, Release);
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                    repolls += 1;
                    state.store(POLLING, Release);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    /// Counts the wakes that reach the task.
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Relaxed);
        }
    }

    fn task() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        (count.clone(), Waker::from(count))
    }

    /// A future that wakes itself `wakes` times, once per poll, then finishes.
    fn self_waking(wakes: u32) -> impl Future<Output = u32> {
        let mut polls = 0;
        std::future::poll_fn(move |cx| {
            polls += 1;
            if polls > wakes {
                return Poll::Ready(polls);
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        })
    }

    #[test]
    fn a_self_wake_is_polled_again_without_the_scheduler() {
        let (count, waker) = task();
        let mut cx = Context::from_waker(&waker);
        let mut future = std::pin::pin!(Repoll::new(self_waking(2)));
        assert_eq!(future.as_mut().poll(&mut cx), Poll::Ready(3));
        assert_eq!(count.0.load(Relaxed), 0);
    }

    #[test]
    fn endless_self_wakes_yield_to_the_scheduler() {
        let (count, waker) = task();
        let mut cx = Context::from_waker(&waker);
        let mut future = std::pin::pin!(Repoll::new(self_waking(100)));
        assert_eq!(future.as_mut().poll(&mut cx), Poll::Pending);
        // Polled 1 + REPOLLS_MAX times, then the wake went to the task.
        assert_eq!(count.0.load(Relaxed), 1);
        assert_eq!(future.as_mut().poll(&mut cx), Poll::Pending);
        assert_eq!(count.0.load(Relaxed), 2);
    }

    #[test]
    fn a_wake_between_polls_reaches_the_task() {
        let (count, waker) = task();
        let mut cx = Context::from_waker(&waker);
        let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let mut future = std::pin::pin!(Repoll::new(rx));
        assert!(future.as_mut().poll(&mut cx).is_pending());
        assert_eq!(count.0.load(Relaxed), 0);
        tx.send(7).unwrap();
        assert_eq!(count.0.load(Relaxed), 1);
        assert_eq!(future.as_mut().poll(&mut cx), Poll::Ready(Ok(7)));
    }

    #[test]
    fn a_wake_from_another_thread_during_the_poll_is_not_lost() {
        // The inner future hands its waker to a thread and waits until that thread has woken it,
        // all inside one poll: the wake lands while the state is POLLING.
        let (count, waker) = task();
        let mut cx = Context::from_waker(&waker);
        let mut first = true;
        let inner = std::future::poll_fn(move |cx| {
            if !first {
                return Poll::Ready(());
            }
            first = false;
            let waker = cx.waker().clone();
            std::thread::spawn(move || waker.wake()).join().unwrap();
            Poll::Pending
        });
        let mut future = std::pin::pin!(Repoll::new(inner));
        assert_eq!(future.as_mut().poll(&mut cx), Poll::Ready(()));
        assert_eq!(count.0.load(Relaxed), 0);
    }
}
