//! The uevent parser never panics on any datagram.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(ev) = sked_agent::uevent::parse(data) {
        let _ = ev.is_sched_ext();
    }
});
