//! Request bodies under the listener's memory and time bounds.
//!
//! Every request body reaches its handler through a [`GuardedBody`], which enforces, whatever
//! the route:
//! - **a shared byte budget**: the bytes of request bodies held in memory across all connections
//!   are at most `HttpConfig::buffered_bytes_max`. A body of declared length reserves its room
//!   before its first byte is read; a chunked body reserves each chunk as it arrives. A body that
//!   cannot get room within `HttpConfig::buffered_wait` fails with [`BodyError::Busy`] (503).
//!   The first [`UNBUDGETED_BYTES`] of each body are not counted: a connection's own read buffer
//!   is at least that large and is already bounded by the connection limit, and the small
//!   bodies of the hot path then touch no shared counter.
//! - **an idle timeout**: a body that sends nothing for `HttpConfig::body_read_timeout` fails.
//! - **a minimum rate**: once the server has waited for a body for
//!   `HttpConfig::body_rate_grace`, the body must have averaged at least
//!   `HttpConfig::body_bytes_per_second_min` since that first wait, or it fails. A client that
//!   sends a byte now and then never hits the idle timeout, and would hold its connection and its
//!   room in the budget for as long as it likes.
//!
//! Both timeouts fail with [`BodyError::Timeout`] (408). A body that arrives with its head (the
//! common case) never waits, and so never reads the clock or allocates a timer.
//!
//! The room is given back when the body is dropped: the handlers drop a body once they have
//! read it and built what they hand to the broker.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Bytes of each body that are not counted against the shared budget. hyper's read buffer of a
/// connection starts at 8 KiB and holds at least this much whenever a request streams in, so a
/// body this small costs no more than the connection already does.
pub const UNBUDGETED_BYTES: u64 = 16 * 1024;

/// What every body of one connection is checked against (one per connection, so that cloning it
/// per request touches no counter shared with other connections).
pub(crate) struct BodyLimits {
    pub budget: Arc<Semaphore>,
    /// The budget's size in bytes: a body that needs more can never get room.
    pub budget_bytes: u64,
    pub wait: Duration,
    pub idle: Duration,
    pub rate_grace: Duration,
    pub bytes_per_second_min: u64,
}

/// Why a request body could not be read.
#[derive(Debug)]
pub enum BodyError {
    /// Too slow: idle too long, or below the minimum rate.
    Timeout(String),
    /// No room in the shared budget of buffered request bytes.
    Busy { wait: Duration, budget_bytes: u64 },
    /// The connection failed or the body was cut off.
    Read(hyper::Error),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::Timeout(why) => write!(f, "request body too slow: {why}"),
            BodyError::Busy { wait, budget_bytes } => write!(
                f,
                "the server is buffering as many request bodies as it may ({budget_bytes} bytes) and none finished within {} ms; try again later",
                wait.as_millis()
            ),
            BodyError::Read(error) => write!(f, "{error}"),
        }
    }
}

impl std::error::Error for BodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BodyError::Read(error) => Some(error),
            _ => None,
        }
    }
}

impl BodyError {
    /// The [`BodyError`] in `error` or its sources (axum wraps a body's error in its own).
    pub fn find<'a>(mut error: &'a (dyn std::error::Error + 'static)) -> Option<&'a BodyError> {
        // Bounded: error chains are short, and a cycle would be a bug elsewhere.
        for _ in 0..16 {
            if let Some(found) = error.downcast_ref::<BodyError>() {
                return Some(found);
            }
            error = error.source()?;
        }
        None
    }
}

type Acquire = Pin<Box<dyn Future<Output = Option<OwnedSemaphorePermit>> + Send>>;

/// A request body under the bounds of the module doc.
pub(crate) struct GuardedBody {
    inner: Incoming,
    limits: Arc<BodyLimits>,
    /// Bytes handed to the handler so far.
    received: u64,
    /// Room held in the budget, in bytes.
    held: Option<OwnedSemaphorePermit>,
    /// Whether a declared length's room was asked for.
    reserved: bool,
    /// A wait for room, and the chunk that needs it (`None` for a declared length's).
    acquiring: Option<(Acquire, Option<Frame<Bytes>>)>,
    /// When the server first waited for this body.
    first_wait: Option<Instant>,
    /// The deadline of the current wait for data: made on the first wait, and set again (not
    /// made anew) for each later one, so a body arriving in many reads allocates it once.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Whether `timer` counts for the current wait.
    waiting: bool,
}

impl GuardedBody {
    pub fn new(inner: Incoming, limits: Arc<BodyLimits>) -> Self {
        GuardedBody {
            inner,
            limits,
            received: 0,
            held: None,
            reserved: false,
            acquiring: None,
            first_wait: None,
            timer: None,
            waiting: false,
        }
    }

    fn held_bytes(&self) -> u64 {
        self.held.as_ref().map_or(0, |p| p.num_permits() as u64)
    }

