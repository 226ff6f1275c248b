//! Why a scheduler left the kernel, from the kernel log.
//!
//! sysfs forgets why a BPF scheduler was disabled; the kernel says it once, in its log:
//!
//! ```text
//! sched_ext: BPF scheduler "sked_canary" disabled (runnable task stall)
//! sched_ext: sked_canary: sked-stall[158] failed to run for 1.048s
//! ```
//!
//! The first line names the ops and the reason (the kernel's words for the exit kind), the
//! second, printed right after it for errors, the detail. [`parse_record`] reads one `/dev/kmsg`
//! record, [`classify`] recognises sched_ext's lines, and [`Tracker`] folds them into the last
//! [`Exit`] of the node. Pure: [`crate::kernel_watch::follow_kernel_log`] reads `/dev/kmsg`.

use sked_proto::text::{
    MAX_EXIT_REASON_CHARS, MAX_NAME_CHARS, MAX_REASON_CHARS, MAX_TRACE_LINE_CHARS, MAX_TRACE_LINES, escape_and_cap,
};

/// A detail line is taken when it comes within this many records of its `disabled` line
/// (other CPUs may log in between).
const DETAIL_WITHIN_RECORDS: u64 = 16;
/// Largest kmsg record (the kernel's own limit is 1 KiB of text plus the prefix and
/// dictionary).
pub const MAX_RECORD: usize = 8192;

/// Reasons of exits that are not ejections: the scheduler's own user space unregistered it (its
/// process ended or closed the link: a rollout, a deleted pod) or, for a sub-scheduler, its
/// parent went away.
const NORMAL_EXITS: [&str; 2] = ["unregistered from user space", "parent exiting"];

/// The reason of an exit the kernel asks the scheduler's user space to restart from: the kernel
/// itself unregisters a scheduler so when a CPU goes on or off line and the scheduler implements
/// no `cpu_online`/`cpu_offline` (`SCX_ECODE_RSN_HOTPLUG`). The kernel logs it at info level, with
/// no detail line; scx_utils schedulers register again in the same process. Not an ejection: a
/// restart, which the controller waits for (its attach timeout) before it calls it a failure.
pub use sked_proto::text::RESTART_EXIT_REASON as RESTART_EXIT;

/// The kernel's reasons for an exit (`scx_exit_reason()`), counted from zero as soon as the log is
/// followed, so an alert on `increase()` sees the first exit of each.
pub const KNOWN_REASONS: [&str; 8] = [
    "unregistered from user space",
    "unregistered from BPF",
    "unregistered from the main kernel",
    "disabled by sysrq-S",
    "parent exiting",
    "runtime error",
    "scx_bpf_error",
    "runnable task stall",
];

/// One `/dev/kmsg` record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The record's sequence number (per boot).
    pub seq: u64,
    /// Microseconds since boot when it was logged.
    pub micros: u64,
    /// The message, without the continuation (dictionary) lines.
    pub text: String,
}

/// Parses one record as `read(2)` on `/dev/kmsg` returns it: `PRI,SEQ,USEC,FLAGS[,...];TEXT`,
/// then optional ` KEY=VALUE` continuation lines. `None` for anything else, and for records that
/// user space wrote (a write to /dev/kmsg cannot use the kernel's facility, 0): a process on the
/// node cannot forge the kernel's words.
pub fn parse_record(raw: &[u8]) -> Option<Record> {
    let text = String::from_utf8_lossy(raw);
    let (prefix, message) = text.split_once(';')?;
    let mut fields = prefix.split(',');
    let priority = fields.next()?.parse::<u32>().ok()?;
    if priority >> 3 != 0 {
        return None;
    }
    let seq = fields.next()?.parse().ok()?;
    let micros = fields.next()?.parse().ok()?;
    let message = message.split('\n').next().unwrap_or_default();
    Some(Record { seq, micros, text: message.to_owned() })
}

