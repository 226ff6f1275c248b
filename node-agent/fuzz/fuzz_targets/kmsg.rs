//! The kernel log parser never panics on any record, and the exit it keeps is always capped.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sked_agent::kmsg::{Tracker, parse_record};

fuzz_target!(|data: &[u8]| {
    let mut tracker = Tracker::default();
    for raw in data.split(|b| *b == 0) {
        if let Some(record) = parse_record(raw) {
            let _ = tracker.feed(&record, 0);
        }
    }
    if let Some(exit) = tracker.last() {
        assert!(exit.reason.chars().count() <= 200 && exit.detail.chars().count() <= 300, "capped");
    }
});
