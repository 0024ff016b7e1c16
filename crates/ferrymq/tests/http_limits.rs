//! The HTTP listener's bounds on request bodies, against a real `ferrymq serve`: many stalled
//! uploads do not grow the broker's memory past the body budget (RSS read from
//! `/proc/<pid>/status`), a raw body above the message limit is refused from its declared length,
//! and a body that trickles in slower than the minimum rate is answered 408 and closed.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{http, temp_dir, Served};
use serde_json::Value;

/// The broker's default budget of buffered request body bytes (`BUFFERED_BYTES_DEFAULT`).
const BUDGET_BYTES: u64 = 128 << 20;

/// Resident memory of a process, in bytes.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS in /proc/<pid>/status");
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// Reads one response's head and as much body as arrives before `timeout`; `None` if nothing
/// came.
fn read_answer(stream: &mut TcpStream, timeout: Duration) -> Option<(u16, String)> {
    stream.set_read_timeout(Some(timeout)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
                    let length = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length: "))
                        .and_then(|n| n.trim().parse::<usize>().ok());
                    if length.is_some_and(|n| got.len() >= end + 4 + n) {
                        break;
                    }
                }
            }
            Err(_) => break,
        }
    }
    if got.is_empty() {
        return None;
    }
    let text = String::from_utf8_lossy(&got).to_string();
    let status = text.split(' ').nth(1)?.parse().ok()?;
    Some((status, text))
}

fn error_code(answer: &str) -> String {
    let body = &answer[answer.find("\r\n\r\n").unwrap() + 4..];
    let value: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"));
    value["error"]["code"].as_str().unwrap().to_string()
}

