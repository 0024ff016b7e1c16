//! `ferrymq verify` on a partition log written with the storage crate: clean, then one damaged
//! byte, then a directory that does not exist.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{temp_dir, BIN};
use ferrymq_storage::{FileStorage, LogConfig, PartitionLog};

fn verify(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut command = Command::new(BIN);
    command
        .arg("verify")
        .args(args)
        .env_remove("FERRYMQ_DATA_DIR");
    command.env_remove("FERRYMQ_CONFIG");
    for (k, v) in envs {
        command.env(k, v);
    }
    command.output().unwrap()
}

fn write_log(dir: &Path) {
    let config = LogConfig {
        segment_bytes_max: 1024,
        index_interval_bytes: 128,
        ..LogConfig::default()
    };
    let (mut log, _) = PartitionLog::open(FileStorage::new(), dir, config).unwrap();
    for i in 0..50u64 {
        let record = format!("message number {i}");
        log.append(&[(1_700_000_000_000 + i, record.as_bytes())])
            .unwrap();
    }
    log.sync().unwrap();
}

#[test]
fn verify_reports_a_clean_log_then_a_damaged_byte_with_file_and_position() {
    let data = temp_dir("verify");
    let partition = data.join("orders").join("0");
    write_log(&partition);
    let data_arg = data.to_str().unwrap();

    let clean = verify(&["--data-dir", data_arg], &[]);
    let stdout = String::from_utf8_lossy(&clean.stdout);
    assert_eq!(clean.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("partition orders/0"), "{stdout}");
    assert!(stdout.contains("50 entries"), "{stdout}");
    assert!(stdout.contains("clean"), "{stdout}");

    // The same through the environment, as JSON.
    let json = verify(&["--json"], &[("FERRYMQ_DATA_DIR", data_arg)]);
    assert_eq!(json.status.code(), Some(0));
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(value["clean"], true);
    assert_eq!(value["partitions"][0]["entries"], 50);

    // One byte of the second entry's record.
    let segment = partition.join(format!("{:020}.log", 0));
    let mut bytes = std::fs::read(&segment).unwrap();
    let second = 24 + "message number 0".len();
    bytes[second + 30] ^= 0x20;
    std::fs::write(&segment, &bytes).unwrap();
    let before = std::fs::read(&segment).unwrap();

    let damaged = verify(&["--data-dir", data_arg], &[]);
    let stdout = String::from_utf8_lossy(&damaged.stdout);
    assert_eq!(damaged.status.code(), Some(1), "{stdout}");
    let expected = format!("{} at byte {second}", segment.display());
    assert!(stdout.contains(&expected), "{stdout}");
    assert!(stdout.contains("checksum mismatch"), "{stdout}");
    assert_eq!(before, std::fs::read(&segment).unwrap(), "verify wrote");

    let json = verify(&["--data-dir", data_arg, "--json"], &[]);
    assert_eq!(json.status.code(), Some(1));
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let finding = &value["partitions"][0]["findings"][0];
    assert_eq!(finding["kind"], "corrupt-entry");
    assert_eq!(finding["file"], segment.display().to_string());
    assert_eq!(finding["position"], second as u64);

    let nope = data.join("nope");
    let missing = verify(&["--data-dir", nope.to_str().unwrap()], &[]);
    assert_eq!(missing.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(stderr.contains(nope.to_str().unwrap()), "{stderr}");
    let missing = verify(&["--data-dir", nope.to_str().unwrap(), "--json"], &[]);
    assert_eq!(missing.status.code(), Some(2));
    let value: serde_json::Value = serde_json::from_slice(&missing.stdout).unwrap();
    assert!(value["error"].is_string(), "{value}");
    std::fs::remove_dir_all(&data).unwrap();
}

#[test]
fn verify_help_states_exit_codes_and_what_it_verifies() {
    let output = Command::new(BIN)
        .args(["verify", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success());
    assert!(help.contains("written by the storage layer"), "{help}");
    assert!(help.contains("1 when any damage was found"), "{help}");
}
