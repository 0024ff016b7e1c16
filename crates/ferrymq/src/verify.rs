//! `ferrymq verify`: checks every partition log under a data directory offline and read-only,
//! with `ferrymq_storage::verify_partition`, and prints what it found.
//!
//! Exit status: 0 when everything is clean, 1 when any damage was found, 2 on a usage or I/O
//! error (clap already exits 2 on usage errors).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use ferrymq_storage::{verify_partition, FileStorage, VerifyReport};

/// How deep under the data directory partition directories are looked for.
const DEPTH_MAX: usize = 8;

#[derive(Args, Debug)]
#[command(
    after_help = "Exit status: 0 when every partition is clean, 1 when any damage was found, \
        2 on a usage or I/O error (including a data directory that cannot be read)."
)]
pub struct VerifyArgs {
    /// Data directory to verify [default: the data_dir of --config, else ./ferrymq-data]
    #[arg(long, env = "FERRYMQ_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// TOML settings file of `ferrymq serve`; only its data_dir is used.
    #[arg(long, env = "FERRYMQ_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

const EXIT_DAMAGE: u8 = 1;
const EXIT_ERROR: u8 = 2;

pub fn run(args: VerifyArgs) -> ExitCode {
    let data_dir = match resolve_data_dir(&args) {
        Ok(dir) => dir,
        Err(error) => return fail(&args, None, &format!("{error:#}")),
    };
    let mut partitions = Vec::new();
    if let Err(error) = find_partitions(&data_dir, 0, &mut partitions) {
        let message = format!(
            "cannot search data directory {}: {error}",
            data_dir.display()
        );
        return fail(&args, Some(&data_dir), &message);
    }
    partitions.sort();
    let storage = FileStorage::new();
    let results: Vec<(PathBuf, std::io::Result<VerifyReport>)> = partitions
        .into_iter()
        .map(|dir| {
            let result = verify_partition(&storage, &dir);
            (dir, result)
        })
        .collect();

    let errors = results.iter().filter(|(_, r)| r.is_err()).count();
    let damaged = results
        .iter()
        .filter(|(_, r)| r.as_ref().is_ok_and(|r| !r.is_clean()))
        .count();
    if args.json {
        println!("{}", json(&data_dir, &results, damaged, errors));
    } else {
        print_text(&data_dir, &results, damaged, errors);
    }
    if errors > 0 {
        ExitCode::from(EXIT_ERROR)
    } else if damaged > 0 {
        ExitCode::from(EXIT_DAMAGE)
    } else {
        ExitCode::SUCCESS
    }
}

/// Reports an error that stopped the check before any partition was verified; exit status 2.
fn fail(args: &VerifyArgs, data_dir: Option<&Path>, message: &str) -> ExitCode {
    eprintln!("error: {message}");
    if args.json {
        let data_dir = data_dir.map(|d| d.display().to_string());
        println!(
            "{}",
            serde_json::json!({ "data_dir": data_dir, "clean": false, "error": message })
        );
    }
    ExitCode::from(EXIT_ERROR)
}

/// `--data-dir` or `FERRYMQ_DATA_DIR`, then the config file's `data_dir`, then the default: the
/// same precedence as `ferrymq serve`.
fn resolve_data_dir(args: &VerifyArgs) -> anyhow::Result<PathBuf> {
    if let Some(dir) = &args.data_dir {
        return Ok(dir.clone());
    }
    if let Some(path) = &args.config {
        if let Some(dir) = crate::config::data_dir_from_file(path)? {
            return Ok(dir);
        }
    }
    Ok(PathBuf::from(ferrymq_server::DATA_DIR_DEFAULT))
}

fn is_segment_file_name(name: &str) -> bool {
    name.strip_suffix(".log")
        .is_some_and(|stem| stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()))
}

