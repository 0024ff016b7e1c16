//! The HTTP listener while the broker recovers its data dir. Recovery of a large data dir takes
//! a while, and a closed port during it reads as a dead broker to a probe. So the listener is
//! bound first and answers from here: `/livez` 200, `/readyz` 503 with the recovery's progress,
//! and every other route 503 with `Retry-After`. Once the broker is open the same listener is
//! handed to [`crate::HttpServer::bind_listener`]: the port never closes in between.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What `/readyz` says of the recovery in progress (a JSON object).
pub type Progress = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

/// Seconds a client is asked to wait before trying again.
const RETRY_AFTER_S: &str = "2";

/// The listener, answering while the broker starts.
pub struct StartingHttp {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<TcpListener>,
}

impl StartingHttp {
    /// Binds `addr` (as the real server would, with a `backlog` long accept queue) and answers
    /// on it until [`StartingHttp::finish`].
    pub fn listen(addr: SocketAddr, backlog: usize, progress: Progress) -> io::Result<Self> {
        let listener = crate::listen(addr, backlog)?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(answer(listener, stopped, progress));
        Ok(StartingHttp { addr, stop, task })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops answering and hands the listener back, still bound (connections waiting in its
    /// queue stay there for the real server).
    pub async fn finish(self) -> io::Result<TcpListener> {
        let _ = self.stop.send(true);
        self.task.await.map_err(io::Error::other)
    }
}

async fn answer(
    listener: TcpListener,
    mut stopped: watch::Receiver<bool>,
    progress: Progress,
) -> TcpListener {
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    tracing::debug!(%error, "accept failed during start-up");
                    continue;
                }
            },
            _ = stopped.wait_for(|stop| *stop) => return listener,
        };
        let progress = progress.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                let response = respond(request.uri().path(), &progress);
                async move { Ok::<_, Infallible>(response) }
            });
            // One answer per connection: the next request goes to the real server.
            let _ = http1::Builder::new()
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn respond(path: &str, progress: &Progress) -> hyper::Response<Full<Bytes>> {
    let (status, body) = match path {
        "/livez" => (200, serde_json::json!({"status": "alive"})),
        "/readyz" => (
            503,
            serde_json::json!({"status": "starting", "reason": "recovering the data dir", "recovery": progress()}),
        ),
        _ => (
            503,
            serde_json::json!({"error": {
                "code": "starting",
                "message": "the broker is recovering its data dir and serves once it is done; retry shortly (GET /readyz shows the progress)",
            }}),
        ),
    };
    let mut response = hyper::Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::CONNECTION, "close");
    if status == 503 {
        response = response.header(http::header::RETRY_AFTER, RETRY_AFTER_S);
    }
    response
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a valid response")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_not_ready_and_every_other_route_asked_to_retry() {
        let progress: Progress = Arc::new(|| serde_json::json!({"elapsed_ms": 7}));
        let live = respond("/livez", &progress);
        assert_eq!(live.status(), 200);
        assert!(live.headers().get(http::header::RETRY_AFTER).is_none());
        let ready = respond("/readyz", &progress);
        assert_eq!(ready.status(), 503);
        assert_eq!(ready.headers()[http::header::RETRY_AFTER], RETRY_AFTER_S);
        for path in ["/topics", "/topics/t/messages", "/"] {
            let other = respond(path, &progress);
            assert_eq!(other.status(), 503, "{path}");
            assert_eq!(other.headers()[http::header::RETRY_AFTER], RETRY_AFTER_S);
            assert_eq!(
                other.headers()[http::header::CONTENT_TYPE],
                "application/json"
            );
        }
    }
}