/// Splits a buffer into records: each ends at a newline that no continuation line (` KEY=VALUE`)
/// follows.
pub fn split_records(buf: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = buf;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = rest
            .iter()
            .enumerate()
            .find(|&(i, byte)| *byte == b'\n' && rest.get(i + 1) != Some(&b' '))
            .map_or(rest.len(), |(i, _)| i + 1);
        let (record, tail) = rest.split_at(end);
        rest = tail;
        Some(record)
    })
}

/// A kernel log line of sched_ext.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Line<'a> {
    /// `sched_ext: BPF scheduler "OPS" enabled`
    Enabled { ops: &'a str },
    /// `sched_ext: BPF scheduler "OPS" disabled (REASON)`
    Disabled { ops: &'a str, reason: &'a str },
    /// `sched_ext: OPS: TEXT`, the detail the kernel prints after an error exit.
    Detail { ops: &'a str, text: &'a str },
}

/// Recognises a sched_ext line; `None` for every other line of the log.
pub fn classify(text: &str) -> Option<Line<'_>> {
    let rest = text.strip_prefix("sched_ext: ")?;
    if let Some(named) = rest.strip_prefix("BPF scheduler \"") {
        // Ops names are letters, digits, '_' and '.' (the kernel refuses others).
        let (ops, tail) = named.split_once("\" ")?;
        if tail == "enabled" {
            return Some(Line::Enabled { ops });
        }
        let reason = tail.strip_prefix("disabled (")?.strip_suffix(')')?;
        return Some(Line::Disabled { ops, reason });
    }
    let (ops, text) = rest.split_once(": ")?;
    // An ops name is one word; anything else is another sched_ext message.
    (!ops.is_empty() && !ops.contains(char::is_whitespace)).then_some(Line::Detail { ops, text })
}

/// The last exit of a scheduler on this node, escaped and capped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exit {
    pub ops: String,
    /// The kernel's reason, e.g. `runnable task stall`, `disabled by sysrq-S`.
    pub reason: String,
    /// The kernel's detail line, e.g. which task failed to run and for how long ("" if none).
    pub detail: String,
    /// When the kernel logged it, in milliseconds since the epoch.
    pub at_ms: i64,
    /// The record's sequence number: with `at_ms`, tells one exit from the next.
    pub seq: u64,
    /// Whether the kernel threw the scheduler out (error, stall, SysRq-S, the scheduler's own
    /// exit) rather than its user space unregistering it.
    pub ejected: bool,
    /// Whether the kernel asked the scheduler to restart ([`RESTART_EXIT`]).
    pub restart: bool,
    /// The backtrace the kernel printed after an error exit's lines: records indented by
    /// `stack_trace_print`, within [`DETAIL_WITHIN_RECORDS`] of the exit, at most
    /// [`MAX_TRACE_LINES`].
    pub trace: Vec<String>,
}

/// How long a report of a scheduler that left waits for the kernel log's line that says why
/// (the kernel sets `state` first, then logs the reason) before it is sent without it.
pub const REASON_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// How long an error exit waits for its detail line before it is reported without it.
pub const DETAIL_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// Reasons of error exits, after which the kernel prints a detail line.
const ERROR_REASONS: [&str; 3] = ["runtime error", "scx_bpf_error", "runnable task stall"];

impl Exit {
    /// An error exit whose detail line has not been read yet.
    pub fn awaits_detail(&self) -> bool {
        self.detail.is_empty() && ERROR_REASONS.contains(&self.reason.as_str())
    }
}

/// Whether an exit with the kernel's `reason` is an ejection (see [`Exit::ejected`]): neither a
/// normal exit nor a restart.
pub fn is_ejection(reason: &str) -> bool {
    !NORMAL_EXITS.contains(&reason) && reason != RESTART_EXIT
}

/// Folds sched_ext's log lines into the node's last exit.
#[derive(Debug, Default)]
pub struct Tracker {
    last: Option<Exit>,
}