/// Collects the directories at or under `dir` (at most `DEPTH_MAX` levels down) that hold
/// segment files. Symbolic links are not followed, so a link cycle cannot loop.
fn find_partitions(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut has_segment = false;
    let mut subdirs = Vec::new();
    let with_path = |error: std::io::Error| {
        std::io::Error::new(error.kind(), format!("{}: {error}", dir.display()))
    };
    for entry in std::fs::read_dir(dir).map_err(with_path)? {
        let entry = entry.map_err(with_path)?;
        let file_type = entry.file_type().map_err(with_path)?;
        if file_type.is_dir() {
            subdirs.push(entry.path());
        } else if file_type.is_file()
            && entry.file_name().to_str().is_some_and(is_segment_file_name)
        {
            has_segment = true;
        }
    }
    if has_segment {
        out.push(dir.to_path_buf());
    }
    if depth < DEPTH_MAX {
        for subdir in subdirs {
            find_partitions(&subdir, depth + 1, out)?;
        }
    }
    Ok(())
}

fn name_of(data_dir: &Path, dir: &Path) -> String {
    match dir.strip_prefix(data_dir) {
        Ok(relative) if !relative.as_os_str().is_empty() => relative.display().to_string(),
        _ => ".".to_string(),
    }
}

fn print_text(
    data_dir: &Path,
    results: &[(PathBuf, std::io::Result<VerifyReport>)],
    damaged: usize,
    errors: usize,
) {
    println!("verifying {}", data_dir.display());
    if results.is_empty() {
        println!("no partition logs (directories with segment files) found");
    }
    for (dir, result) in results {
        let name = name_of(data_dir, dir);
        match result {
            Err(error) => println!("partition {name}: ERROR: {error}"),
            Ok(report) => {
                let verdict = if report.is_clean() {
                    "clean".to_string()
                } else {
                    format!("DAMAGED, {} findings", report.findings.len())
                };
                println!(
                    "partition {name}: {} segments, {} entries, {} bytes, offsets {}..{}: {verdict}",
                    report.segments_count,
                    report.entries_count,
                    report.bytes,
                    report.start_offset,
                    report.next_offset
                );
                for finding in &report.findings {
                    let repair = if finding.kind.repaired_on_open() {
                        "open repairs this"
                    } else {
                        "open does not repair this"
                    };
                    println!("  [{}, {repair}] {finding}", finding.kind.as_str());
                }
            }
        }
    }
    println!(
        "{} partitions: {} clean, {damaged} damaged, {errors} unreadable",
        results.len(),
        results.len() - damaged - errors
    );
}

fn json(
    data_dir: &Path,
    results: &[(PathBuf, std::io::Result<VerifyReport>)],
    damaged: usize,
    errors: usize,
) -> serde_json::Value {
    let partitions: Vec<serde_json::Value> = results
        .iter()
        .map(|(dir, result)| match result {
            Err(error) => serde_json::json!({
                "dir": dir.display().to_string(),
                "name": name_of(data_dir, dir),
                "error": error.to_string(),
            }),
            Ok(report) => serde_json::json!({
                "dir": dir.display().to_string(),
                "name": name_of(data_dir, dir),
                "clean": report.is_clean(),
                "segments": report.segments_count,
                "entries": report.entries_count,
                "bytes": report.bytes,
                "start_offset": report.start_offset,
                "next_offset": report.next_offset,
                "findings": report.findings.iter().map(|f| serde_json::json!({
                    "kind": f.kind.as_str(),
                    "file": f.file.display().to_string(),
                    "position": f.position,
                    "description": f.description,
                    "repaired_on_open": f.kind.repaired_on_open(),
                })).collect::<Vec<_>>(),
            }),
        })
        .collect();
    serde_json::json!({
        "data_dir": data_dir.display().to_string(),
        "clean": damaged == 0 && errors == 0,
        "partitions_count": results.len(),
        "damaged_count": damaged,
        "error_count": errors,
        "partitions": partitions,
    })
}
