//! A partition log written by FerryMQ, then damaged by arbitrary edits of its segment, offset
//! index and time index files (byte flips, overwrites, truncations, deletions), then opened the
//! way the broker opens it after a crash. Opening and reading must never panic and never return
//! data that was not written: every entry read back is the record appended at that offset. A log
//! that opens takes a new append, and a reopen finds it.
//!
//! The input: its first bytes choose how many records to write and their sizes; the rest is a
//! list of edits of 5 bytes each (file, operation, position, value).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ferrymq_storage::fuzzing::log_recovery(data));
