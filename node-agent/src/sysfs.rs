//! Reads the kernel's sched_ext state under `<sysfs root>/kernel/sched_ext`.
//!
//! The layout, as a sched_ext kernel shows it:
//! - `state`: `enabled`, `disabled`, `enabling` or `disabling`;
//! - `switch_all`, `nr_rejected`, `hotplug_seq`, `enable_seq`: decimal numbers;
//! - `root/ops`: the attached scheduler's ops name, and `root/events`: one `SCX_EV_<NAME> <count>`
//!   per line; `root/` exists only while a scheduler is attached.
//!
//! Missing files and garbage never panic: they become [`KernelRead::problems`], and the verdict
//! says what could not be read.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read};
use std::path::Path;

use sked_proto::text::{MAX_NAME_CHARS, escape_and_cap};

/// Largest file this reader accepts; sched_ext files are a few hundred bytes.
const MAX_FILE: u64 = 64 * 1024;

/// The `state` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SchedState {
    Enabled,
    Disabled,
    Enabling,
    Disabling,
    /// A value this agent does not know.
    Other(String),
    /// The file is missing or unreadable.
    Unreadable,
}

impl SchedState {
    pub fn parse(text: &str) -> Self {
        match text.trim() {
            "enabled" => Self::Enabled,
            "disabled" => Self::Disabled,
            "enabling" => Self::Enabling,
            "disabling" => Self::Disabling,
            other => Self::Other(escape_and_cap(other, 64)),
        }
    }

    /// The name reported over the wire and in metrics.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Enabled => "enabled",
            Self::Disabled => "disabled",
            Self::Enabling => "enabling",
            Self::Disabling => "disabling",
            Self::Other(s) => s,
            Self::Unreadable => "",
        }
    }
}

/// One read of the sched_ext directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelRead {
    /// `/sys/kernel/sched_ext` exists.
    pub supported: bool,
    pub state: SchedState,
    /// `root/ops`, when a scheduler is attached.
    pub ops: Option<String>,
    pub enable_seq: Option<u64>,
    pub switch_all: Option<bool>,
    pub nr_rejected: Option<u64>,
    pub hotplug_seq: Option<u64>,
    /// `root/events` counters.
    pub events: BTreeMap<String, u64>,
    /// What could not be read or parsed, in words.
    pub problems: Vec<String>,
}

impl KernelRead {
    fn unsupported() -> Self {
        Self {
            supported: false,
            state: SchedState::Unreadable,
            ops: None,
            enable_seq: None,
            switch_all: None,
            nr_rejected: None,
            hotplug_seq: None,
            events: BTreeMap::new(),
            problems: Vec::new(),
        }
    }
}

/// Reads everything under `<sysfs_root>/kernel/sched_ext`.
pub fn read(sysfs_root: &Path) -> KernelRead {
    let dir = sysfs_root.join("kernel/sched_ext");
    let mut out = KernelRead::unsupported();
    match fs::metadata(&dir) {
        Ok(meta) if meta.is_dir() => {}
        // Only a sysfs that shows the kernel, and no sched_ext in it, proves the kernel has none;
        // a wrong mount or a denied read is a problem to report, not a verdict on the node.
        Err(e) if e.kind() == io::ErrorKind::NotFound && sysfs_root.join("kernel").is_dir() => return out,
        other => {
            out.supported = true;
            out.state = SchedState::Unreadable;
            let why = other.map_or_else(|e| e.to_string(), |_| "not a directory".to_owned());
            out.problems.push(format!("cannot read {}: {why}", dir.display()));
            return out;
        }
    }
    out.supported = true;
    let mut problems = Vec::new();

    out.state = match read_small(&dir.join("state")) {
        Ok(text) => SchedState::parse(&text),
        Err(e) => {
            problems.push(format!("state: {e}"));
            SchedState::Unreadable
        }
    };
    out.enable_seq = number(&dir, "enable_seq", &mut problems);
    out.nr_rejected = number(&dir, "nr_rejected", &mut problems);
    out.hotplug_seq = number(&dir, "hotplug_seq", &mut problems);
    out.switch_all = number(&dir, "switch_all", &mut problems).map(|v| v != 0);

    let root = dir.join("root");
    if root.is_dir() {
        match read_small(&root.join("ops")) {
            Ok(text) => {
                let ops = text.trim();
                if !ops.is_empty() {
                    out.ops = Some(escape_and_cap(ops, MAX_NAME_CHARS));
                }
            }
            // root/ disappears while a scheduler detaches: not a problem, just gone.
            Err(e) if root.is_dir() => problems.push(format!("root/ops: {e}")),
            Err(_) => {}
        }
        if let Ok(text) = read_small(&root.join("events")) {
            let (events, bad) = parse_events(&text);
            out.events = events;
            problems.extend(bad);
        }
    }
    out.problems = problems;
    out
}

