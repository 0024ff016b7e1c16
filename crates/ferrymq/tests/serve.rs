//! `ferrymq serve` as users start it: a real process, configured by flags, environment and file,
//! stopped by signals.

mod common;

use std::process::Command;

use common::{temp_dir, Served, BIN};

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
