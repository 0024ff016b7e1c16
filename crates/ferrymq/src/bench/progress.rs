//! The progress bar on stderr.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::args::BenchArgs;
use super::{Shared, PROGRESS_INTERVAL};

/// The progress bar on stderr, redrawn from the shared counters by its own task.
pub(super) struct Progress {
    bar: ProgressBar,
    done: Arc<AtomicBool>,
}

impl Progress {
    pub(super) fn start(args: &BenchArgs, total: Option<u64>, shared: Arc<Shared>) -> Progress {
        let hidden = args.json || !std::io::stderr().is_terminal();
        let done = Arc::new(AtomicBool::new(false));
        if hidden {
            return Progress {
                bar: ProgressBar::hidden(),
                done,
            };
        }
        let length = match (total, args.duration) {
            (Some(total), _) => total,
            (None, Some(duration)) => duration.as_millis() as u64,
            (None, None) => 0,
        };
        let bar =
            ProgressBar::with_draw_target(Some(length), ProgressDrawTarget::stderr_with_hz(5));
        if let Ok(style) =
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {msg}")
        {
            bar.set_style(style);
        }
        let by_count = total.is_some();
        let consumers = args.consumers > 0;
        let started = Instant::now();
        tokio::spawn({
            let bar = bar.clone();
            let done = done.clone();
            async move {
                let mut last = (Instant::now(), 0u64, 0u64);
                // Bounded by `done`, set when the run ends.
                while !done.load(Ordering::Relaxed) {
                    tokio::time::sleep(PROGRESS_INTERVAL).await;
                    let published = shared.published.load(Ordering::Relaxed);
                    let delivered = shared.delivered.load(Ordering::Relaxed);
                    let seconds = last.0.elapsed().as_secs_f64().max(1e-3);
                    let publish_rate = (published - last.1) as f64 / seconds;
                    let deliver_rate = (delivered - last.2) as f64 / seconds;
                    last = (Instant::now(), published, delivered);
                    bar.set_position(match (by_count, consumers) {
                        (true, true) => delivered,
                        (true, false) => published,
                        (false, _) => started.elapsed().as_millis() as u64,
                    });
                    bar.set_message(format!(
                        "published {published} ({}/s)  delivered {delivered} ({}/s)",
                        human_count(publish_rate),
                        human_count(deliver_rate)
                    ));
                }
            }
        });
        Progress { bar, done }
    }

    pub(super) fn finish(self) {
        self.done.store(true, Ordering::Relaxed);
        self.bar.finish_and_clear();
    }
}

fn human_count(value: f64) -> String {
    if value >= 1e6 {
        format!("{:.2} M", value / 1e6)
    } else if value >= 1e3 {
        format!("{:.1} k", value / 1e3)
    } else {
        format!("{value:.0}")
    }
}