/// The attached scheduler's event counters (`root/events`) and the `enable_seq` they were read
/// under, read on their own: the few files [`read`] reads for them, at the moment a caller
/// needs (the health sampler, at its sampling instant). `enable_seq` is read before and after
/// the counters. `None` when either read fails or they differ (the counters may belong to
/// either scheduler instance), when no scheduler is attached (no `root/ops` naming one), or
/// when the kernel gives no counters. Lines of `root/events` that do not parse are left out
/// (the observer's [`read`] reports them).
pub fn read_events(sysfs_root: &Path) -> Option<(u64, BTreeMap<String, u64>)> {
    let dir = sysfs_root.join("kernel/sched_ext");
    let mut ignored = Vec::new();
    let before = number(&dir, "enable_seq", &mut ignored)?;
    let ops = read_small(&dir.join("root/ops")).ok()?;
    let (events, _bad) = parse_events(&read_small(&dir.join("root/events")).ok()?);
    let after = number(&dir, "enable_seq", &mut ignored)?;
    (before == after && !ops.trim().is_empty() && !events.is_empty()).then_some((after, events))
}

/// Parses `root/events`: `NAME <count>` per line. Returns the counters and a note per bad line.
pub fn parse_events(text: &str) -> (BTreeMap<String, u64>, Vec<String>) {
    let mut events = BTreeMap::new();
    let mut bad = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let mut parts = line.split_whitespace();
        match (parts.next(), parts.next_back().map(str::parse::<u64>)) {
            (Some(name), Some(Ok(value))) if is_event_name(name) => {
                events.insert(name.to_owned(), value);
            }
            _ => bad.push(format!("root/events line {}: cannot parse {:?}", i + 1, truncate(line, 80))),
        }
    }
    (events, bad)
}

fn is_event_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Parses a decimal number file.
pub fn parse_number(text: &str) -> Result<u64, String> {
    let t = text.trim();
    t.parse::<u64>().map_err(|_| format!("expected a number, found {:?}", truncate(t, 40)))
}

fn number(dir: &Path, name: &str, problems: &mut Vec<String>) -> Option<u64> {
    match read_small(&dir.join(name)).map_err(|e| e.to_string()).and_then(|t| parse_number(&t)) {
        Ok(v) => Some(v),
        Err(e) => {
            // Older kernels lack some of these files; note it without failing the read.
            problems.push(format!("{name}: {e}"));
            None
        }
    }
}