#[test]
fn stalled_uploads_stay_within_the_body_budget() {
    let dir = temp_dir("http-budget");
    let mut served = Served::start(
        &[
            "--tcp-addr",
            "127.0.0.1:0",
            "--data-dir",
            dir.to_str().unwrap(),
        ],
        &[],
    );
    let addr = served.http_addr();
    let pid = served.child.id();

    // A raw body is one message: above the message limit it is refused before it is sent.
    let mut raw = TcpStream::connect(addr).unwrap();
    raw.write_all(
        b"POST /topics/big/messages HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/octet-stream\r\ncontent-length: 16777216\r\n\r\n",
    )
    .unwrap();
    let (status, answer) = read_answer(&mut raw, Duration::from_secs(5)).expect("an answer");
    assert_eq!(status, 413, "{answer}");
    assert_eq!(error_code(&answer), "message_too_large");

    // Uploads of 8 MiB JSON bodies that stop one byte short: far more than the budget holds.
    let uploads = 40u64;
    let body_bytes = 8u64 << 20;
    let rss_before = rss_bytes(pid);
    let peak = Arc::new(AtomicU64::new(rss_before));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (peak, sampling) = (peak.clone(), sampling.clone());
        std::thread::spawn(move || {
            while sampling.load(Relaxed) {
                peak.fetch_max(rss_bytes(pid), Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let threads: Vec<_> = (0..uploads)
        .map(|_| std::thread::spawn(move || stalled_upload(addr, body_bytes)))
        .collect();
    let mut stalled = Vec::new();
    let mut refused = 0;
    for thread in threads {
        let (stream, answer) = thread.join().unwrap();
        match answer {
            None => stalled.push(stream),
            Some((status, answer)) => {
                assert_eq!(status, 503, "{answer}");
                assert_eq!(error_code(&answer), "server_busy", "{answer}");
                assert!(answer.to_ascii_lowercase().contains("retry-after: 1"));
                refused += 1;
            }
        }
    }
    // What the admitted uploads sent has reached the broker by now.
    std::thread::sleep(Duration::from_millis(500));
    peak.fetch_max(rss_bytes(pid), Relaxed);
    sampling.store(false, Relaxed);
    sampler.join().unwrap();
    let grown = peak.load(Relaxed).saturating_sub(rss_before);
    eprintln!(
        "RSS grew by {} MiB: {} uploads stalled, {refused} refused",
        grown >> 20,
        stalled.len()
    );
    let admitted_max = BUDGET_BYTES / (body_bytes - 16 * 1024);
    assert!(
        stalled.len() as u64 <= admitted_max,
        "{} uploads admitted at once, the budget holds {admitted_max}",
        stalled.len()
    );
    assert_eq!(stalled.len() as u64 + refused, uploads);
    assert!(
        grown < BUDGET_BYTES + (48 << 20),
        "RSS grew by {} MiB with {} uploads stalled ({} refused)",
        grown >> 20,
        stalled.len(),
        refused
    );

    // Once the stalled uploads go away, their room is free again: a full 8 MiB batch is stored.
    drop(stalled);
    let messages: Vec<Value> = (0..40)
        .map(|_| serde_json::json!({"body": "m".repeat(200 * 1024)}))
        .collect();
    let batch = serde_json::json!({ "messages": messages }).to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = http(
            addr,
            "POST",
            "/topics/after/messages",
            &[("Content-Type", "application/json")],
            batch.as_bytes(),
        );
        if status == 201 {
            break;
        }
        assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
        assert!(
            Instant::now() < deadline,
            "the budget's room never came back"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(served);
    let _ = std::fs::remove_dir_all(dir);
}

/// Sends a JSON publish's head declaring `body_bytes`, then all of the body but its last byte;
/// returns the connection and the answer, if one came within a second of the last write.
fn stalled_upload(addr: SocketAddr, body_bytes: u64) -> (TcpStream, Option<(u16, String)>) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_write_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let head = format!(
        "POST /topics/stall/messages HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {body_bytes}\r\n\r\n{{\"body\": \""
    );
    let mut left = body_bytes - 10 - 1;
    let piece = vec![b'x'; 64 * 1024];
    // A refused upload is answered and closed while it writes: the write fails, and the answer
    // is read below.
    if stream.write_all(head.as_bytes()).is_ok() {
        while left > 0 {
            let n = left.min(piece.len() as u64) as usize;
            if stream.write_all(&piece[..n]).is_err() {
                break;
            }
            left -= n as u64;
        }
    }
    let answer = read_answer(&mut stream, Duration::from_secs(1));
    (stream, answer)
}

#[test]
fn a_body_trickling_in_below_the_minimum_rate_is_answered_408_and_closed() {
    let dir = temp_dir("http-trickle");
    let mut served = Served::start(
        &[
            "--tcp-addr",
            "127.0.0.1:0",
            "--data-dir",
            dir.to_str().unwrap(),
        ],
        &[],
    );
    let addr = served.http_addr();
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .write_all(
            b"POST /topics/slow/messages HTTP/1.1\r\nhost: localhost\r\ncontent-type: text/plain\r\ncontent-length: 100000\r\n\r\n",
        )
        .unwrap();
    let started = Instant::now();
    // A byte every 200 ms: never idle for long, far below the minimum rate.
    let mut writer = stream.try_clone().unwrap();
    let trickle = std::thread::spawn(move || {
        while started.elapsed() < Duration::from_secs(15) {
            if writer.write_all(b"x").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    let (status, answer) =
        read_answer(&mut stream, Duration::from_secs(15)).expect("an answer before 15 s");
    let elapsed = started.elapsed();
    assert_eq!(status, 408, "{answer}");
    assert_eq!(error_code(&answer), "request_timeout");
    assert!(answer.contains("minimum"), "{answer}");
    // The default grace is 5 s: the answer comes once it is over, not at the 30 s idle timeout.
    assert!(
        elapsed >= Duration::from_secs(4) && elapsed < Duration::from_secs(10),
        "answered after {elapsed:?}"
    );
    // And the connection is closed.
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut rest = Vec::new();
    let closed = match stream.read_to_end(&mut rest) {
        Ok(_) => true,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    };
    assert!(closed, "the connection stayed open");
    trickle.join().unwrap();
    let (status, body) = http(addr, "GET", "/topics/slow", &[], b"");
    // Nothing was stored: the topic was never created by the failed publish.
    assert_eq!(status, 404, "{}", String::from_utf8_lossy(&body));
    drop(served);
    let _ = std::fs::remove_dir_all(dir);
}