impl Tracker {
    /// Takes one record logged at `at_ms`. Returns the reason of a new exit (for counting), and
    /// whether the last exit changed (a new one, or its detail).
    pub fn feed(&mut self, record: &Record, at_ms: i64) -> (Option<&str>, bool) {
        match classify(&record.text) {
            Some(Line::Disabled { ops, reason }) => {
                let exit = self.last.insert(Exit {
                    ops: escape_and_cap(ops, MAX_NAME_CHARS),
                    reason: escape_and_cap(reason, MAX_EXIT_REASON_CHARS),
                    detail: String::new(),
                    at_ms,
                    seq: record.seq,
                    ejected: is_ejection(reason),
                    restart: reason == RESTART_EXIT,
                    trace: Vec::new(),
                });
                (Some(exit.reason.as_str()), true)
            }
            None if record.text.starts_with(' ') => {
                // A line of the backtrace the kernel prints after an error exit.
                let Some(exit) = self.last.as_mut() else { return (None, false) };
                let fits = ERROR_REASONS.contains(&exit.reason.as_str())
                    && record.seq > exit.seq
                    && record.seq - exit.seq <= DETAIL_WITHIN_RECORDS + MAX_TRACE_LINES as u64
                    && exit.trace.len() < MAX_TRACE_LINES;
                if fits {
                    exit.trace.push(escape_and_cap(record.text.trim(), MAX_TRACE_LINE_CHARS));
                }
                (None, fits)
            }
            Some(Line::Detail { ops, text }) => {
                let Some(exit) = self.last.as_mut() else { return (None, false) };
                let fits = exit.detail.is_empty()
                    && record.seq > exit.seq
                    && record.seq - exit.seq <= DETAIL_WITHIN_RECORDS
                    && exit.ops == escape_and_cap(ops, MAX_NAME_CHARS);
                if fits {
                    exit.detail = escape_and_cap(text, MAX_REASON_CHARS);
                }
                (None, fits)
            }
            Some(Line::Enabled { .. }) | None => (None, false),
        }
    }

