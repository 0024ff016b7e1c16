//! `ferrymq serve` as users start it: a real process, configured by flags, environment and file,
//! stopped by signals.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ferrymq");

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferrymq-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A running `ferrymq serve` whose log lines are collected.
struct Served {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Served {
    fn start(args: &[&str], envs: &[(&str, &str)]) -> Served {
        let mut command = Command::new(BIN);
        command
            .arg("serve")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in envs {
            command.env(k, v);
        }
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
    fn wait_for(&mut self, needle: &str) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
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

    fn tcp_addr(&mut self) -> SocketAddr {
        let line = self.wait_for("serving the binary protocol");
        let at = line.find("tcp=").expect("tcp= field") + 4;
        line[at..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
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

#[test]
fn serves_on_defaults_from_env_and_stops_cleanly_on_sigterm() {
    let dir = temp_dir("sigterm");
    let data = dir.join("data");
    let mut served = Served::start(
        &[],
        &[
            ("FERRYMQ_TCP_ADDR", "127.0.0.1:0"),
            ("FERRYMQ_DATA_DIR", data.to_str().unwrap()),
        ],
    );
    let addr = served.tcp_addr();
    assert!(addr.ip().is_loopback());
    served.wait_for("loopback only");
    assert!(data.is_dir(), "the data directory is created");
    std::net::TcpStream::connect(addr).expect("the port accepts connections");
    served.signal("TERM");
    served.wait_for("SIGTERM received");
    served.wait_for("shutdown complete");
    assert_eq!(served.wait_exit().code(), Some(0));
}

#[test]
fn sigint_also_stops_it_with_exit_code_zero() {
    let dir = temp_dir("sigint");
    let mut served = Served::start(
        &[
            "--tcp-addr",
            "127.0.0.1:0",
            "--data-dir",
            dir.to_str().unwrap(),
        ],
        &[],
    );
    served.tcp_addr();
    served.signal("INT");
    served.wait_for("shutdown complete");
    assert_eq!(served.wait_exit().code(), Some(0));
}

#[test]
fn flags_override_environment_which_overrides_the_file() {
    let dir = temp_dir("precedence");
    let file = dir.join("ferrymq.toml");
    std::fs::write(
        &file,
        format!(
            "tcp_addr = \"127.0.0.1:1\"\ndata_dir = \"{}\"\nlog = \"debug\"\n",
            dir.join("from-file").display()
        ),
    )
    .unwrap();
    // The file says port 1 and a data dir; the environment overrides the port with 0 (any free
    // port); a flag overrides the log level. The data dir comes from the file.
    let mut served = Served::start(
        &["--config", file.to_str().unwrap(), "--log", "info"],
        &[("FERRYMQ_TCP_ADDR", "127.0.0.1:0")],
    );
    let addr = served.tcp_addr();
    assert_ne!(addr.port(), 1);
    assert!(dir.join("from-file").is_dir());
    served.signal("TERM");
    served.wait_for("shutdown complete");
    assert!(
        !served.seen.iter().any(|l| l.contains("DEBUG")),
        "the flag's log level won over the file's"
    );
    assert_eq!(served.wait_exit().code(), Some(0));
}

#[test]
fn refuses_non_loopback_without_insecure_and_bad_config_clearly() {
    let output = Command::new(BIN)
        .args(["serve", "--tcp-addr", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("without authentication") && stderr.contains("--insecure"),
        "{stderr}"
    );

    let dir = temp_dir("badconfig");
    let file = dir.join("bad.toml");
    std::fs::write(&file, "tcp_adr = \"127.0.0.1:0\"\n").unwrap();
    let output = Command::new(BIN)
        .args(["serve", "--config", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("tcp_adr"),
        "the unknown key is named: {stderr}"
    );
}
