//! The sysfs parsers never panic, whatever the kernel (or a broken fs) shows.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = sked_agent::sysfs::parse_events(&text);
    let _ = sked_agent::sysfs::parse_number(&text);
    let _ = sked_agent::sysfs::SchedState::parse(&text);
    let _ = sked_agent::attacher::struct_ops_link(&text);
    let _ = sked_agent::attacher::has_bpf_capability(&text);
});