    /// Makes sure room for `total` bytes of body is held; `Some(bytes)` to wait for.
    fn room_for(&mut self, total: u64) -> Result<Option<u64>, BodyError> {
        let needed = total.saturating_sub(UNBUDGETED_BYTES);
        let missing = needed.saturating_sub(self.held_bytes());
        if missing == 0 {
            return Ok(None);
        }
        if needed > self.limits.budget_bytes {
            return Err(self.busy());
        }
        // `needed` is at most the budget, which fits a u32 (see `HttpConfig::validated`).
        let missing_u32 = u32::try_from(missing).map_err(|_| self.busy())?;
        match self
            .limits
            .budget
            .clone()
            .try_acquire_many_owned(missing_u32)
        {
            Ok(permit) => {
                self.hold(permit);
                Ok(None)
            }
            Err(_) => Ok(Some(missing)),
        }
    }

    fn hold(&mut self, permit: OwnedSemaphorePermit) {
        match &mut self.held {
            Some(held) => held.merge(permit),
            None => self.held = Some(permit),
        }
    }

    fn busy(&self) -> BodyError {
        BodyError::Busy {
            wait: self.limits.wait,
            budget_bytes: self.limits.budget_bytes,
        }
    }

    fn start_acquire(&mut self, bytes: u64, chunk: Option<Frame<Bytes>>) {
        let budget = self.limits.budget.clone();
        let wait = self.limits.wait;
        let bytes = bytes as u32;
        let acquire = async move {
            tokio::time::timeout(wait, budget.acquire_many_owned(bytes))
                .await
                .ok()
                .and_then(Result::ok)
        };
        self.acquiring = Some((Box::pin(acquire), chunk));
    }

    /// The deadline of a wait for data that starts now (or started at the last `Pending`).
    fn deadline(&mut self, now: Instant) -> Instant {
        let limits = &self.limits;
        let first = *self.first_wait.get_or_insert(now);
        let idle = now + limits.idle;
        if limits.bytes_per_second_min == 0 {
            return idle;
        }
        // The next byte is due when the average since the first wait would fall below the rate.
        let due = first
            + limits.rate_grace
            + Duration::from_secs_f64(
                (self.received + 1) as f64 / limits.bytes_per_second_min as f64,
            );
        due.min(idle)
    }

    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                self.waiting = false;
                Poll::Ready(frame.map(|frame| frame.map_err(BodyError::Read)))
            }
            Poll::Pending => {
                if !self.waiting {
                    let now = Instant::now();
                    let deadline = self.deadline(now);
                    match &mut self.timer {
                        Some(timer) => timer.as_mut().reset(deadline),
                        None => self.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
                    }
                    self.waiting = true;
                }
                let timer = self.timer.as_mut().expect("set above");
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(self.timed_out()))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn timed_out(&mut self) -> BodyError {
        let limits = &self.limits;
        let now = Instant::now();
        let first = self.first_wait.unwrap_or(now);
        let since_first = now.saturating_duration_since(first);
        if limits.bytes_per_second_min > 0 && since_first >= limits.rate_grace {
            let rate = self.received as f64 / since_first.as_secs_f64().max(1e-3);
            if rate < limits.bytes_per_second_min as f64 {
                return BodyError::Timeout(format!(
                    "{} bytes in {:.1} s, below the minimum of {} bytes/s",
                    self.received,
                    since_first.as_secs_f64(),
                    limits.bytes_per_second_min
                ));
            }
        }
        BodyError::Timeout(format!(
            "no data for {} s: the client stalled",
            limits.idle.as_secs_f64()
        ))
    }
}

impl Body for GuardedBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        loop {
            if let Some((acquire, _)) = &mut this.acquiring {
                let Poll::Ready(permit) = acquire.as_mut().poll(cx) else {
                    return Poll::Pending;
                };
                let (_, chunk) = this.acquiring.take().expect("polled above");
                let Some(permit) = permit else {
                    return Poll::Ready(Some(Err(this.busy())));
                };
                this.hold(permit);
                if let Some(chunk) = chunk {
                    return Poll::Ready(Some(Ok(chunk)));
                }
            }
            if !this.reserved {
                this.reserved = true;
                if let Some(declared) = this.inner.size_hint().exact() {
                    match this.room_for(declared) {
                        Ok(None) => {}
                        Ok(Some(missing)) => {
                            this.start_acquire(missing, None);
                            continue;
                        }
                        Err(error) => return Poll::Ready(Some(Err(error))),
                    }
                }
            }
            let frame = match this.poll_data(cx) {
                Poll::Ready(Some(Ok(frame))) => frame,
                other => return other,
            };
            let len = frame.data_ref().map_or(0, |d| d.len() as u64);
            this.received += len;
            match this.room_for(this.received) {
                Ok(None) => return Poll::Ready(Some(Ok(frame))),
                Ok(Some(missing)) => this.start_acquire(missing, Some(frame)),
                Err(error) => return Poll::Ready(Some(Err(error))),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.acquiring.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