fn read_small(path: &Path) -> std::io::Result<String> {
    let mut buf = Vec::new();
    fs::File::open(path)?.take(MAX_FILE).read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// Writes a fake sched_ext tree (for tests and the demo): `None` for `ops` means no scheduler
/// attached (no `root/` directory), as the kernel shows it.
pub mod fixture {
    use std::fs;
    use std::io;
    use std::path::Path;

    pub fn write(sysfs_root: &Path, state: &str, ops: Option<&str>, enable_seq: u64) -> io::Result<()> {
        let dir = sysfs_root.join("kernel/sched_ext");
        fs::create_dir_all(&dir)?;
        // Files are replaced by rename so a concurrent reader never sees half a write.
        let put = |path: &Path, body: &str| -> io::Result<()> {
            let tmp = path.with_extension("tmp");
            fs::write(&tmp, body)?;
            fs::rename(&tmp, path)
        };
        // The kernel's order: on attach, root/ appears before state says enabled; on detach,
        // state leaves enabled before root/ goes.
        let root = dir.join("root");
        if let Some(ops) = ops {
            fs::create_dir_all(&root)?;
            put(&root.join("ops"), &format!("{ops}\n"))?;
            put(
                &root.join("events"),
                "SCX_EV_SELECT_CPU_FALLBACK 3\nSCX_EV_BYPASS_DURATION 0\nSCX_EV_REFILL_SLICE_DFL 42\n",
            )?;
        }
        put(&dir.join("enable_seq"), &format!("{enable_seq}\n"))?;
        put(&dir.join("hotplug_seq"), "1\n")?;
        put(&dir.join("nr_rejected"), "0\n")?;
        put(&dir.join("switch_all"), if ops.is_some() { "1\n" } else { "0\n" })?;
        put(&dir.join("state"), &format!("{state}\n"))?;
        if ops.is_none() && root.exists() {
            fs::remove_dir_all(&root)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_directory_in_the_kernel_s_sysfs_means_unsupported() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("kernel")).unwrap();
        let r = read(tmp.path());
        assert!(!r.supported);
        assert_eq!(r.state, SchedState::Unreadable);
    }

    #[test]
    fn a_sysfs_without_the_kernel_is_a_problem_not_a_verdict() {
        // A wrong --sysfs-root or a missing mount: the kernel's support is not known.
        let tmp = tempfile::tempdir().unwrap();
        let r = read(tmp.path());
        assert!(r.supported, "not judged unsupported");
        assert_eq!(r.state, SchedState::Unreadable);
        assert!(r.problems[0].contains("cannot read"), "{:?}", r.problems);
    }

    #[test]
    fn idle_kernel_reads_like_the_real_one() {
        // No scheduler: state=disabled, enable_seq=0, hotplug_seq=1, nr_rejected=0,
        // switch_all=0, no root/ directory.
        let tmp = tempfile::tempdir().unwrap();
        fixture::write(tmp.path(), "disabled", None, 0).unwrap();
        let r = read(tmp.path());
        assert!(r.supported);
        assert_eq!(r.state, SchedState::Disabled);
        assert_eq!(
            (r.enable_seq, r.hotplug_seq, r.nr_rejected, r.switch_all),
            (Some(0), Some(1), Some(0), Some(false))
        );
        assert_eq!(r.ops, None);
        assert!(r.events.is_empty() && r.problems.is_empty(), "{:?}", r.problems);
    }

    #[test]
    fn attached_kernel_shows_ops_and_events() {
        let tmp = tempfile::tempdir().unwrap();
        fixture::write(tmp.path(), "enabled", Some("sked_canary"), 1).unwrap();
        let r = read(tmp.path());
        assert_eq!(r.state, SchedState::Enabled);
        assert_eq!(r.ops.as_deref(), Some("sked_canary"));
        assert_eq!(r.switch_all, Some(true));
        assert_eq!(r.events.get("SCX_EV_REFILL_SLICE_DFL"), Some(&42));
        assert_eq!(r.events.len(), 3);
    }

    #[test]
    fn events_are_read_on_their_own_only_while_a_scheduler_is_attached() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(read_events(tmp.path()), None, "no sched_ext");
        fixture::write(tmp.path(), "disabled", None, 3).unwrap();
        assert_eq!(read_events(tmp.path()), None, "no scheduler attached");
        fixture::write(tmp.path(), "enabled", Some("lavd"), 4).unwrap();
        let (seq, events) = read_events(tmp.path()).unwrap();
        assert_eq!(seq, 4);
        assert_eq!(events, read(tmp.path()).events, "what the observer reads");
        assert_eq!(events.get("SCX_EV_BYPASS_DURATION"), Some(&0), "a counter at 0 is read");
        let dir = tmp.path().join("kernel/sched_ext");
        fs::write(dir.join("root/events"), "garbage\n").unwrap();
        assert_eq!(read_events(tmp.path()), None, "no counters");
        fs::write(dir.join("root/events"), "SCX_EV_A 1\n").unwrap();
        fs::remove_file(dir.join("enable_seq")).unwrap();
        assert_eq!(read_events(tmp.path()), None, "no enable_seq");
    }

    #[test]
    fn transitional_and_unknown_states_parse() {
        assert_eq!(SchedState::parse("enabling\n"), SchedState::Enabling);
        assert_eq!(SchedState::parse("disabling"), SchedState::Disabling);
        assert_eq!(SchedState::parse("  weird  "), SchedState::Other("weird".into()));
    }

    #[test]
    fn garbage_files_become_problems_not_panics() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("kernel/sched_ext");
        fs::create_dir_all(dir.join("root")).unwrap();
        fs::write(dir.join("state"), b"\xff\xfeenabled").unwrap();
        fs::write(dir.join("enable_seq"), "lots").unwrap();
        fs::write(dir.join("root/events"), "SCX_EV_OK 1\nbroken line here x\n\n= 5\n").unwrap();
        let r = read(tmp.path());
        assert!(matches!(r.state, SchedState::Other(_)));
        assert_eq!(r.enable_seq, None);
        assert_eq!(r.events.get("SCX_EV_OK"), Some(&1));
        let all = r.problems.join("; ");
        assert!(all.contains("enable_seq: expected a number"), "{all}");
        assert!(all.contains("root/events line 2"), "{all}");
        assert!(all.contains("root/ops"), "{all}");
        assert!(all.contains("switch_all"), "missing files are noted: {all}");
    }

    #[test]
    fn huge_files_are_cut_not_loaded() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("kernel/sched_ext");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("state"), "x".repeat(10 * 1024 * 1024)).unwrap();
        let r = read(tmp.path());
        assert!(matches!(r.state, SchedState::Other(ref s) if s.starts_with(&"x".repeat(64)) && s.len() < 100));
    }

    #[test]
    fn garbage_in_state_and_ops_is_escaped() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("kernel/sched_ext");
        fs::create_dir_all(dir.join("root")).unwrap();
        fs::write(dir.join("state"), b"en\0abled\xff\x1b[2J").unwrap();
        fs::write(dir.join("root/ops"), b"rusty\0\xfe").unwrap();
        let r = read(tmp.path());
        let SchedState::Other(state) = &r.state else { panic!("{:?}", r.state) };
        assert_eq!(state, "en\\u{0}abled\\u{fffd}\\u{1b}[2J");
        assert_eq!(r.ops.as_deref(), Some("rusty\\u{0}\\u{fffd}"));
        assert!(!state.chars().chain(r.ops.iter().flat_map(|o| o.chars())).any(char::is_control));
    }
}
