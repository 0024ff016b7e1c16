//! A real `ferrymq serve` process for the binary's tests.
#![allow(dead_code)]

pub mod authority;
pub mod cluster;
pub mod proxy;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub const BIN: &str = env!("CARGO_BIN_EXE_ferrymq");

pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferrymq-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The standard output of a command that must have succeeded; its stderr in the failure.
pub fn ok(output: &Output) -> String {
    assert!(
        output.status.success(),
        "command failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// A running `ferrymq serve` whose log lines are collected.
pub struct Served {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    pub seen: Vec<String>,
}

impl Served {
    pub fn start(args: &[&str], envs: &[(&str, &str)]) -> Served {
        Self::start_with(args, envs, |_| {})
    }

    /// `ferrymq serve` on a free loopback port for the binary protocol (and for HTTP, its
    /// default here), with its data in `dir` and the flags of `extra`.
    pub fn start_in(dir: &std::path::Path, extra: &[&str], envs: &[(&str, &str)]) -> Served {
        let mut args = vec![
            "--tcp-addr",
            "127.0.0.1:0",
            "--data-dir",
            dir.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        Self::start(&args, envs)
    }

    /// [`Served::start`] with another `ferrymq` binary (a release build, say).
    pub fn start_bin(bin: &str, args: &[&str], envs: &[(&str, &str)]) -> Served {
        Self::spawn(bin, args, envs, |_| {})
    }

    /// Like [`Served::start`], with `adjust` applied to the command before it is spawned.
    pub fn start_with(
        args: &[&str],
        envs: &[(&str, &str)],
        adjust: impl FnOnce(&mut Command),
    ) -> Served {
        Self::spawn(BIN, args, envs, adjust)
    }

    fn spawn(
        bin: &str,
        args: &[&str],
        envs: &[(&str, &str)],
        adjust: impl FnOnce(&mut Command),
    ) -> Served {
        let mut command = Command::new(bin);
        command
            .arg("serve")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            // A free port for the HTTP listener, so that brokers of parallel tests do not meet on
            // the default one (a test's own flag or environment wins).
            .env("FERRYMQ_HTTP_ADDR", "127.0.0.1:0");
        for (k, v) in envs {
            command.env(k, v);
        }
        adjust(&mut command);
        let mut child = command.spawn().expect("spawn ferrymq serve");
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Served {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits (bounded) for a log line containing `needle` and returns it.
    pub fn wait_for(&mut self, needle: &str) -> String {
        self.wait_for_within(needle, Duration::from_secs(20))
    }

    /// Waits up to `limit` for a log line containing `needle` and returns it.
    pub fn wait_for_within(&mut self, needle: &str, limit: Duration) -> String {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no log line with '{needle}' in time; saw:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// The log lines written so far, collected into `seen`.
    pub fn collect(&mut self) -> &[String] {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
        &self.seen
    }

    pub fn tcp_addr(&mut self) -> SocketAddr {
        self.tcp_addr_within(Duration::from_secs(20))
    }

    /// The binary protocol's address, waiting up to `limit` for the broker to listen.
    pub fn tcp_addr_within(&mut self, limit: Duration) -> SocketAddr {
        let line = self.wait_for_within("serving the binary protocol", limit);
        let at = line.find("tcp=").expect("tcp= field") + 4;
        line[at..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }

    /// The HTTP listener's address, from the "serving HTTP" log line.
    pub fn http_addr(&mut self) -> SocketAddr {
        let line = self.wait_for("serving HTTP");
        let at = line.find("http=").expect("http= field") + 5;
        line[at..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }

    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        self.wait_exit_within(Duration::from_secs(20))
    }

    /// Waits up to `limit` for the broker to exit.
    pub fn wait_exit_within(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "ferrymq serve did not exit in time"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request on its own connection; returns the status and the body.
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Vec<u8>) {
    let (status, _, body) = http_with_head(addr, method, path, headers, body);
    (status, body)
}

/// As [`http`], with the response's head (status line and headers) as text.
pub fn http_with_head(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, Vec<u8>) {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let end = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete response head");
    let head = String::from_utf8_lossy(&response[..end]).to_string();
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    let mut body = response[end + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    (status, head, body)
}

pub fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n").unwrap();
        let size =
            usize::from_str_radix(std::str::from_utf8(&data[..line_end]).unwrap().trim(), 16)
                .unwrap();
        data = &data[line_end + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

impl Served {
    /// Every log line the process wrote, once it has exited (bounded wait for the last ones).
    pub fn all_lines(&mut self) -> Vec<String> {
        let mut all = std::mem::take(&mut self.seen);
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(2)) {
            all.push(line);
        }
        all
    }
}