    pub fn last(&self) -> Option<&Exit> {
        self.last.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records as Debian's 7.2.13 cloud kernel wrote them in the VM (`make test-kernel`: the
    /// stalling canary, then SysRq-S), verbatim from /dev/kmsg.
    const SYSRQ: [&[u8]; 3] = [
        b"6,383,5790255,-;sched_ext: BPF scheduler \"sked_canary\" enabled",
        b"6,384,6858137,-;sysrq: Disable sched_ext and revert all tasks to CFS",
        b"6,385,6913881,-;sched_ext: BPF scheduler \"sked_canary\" disabled (disabled by sysrq-S)",
    ];
    const STALL: [&[u8]; 3] = [
        b"6,373,3371648,-;sched_ext: BPF scheduler \"sked_canary\" enabled",
        b"3,374,5425810,-;sched_ext: BPF scheduler \"sked_canary\" disabled (runnable task stall)",
        b"3,375,5427884,-;sched_ext: sked_canary: sked-stall[158] failed to run for 1.048s",
    ];

    fn feed_all(t: &mut Tracker, records: &[&[u8]]) -> Vec<String> {
        let mut reasons = Vec::new();
        for raw in records {
            let record = parse_record(raw).expect("a kmsg record");
            if let (Some(reason), _) = t.feed(&record, 1_000) {
                reasons.push(reason.to_owned());
            }
        }
        reasons
    }

    #[test]
    fn records_are_split_into_sequence_time_and_text() {
        let r = parse_record(b"6,814,42001300,-;hello; world\n KEY=value").unwrap();
        assert_eq!(r, Record { seq: 814, micros: 42_001_300, text: "hello; world".into() });
        assert_eq!(parse_record(b"no prefix"), None);
        assert_eq!(parse_record(b"x,1,2,-;text"), None);
        assert_eq!(parse_record(b"6,1;text"), None);
        // Facility 1 (user): written to /dev/kmsg from user space, not by the kernel.
        assert_eq!(parse_record(b"14,815,42001400,-;sched_ext: BPF scheduler \"x\" disabled (forged)"), None);
    }

    #[test]
    fn a_buffer_of_several_records_is_split_between_them() {
        let buf = b"6,1,1,-;one\n SUBSYSTEM=cpu\n6,2,2,-;two\n6,3,3,-;three";
        let records: Vec<&[u8]> = split_records(buf).collect();
        assert_eq!(records, [&b"6,1,1,-;one\n SUBSYSTEM=cpu\n"[..], b"6,2,2,-;two\n", b"6,3,3,-;three"]);
        assert_eq!(parse_record(records[0]).map(|r| r.text), Some("one".into()));
        assert_eq!(split_records(b"").count(), 0);
    }

    #[test]
    fn sched_ext_lines_are_recognised() {
        assert_eq!(
            classify("sched_ext: BPF scheduler \"rusty_1.0.0\" disabled (scx_bpf_error)"),
            Some(Line::Disabled { ops: "rusty_1.0.0", reason: "scx_bpf_error" })
        );
        assert_eq!(classify("sched_ext: BPF scheduler \"a\" enabled"), Some(Line::Enabled { ops: "a" }));
        assert_eq!(classify("sched_ext: a: it failed"), Some(Line::Detail { ops: "a", text: "it failed" }));
        assert_eq!(classify("sched_ext: ops.init() failed: -12"), None, "not a detail: two words before ':'");
        assert_eq!(classify("sysrq: Disable sched_ext and revert all tasks to CFS"), None);
        assert_eq!(classify("sched_ext: BPF scheduler \"a\" disabled"), None);
    }

    #[test]
    fn sysrq_is_an_ejection_without_detail() {
        let mut t = Tracker::default();
        assert_eq!(feed_all(&mut t, &SYSRQ), vec!["disabled by sysrq-S"]);
        let exit = t.last().unwrap();
        assert_eq!((exit.ops.as_str(), exit.detail.as_str(), exit.seq, exit.ejected), ("sked_canary", "", 385, true));
    }

    #[test]
    fn a_stall_keeps_the_kernel_detail() {
        let mut t = Tracker::default();
        assert_eq!(feed_all(&mut t, &STALL[..2]), vec!["runnable task stall"]);
        assert!(t.last().unwrap().awaits_detail(), "an error exit waits for its detail line");
        feed_all(&mut t, &STALL[2..]);
        let exit = t.last().unwrap();
        assert!(!exit.awaits_detail());
        assert_eq!(exit.reason, "runnable task stall");
        assert_eq!(exit.detail, "sked-stall[158] failed to run for 1.048s");
        assert!(exit.ejected);
    }

    #[test]
    fn unregistration_is_not_an_ejection() {
        let mut t = Tracker::default();
        feed_all(
            &mut t,
            &[b"6,5,100,-;sched_ext: BPF scheduler \"sked_canary\" disabled (unregistered from user space)"],
        );
        assert!(!t.last().unwrap().ejected);
        for reason in ["runtime error", "scx_bpf_error", "runnable task stall", "unregistered from BPF"] {
            assert!(is_ejection(reason), "{reason}");
        }
    }

    #[test]
    fn an_error_exit_keeps_the_kernel_s_backtrace_and_no_other_line() {
        let mut t = Tracker::default();
        feed_all(&mut t, &STALL);
        let trace: Vec<String> =
            (0..20).map(|i| format!("4,{},5427900,-;  scx_watchdog_workfn+0x{i:x}/0x1f0", 376 + i)).collect();
        let raw: Vec<&[u8]> = trace.iter().map(|l| l.as_bytes()).collect();
        feed_all(&mut t, &raw[..3]);
        feed_all(&mut t, &[b"6,400,5428000,-;eth0: link up"]);
        let exit = t.last().unwrap();
        assert_eq!(
            exit.trace,
            ["scx_watchdog_workfn+0x0/0x1f0", "scx_watchdog_workfn+0x1/0x1f0", "scx_watchdog_workfn+0x2/0x1f0"]
        );
        feed_all(&mut t, &raw[3..]);
        assert_eq!(t.last().unwrap().trace.len(), MAX_TRACE_LINES, "bounded");
        // A normal exit keeps none: an indented line after it is someone else's.
        feed_all(
            &mut t,
            &[
                b"6,500,100,-;sched_ext: BPF scheduler \"a\" disabled (unregistered from user space)",
                b"4,501,100,-;  other+0x1/0x2",
            ],
        );
        assert!(t.last().unwrap().trace.is_empty());
    }

    #[test]
    fn a_cpu_going_off_line_asks_for_a_restart_not_an_ejection() {
        // As the kernel logs its own unregistration on a hotplug (info level, no detail line).
        let mut t = Tracker::default();
        feed_all(
            &mut t,
            &[b"6,7,100,-;sched_ext: BPF scheduler \"bpfland_1.1.4\" disabled (unregistered from the main kernel)"],
        );
        let exit = t.last().unwrap();
        assert_eq!((exit.ejected, exit.restart, exit.awaits_detail()), (false, true, false));
        assert!(!is_ejection(RESTART_EXIT));
    }

    #[test]
    fn a_detail_belongs_only_to_the_exit_just_before_it() {
        let mut t = Tracker::default();
        let far = b"3,100,1,-;sched_ext: BPF scheduler \"a\" disabled (runtime error)".as_slice();
        feed_all(&mut t, &[far, b"3,200,2,-;sched_ext: a: too late".as_slice()]);
        assert_eq!(t.last().unwrap().detail, "", "too many records later");
        feed_all(&mut t, &[b"3,201,3,-;sched_ext: BPF scheduler \"a\" disabled (runtime error)".as_slice()]);
        feed_all(&mut t, &[b"3,202,3,-;sched_ext: b: another scheduler".as_slice()]);
        assert_eq!(t.last().unwrap().detail, "", "another ops name");
        feed_all(&mut t, &[b"3,203,3,-;sched_ext: a: first".as_slice(), b"3,204,3,-;sched_ext: a: second".as_slice()]);
        assert_eq!(t.last().unwrap().detail, "first", "only the first detail line");
        let mut fresh = Tracker::default();
        feed_all(&mut fresh, &[b"3,1,1,-;sched_ext: a: no exit yet".as_slice()]);
        assert_eq!(fresh.last(), None);
    }

    #[test]
    fn node_text_is_escaped_and_capped() {
        let mut t = Tracker::default();
        let long = format!("3,1,1,-;sched_ext: BPF scheduler \"a\x1b[31m\" disabled ({})", "x".repeat(10_000));
        feed_all(&mut t, &[long.as_bytes()]);
        let exit = t.last().unwrap();
        assert_eq!(exit.ops, "a\\u{1b}[31m");
        assert!(exit.reason.chars().count() < MAX_EXIT_REASON_CHARS + 40, "{}", exit.reason.len());
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_parse_without_panic_and_stay_capped(records in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..300), 0..8)) {
            let mut t = Tracker::default();
            for raw in &records {
                if let Some(record) = parse_record(raw) {
                    let _ = t.feed(&record, 0);
                }
            }
            if let Some(exit) = t.last() {
                proptest::prop_assert!(exit.reason.chars().count() <= MAX_EXIT_REASON_CHARS + 40);
                proptest::prop_assert!(exit.detail.chars().count() <= MAX_REASON_CHARS + 40);
            }
        }

        #[test]
        fn any_disabled_line_is_an_exit(ops in "[a-z_0-9.]{1,40}", reason in "[ -~]{0,60}", seq in 0u64..1_000_000) {
            let raw = format!("3,{seq},1,-;sched_ext: BPF scheduler \"{ops}\" disabled ({reason})");
            let mut t = Tracker::default();
            let record = parse_record(raw.as_bytes()).unwrap();
            proptest::prop_assert_eq!(t.feed(&record, 7).0, Some(reason.as_str()));
            proptest::prop_assert_eq!(t.last().map(|e| (e.ops.as_str(), e.seq)), Some((ops.as_str(), seq)));
        }
    }
}
