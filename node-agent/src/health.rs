//! Scheduling health of the node, from the kernel's own accounting: the agent samples a few
//! cumulative counters every interval and turns each two readings into a [`HealthSample`].
//!
//! - `/proc/schedstat`: per CPU, the time tasks waited on its run queue (run delay) and the
//!   timeslices run; their ratio is the mean wait per timeslice, whatever scheduling class ran
//!   the tasks (a sched_ext scheduler's too);
//! - `/proc/pressure/cpu`: the `some` line's `total`, microseconds in which some task waited
//!   for a CPU;
//! - the sched_ext event counters (`root/events`), as the observer last read them (no second
//!   read, so up to one poll interval old): rates per second within one scheduler instance (one
//!   `enable_seq`).
//!
//! Every source is optional (kernels differ): one that cannot be read leaves its signal unset,
//! never zero, and [`Health::unavailable`] says which and why. The newest [`MAX_SAMPLES`]
//! samples are published on a watch channel that the report streams read when they build a
//! report (they are not woken by it).

use std::collections::{BTreeMap, VecDeque};
use std::fs;
use std::io::{self, Read as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sked_proto::text::escape_and_cap;
use sked_proto::{Health, HealthSample};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::metrics::Metrics;
use crate::observation::Observation;
use crate::sysfs::KernelRead;

/// Most samples a [`Window`] keeps (and a report carries).
pub const MAX_SAMPLES: usize = 16;
/// Most characters kept of [`Health::unavailable`].
pub const MAX_UNAVAILABLE_CHARS: usize = 512;
/// Largest procfs file read: `/proc/schedstat` grows with the CPUs and their scheduling domains
/// (about a kilobyte per CPU); a larger one is reported unavailable, not read in part.
const MAX_FILE: u64 = 4 * 1024 * 1024;
/// Fewest counters after `cpu<N>` in a `/proc/schedstat` CPU line (versions 15 to 17 have 9).
const SCHEDSTAT_CPU_FIELDS: usize = 9;

/// What to tell about a source that is missing (a `NotFound` error).
const SCHEDSTAT_HINT: &str = "the kernel lacks CONFIG_SCHEDSTATS";
const PRESSURE_HINT: &str = "PSI is off: boot with psi=1";

/// One reading of the counters, all cumulative.
#[derive(Clone, Debug, PartialEq)]
pub struct Counters {
    /// A monotonic clock reading (from any fixed origin): the length of an interval.
    pub monotonic: Duration,
    /// The node's clock, in milliseconds since the Unix epoch: the time of a sample.
    pub unix_ms: i64,
    /// `/proc/schedstat` summed over every CPU: (run delay in ns, timeslices).
    pub schedstat: Option<(u64, u64)>,
    /// `/proc/pressure/cpu`: the `some` line's `total`, in microseconds.
    pub pressure_total_us: Option<u64>,
    /// The attached scheduler's event counters and the `enable_seq` they were read under.
    pub events: Option<(u64, BTreeMap<String, u64>)>,
}

/// Parses `/proc/schedstat` into (run delay in ns, timeslices), summed over the `cpu<N>` lines.
///
/// Only the CPU lines are read, so every version of the format parses (the `version`,
/// `timestamp` and `domain<N>` lines differ between them): of a CPU line the last three numbers
/// are running time, run delay and timeslices. A CPU line with fewer than 9 counters, or one
/// that is not numbers, makes the whole file an error (a partial sum would read as a drop), as
/// does a file without CPU lines.
pub fn parse_schedstat(text: &str) -> Result<(u64, u64), String> {
    let mut run_delay_ns = 0u64;
    let mut timeslices = 0u64;
    let mut cpus = 0usize;
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let Some(name) = fields.next() else { continue };
        let is_cpu = name.strip_prefix("cpu").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if !is_cpu {
            continue;
        }
        let numbers: Result<Vec<u64>, _> = fields.map(str::parse::<u64>).collect();
        let numbers = match numbers {
            Ok(numbers) if numbers.len() >= SCHEDSTAT_CPU_FIELDS => numbers,
            _ => return Err(format!("malformed line {:?}", escape_and_cap(line, 80))),
        };
        let [.., _running, delay, slices] = numbers.as_slice() else {
            return Err(format!("malformed line {:?}", escape_and_cap(line, 80)));
        };
        run_delay_ns = run_delay_ns.saturating_add(*delay);
        timeslices = timeslices.saturating_add(*slices);
        cpus += 1;
    }
    if cpus == 0 {
        return Err("no cpu lines".to_owned());
    }
    Ok((run_delay_ns, timeslices))
}

/// Parses `/proc/pressure/cpu`: the `total=` (microseconds) of its `some` line. The `full`
/// line (kernels since 5.13) is not read.
pub fn parse_pressure(text: &str) -> Result<u64, String> {
    let some = text.lines().find_map(|l| l.strip_prefix("some ")).ok_or_else(|| "no \"some\" line".to_owned())?;
    let total = some.split_whitespace().find_map(|f| f.strip_prefix("total="));
    match total.map(str::parse::<u64>) {
        Some(Ok(total)) => Ok(total),
        _ => Err(format!("no total in {:?}", escape_and_cap(some, 80))),
    }
}

/// The event counters of `read` with the `enable_seq` they belong to: only while a scheduler is
/// attached (`root/ops`), its enable is counted and it has counters (a kernel without
/// `root/events` gives none).
pub fn events_of(read: &KernelRead) -> Option<(u64, BTreeMap<String, u64>)> {
    let seq = read.enable_seq?;
    (read.ops.is_some() && !read.events.is_empty()).then(|| (seq, read.events.clone()))
}

/// The sample of the interval from `before` to `after`. A signal is unset when either end
/// lacks it or a counter went backwards; run delay also when no timeslice ran, pressure and
/// rates also when no time passed.
pub fn sample(before: &Counters, after: &Counters) -> HealthSample {
    let wall = after.monotonic.saturating_sub(before.monotonic);
    let run_delay_us = match (before.schedstat, after.schedstat) {
        (Some((delay0, slices0)), Some((delay1, slices1))) => {
            match (delay1.checked_sub(delay0), slices1.checked_sub(slices0)) {
                (Some(delay), Some(slices)) if slices > 0 => Some(delay as f64 / slices as f64 / 1000.0),
                _ => None,
            }
        }
        _ => None,
    };
    let wall_us = wall.as_micros() as f64;
    let cpu_pressure_percent = match (before.pressure_total_us, after.pressure_total_us) {
        (Some(t0), Some(t1)) if wall_us > 0.0 => {
            t1.checked_sub(t0).map(|stalled| (stalled as f64 / wall_us * 100.0).clamp(0.0, 100.0))
        }
        _ => None,
    };
    let rates = match (&before.events, &after.events) {
        (Some((seq0, events0)), Some((seq1, events1))) if seq0 == seq1 && !wall.is_zero() => {
            event_rates(events0, events1, wall)
        }
        _ => None,
    };
    HealthSample {
        time_unix_ms: after.unix_ms,
        interval_ms: u32::try_from(wall.as_millis()).unwrap_or(u32::MAX),
        run_delay_us,
        cpu_pressure_percent,
        events_known: rates.is_some(),
        event_rates: rates.unwrap_or_default().into_iter().collect(),
    }
}

/// Rates per second of the counters that moved from `before` to `after` over `wall`; `None`
/// when one went backwards (not one scheduler instance after all). A counter at one end only
/// is left out.
fn event_rates(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
    wall: Duration,
) -> Option<BTreeMap<String, f64>> {
    let mut rates = BTreeMap::new();
    for (name, value) in after {
        let Some(old) = before.get(name) else { continue };
        let grown = value.checked_sub(*old)?;
        if grown > 0 {
            rates.insert(name.clone(), grown as f64 / wall.as_secs_f64());
        }
    }
    Some(rates)
}

/// The newest samples (at most [`MAX_SAMPLES`]) and what could not be read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Window {
    samples: VecDeque<HealthSample>,
    unavailable: String,
}

impl Window {
    /// Adds the newest sample, dropping the oldest past [`MAX_SAMPLES`].
    pub fn push(&mut self, sample: HealthSample) {
        if self.samples.len() == MAX_SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back(sample);
    }

    /// Sets what could not be read at the newest reading (see [`unavailable_text`]).
    pub fn set_unavailable(&mut self, text: String) {
        self.unavailable = text;
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The window as the wire carries it: samples oldest first.
    pub fn health(&self) -> Health {
        Health { samples: self.samples.iter().cloned().collect(), unavailable: self.unavailable.clone() }
    }
}

/// The `unavailable` text of `problems` (one per source): joined, escaped and capped at
/// [`MAX_UNAVAILABLE_CHARS`].
pub fn unavailable_text(problems: &[String]) -> String {
    escape_and_cap(&problems.join("; "), MAX_UNAVAILABLE_CHARS)
}

/// Reads the counters under `proc_root` (and the events of `kernel`) at the clock readings
/// given. Returns them and a problem per source that could not be read: its path, the error,
/// and for a missing file what it means.
pub fn read_counters(
    proc_root: &Path,
    kernel: &KernelRead,
    monotonic: Duration,
    unix_ms: i64,
) -> (Counters, Vec<String>) {
    let mut problems = Vec::new();
    let schedstat = source(&proc_root.join("schedstat"), parse_schedstat, SCHEDSTAT_HINT, &mut problems);
    let pressure_total_us = source(&proc_root.join("pressure/cpu"), parse_pressure, PRESSURE_HINT, &mut problems);
    let counters = Counters { monotonic, unix_ms, schedstat, pressure_total_us, events: events_of(kernel) };
    (counters, problems)
}

/// Reads and parses one source; on failure notes why in `problems` (with `hint` when the file
/// does not exist).
fn source<T>(path: &Path, parse: fn(&str) -> Result<T, String>, hint: &str, problems: &mut Vec<String>) -> Option<T> {
    let parsed = match read_small(path) {
        Ok(text) => parse(&text),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(format!("{e} ({hint})")),
        Err(e) => Err(e.to_string()),
    };
    parsed.map_err(|why| problems.push(format!("{}: {why}", path.display()))).ok()
}

/// Reads a file of at most [`MAX_FILE`] bytes (lossily as UTF-8); a larger one is an error.
fn read_small(path: &Path) -> io::Result<String> {
    let mut buf = Vec::new();
    fs::File::open(path)?.take(MAX_FILE + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > MAX_FILE {
        return Err(io::Error::other(format!("larger than {MAX_FILE} bytes")));
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Samples every `interval` for as long as the task runs: reads the counters under `proc_root`
/// and the events of the newest observation, adds the sample of the interval since the
/// previous reading to the window, and publishes the window on `tx`. The first reading is at
/// once and only sets the baseline (and what is unavailable). A zero `interval` samples nothing.
pub async fn run(
    interval: Duration,
    proc_root: PathBuf,
    observations: watch::Receiver<Observation>,
    tx: watch::Sender<Health>,
    metrics: Arc<Metrics>,
) {
    if interval.is_zero() {
        return;
    }
    let origin = Instant::now();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut window = Window::default();
    let mut previous: Option<Counters> = None;
    let mut told: Option<String> = None;
    loop {
        tick.tick().await;
        let kernel = observations.borrow().read.clone();
        let now_ms = jiff::Timestamp::now().as_millisecond();
        let (counters, problems) = read_counters(&proc_root, &kernel, origin.elapsed(), now_ms);
        let unavailable = unavailable_text(&problems);
        if told.as_ref() != Some(&unavailable) {
            if unavailable.is_empty() {
                info!("every scheduling-health signal is read");
            } else {
                warn!(unavailable = %unavailable, "some scheduling-health signals are unavailable");
            }
            told = Some(unavailable.clone());
        }
        window.set_unavailable(unavailable);
        if let Some(before) = &previous {
            let s = sample(before, &counters);
            metrics.health_sampled(&s);
            window.push(s);
        }
        previous = Some(counters);
        tx.send_replace(window.health());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysfs::SchedState;

    /// Version 15 (Linux 4.x to 6.12): two CPUs, each followed by its domains.
    const SCHEDSTAT_V15: &str = "version 15
timestamp 4297299139
cpu0 0 0 0 0 0 0 1145744436187 63395567468 5623213
domain0 00000003 2048736 2035862 7779 16226932 2 0 0 2035861 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
domain1 000000ff 1863826 1803093 51426 69287398 9307 0 0 1802852 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
cpu1 0 0 0 0 0 0 1121946046392 36604432532 4911787
domain0 00000003 2022542 2011047 7167 15104958 2 0 0 2011045 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
";

    /// Version 17 (Linux 6.13 on): domains carry their names, the CPU lines are unchanged.
    const SCHEDSTAT_V17: &str = "version 17
timestamp 4295347006
cpu0 0 0 250397 122436 109733 95201 38553488226 8219683893 129898
domain0 SMT 00000003 1 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
domain1 MC ffffffff 1 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
cpu1 0 0 233110 113279 104452 92063 37070283404 5916236203 120117
domain0 SMT 00000003 1 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
";

    const PRESSURE: &str = "some avg10=1.25 avg60=0.80 avg300=0.31 total=123456789
full avg10=0.00 avg60=0.00 avg300=0.00 total=0
";

    fn counters(at_s: u64, schedstat: Option<(u64, u64)>, pressure: Option<u64>) -> Counters {
        Counters {
            monotonic: Duration::from_secs(at_s),
            unix_ms: 1_700_000_000_000 + i64::try_from(at_s).unwrap() * 1000,
            schedstat,
            pressure_total_us: pressure,
            events: None,
        }
    }

    fn events(seq: u64, list: &[(&str, u64)]) -> Option<(u64, BTreeMap<String, u64>)> {
        Some((seq, list.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()))
    }

    #[test]
    fn schedstat_sums_the_cpu_lines_of_either_version() {
        assert_eq!(parse_schedstat(SCHEDSTAT_V15), Ok((63395567468 + 36604432532, 5623213 + 4911787)));
        assert_eq!(parse_schedstat(SCHEDSTAT_V17), Ok((8219683893 + 5916236203, 129898 + 120117)));
        // A future version with more counters: the last three are still the ones read.
        assert_eq!(parse_schedstat("version 18\ncpu0 9 9 9 9 9 9 9 9 1 2 3\n"), Ok((2, 3)));
    }

    #[test]
    fn a_malformed_schedstat_is_an_error_not_a_partial_sum() {
        let short = "version 15\ncpu0 0 0 0 0 0 0 1 2 3\ncpu1 0 0 0 0 1 2 3\n";
        assert!(parse_schedstat(short).unwrap_err().contains("cpu1"));
        assert!(parse_schedstat("cpu0 0 0 0 0 0 0 1 x 3\n").is_err());
        assert_eq!(parse_schedstat("version 15\ntimestamp 1\n"), Err("no cpu lines".to_owned()));
        assert!(parse_schedstat("").is_err());
    }

    #[test]
    fn pressure_reads_the_some_total_with_or_without_full() {
        assert_eq!(parse_pressure(PRESSURE), Ok(123456789));
        assert_eq!(parse_pressure("some avg10=0.00 avg60=0.00 avg300=0.00 total=42\n"), Ok(42));
        assert!(parse_pressure("full avg10=0.00 avg60=0.00 avg300=0.00 total=42\n").is_err());
        assert!(parse_pressure("some avg10=0.00 total=lots\n").is_err());
    }

    #[test]
    fn deltas_give_run_delay_per_timeslice_and_pressure() {
        let before = counters(10, Some((1_000_000, 100)), Some(1_000_000));
        // 5 s: 30 ms of waiting over 600 timeslices (50 µs each); 0.5 s of stall (10 %).
        let after = counters(15, Some((31_000_000, 700)), Some(1_500_000));
        let s = sample(&before, &after);
        assert_eq!(s.interval_ms, 5000);
        assert_eq!(s.time_unix_ms, after.unix_ms);
        assert_eq!(s.run_delay_us, Some(50.0));
        assert_eq!(s.cpu_pressure_percent, Some(10.0));
        assert!(!s.events_known && s.event_rates.is_empty());
        // More stall than wall time (clock granularity) is capped at 100 %.
        let clamped = sample(&before, &counters(15, None, Some(7_000_000)));
        assert_eq!(clamped.cpu_pressure_percent, Some(100.0));
    }

    #[test]
    fn counters_going_backwards_or_no_timeslices_leave_signals_unset() {
        let before = counters(10, Some((1_000_000, 100)), Some(1_000_000));
        let back = sample(&before, &counters(15, Some((900_000, 200)), Some(999_999)));
        assert_eq!((back.run_delay_us, back.cpu_pressure_percent), (None, None));
        let fewer_slices = sample(&before, &counters(15, Some((2_000_000, 99)), None));
        assert_eq!(fewer_slices.run_delay_us, None);
        let idle = sample(&before, &counters(15, Some((1_000_000, 100)), Some(1_000_000)));
        assert_eq!(idle.run_delay_us, None, "no timeslice ran");
        assert_eq!(idle.cpu_pressure_percent, Some(0.0), "no stall is a known zero");
        let no_time = sample(&before, &counters(10, Some((2_000_000, 200)), Some(1_000_100)));
        assert_eq!(no_time.cpu_pressure_percent, None);
    }

    #[test]
    fn missing_sources_are_unavailable_not_zero() {
        let tmp = tempfile::tempdir().unwrap();
        let kernel = KernelRead { ..read_without_scheduler() };
        let (read, problems) = read_counters(tmp.path(), &kernel, Duration::from_secs(1), 1000);
        assert_eq!((read.schedstat, read.pressure_total_us, &read.events), (None, None, &None));
        let text = unavailable_text(&problems);
        let psi = format!(
            "{}: No such file or directory (os error 2) (PSI is off: boot with psi=1)",
            tmp.path().join("pressure/cpu").display()
        );
        assert!(text.contains(&psi), "{text}");
        assert!(
            text.contains("schedstat: No such file or directory (os error 2) (the kernel lacks CONFIG_SCHEDSTATS)"),
            "{text}"
        );
        let s = sample(&read, &Counters { monotonic: Duration::from_secs(2), ..read.clone() });
        assert_eq!((s.run_delay_us, s.cpu_pressure_percent, s.events_known), (None, None, false));

        std::fs::create_dir(tmp.path().join("pressure")).unwrap();
        std::fs::write(tmp.path().join("pressure/cpu"), PRESSURE).unwrap();
        std::fs::write(tmp.path().join("schedstat"), "cpu0 \x1b[2J 1 2\n").unwrap();
        let (read, problems) = read_counters(tmp.path(), &kernel, Duration::from_secs(1), 1000);
        assert_eq!((read.schedstat, read.pressure_total_us), (None, Some(123456789)));
        let text = unavailable_text(&problems);
        assert!(text.contains("schedstat: malformed line") && text.contains("\\u{1b}"), "{text}");
        assert!(!text.chars().any(char::is_control), "{text}");
    }

    fn read_without_scheduler() -> KernelRead {
        KernelRead {
            supported: true,
            state: SchedState::Disabled,
            ops: None,
            enable_seq: Some(1),
            switch_all: Some(false),
            nr_rejected: Some(0),
            hotplug_seq: Some(1),
            events: BTreeMap::new(),
            problems: Vec::new(),
        }
    }

    #[test]
    fn events_are_known_only_under_one_enable() {
        let mut kernel = read_without_scheduler();
        assert_eq!(events_of(&kernel), None, "no scheduler attached");
        kernel.ops = Some("lavd".into());
        assert_eq!(events_of(&kernel), None, "a kernel without root/events");
        kernel.events.insert("SCX_EV_BYPASS_DURATION".into(), 7);
        assert_eq!(events_of(&kernel), events(1, &[("SCX_EV_BYPASS_DURATION", 7)]));

        let at = |s, e| Counters { events: e, ..counters(s, None, None) };
        let before = at(10, events(3, &[("SCX_EV_A", 100), ("SCX_EV_B", 5), ("SCX_EV_C", 9)]));
        let after = at(12, events(3, &[("SCX_EV_A", 110), ("SCX_EV_B", 5), ("SCX_EV_C", 9), ("SCX_EV_NEW", 4)]));
        let s = sample(&before, &after);
        assert!(s.events_known);
        assert_eq!(s.event_rates, [("SCX_EV_A".to_owned(), 5.0)].into_iter().collect(), "only counters that moved");
        // A new scheduler instance started its counters again: no rate is known.
        let reloaded = sample(&before, &at(12, events(4, &[("SCX_EV_A", 150)])));
        assert!(!reloaded.events_known && reloaded.event_rates.is_empty());
        // Same enable_seq but a counter went backwards: not one instance either.
        let backwards = sample(&before, &at(12, events(3, &[("SCX_EV_A", 150), ("SCX_EV_B", 1)])));
        assert!(!backwards.events_known && backwards.event_rates.is_empty());
        let detached = sample(&before, &at(12, None));
        assert!(!detached.events_known);
    }

    #[test]
    fn the_window_keeps_the_newest_sixteen_oldest_first() {
        let mut window = Window::default();
        assert!(window.is_empty());
        for i in 0..40 {
            window.push(HealthSample { time_unix_ms: i, ..HealthSample::default() });
        }
        window.set_unavailable("x".to_owned());
        let health = window.health();
        assert_eq!(window.len(), MAX_SAMPLES);
        let times: Vec<i64> = health.samples.iter().map(|s| s.time_unix_ms).collect();
        assert_eq!(times, (24..40).collect::<Vec<_>>());
        assert_eq!(health.unavailable, "x");
    }

    #[test]
    fn unavailable_text_is_capped() {
        let text = unavailable_text(&["y".repeat(10_000)]);
        assert!(text.starts_with(&"y".repeat(MAX_UNAVAILABLE_CHARS)) && text.ends_with("more bytes)"), "{text}");
    }

    #[tokio::test]
    async fn the_task_publishes_the_window_every_interval() {
        let tmp = tempfile::tempdir().unwrap();
        let proc_root = tmp.path().to_owned();
        std::fs::write(proc_root.join("schedstat"), "version 17\ncpu0 0 0 0 0 0 0 5 1000000 100\n").unwrap();
        let observation = Observation {
            read: read_without_scheduler(),
            verdict: crate::verdict::Verdict::NotAttached,
            reason: String::new(),
            last_exit: None,
        };
        let (_obs_tx, obs_rx) = watch::channel(observation);
        let (tx, mut rx) = watch::channel(Health::default());
        let metrics = Arc::new(Metrics::new());
        tokio::spawn(run(Duration::from_millis(50), proc_root.clone(), obs_rx, tx, metrics.clone()));
        rx.changed().await.unwrap();
        let first = rx.borrow_and_update().clone();
        assert!(first.samples.is_empty(), "the first reading is the baseline");
        assert!(first.unavailable.contains("pressure/cpu"), "{}", first.unavailable);
        std::fs::write(proc_root.join("schedstat"), "version 17\ncpu0 0 0 0 0 0 0 5 4000000 200\n").unwrap();
        // The write may miss the next reading (an idle interval: no timeslice, no run delay).
        let newest = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                rx.changed().await.unwrap();
                let health = rx.borrow_and_update().clone();
                let newest = health.samples.last().cloned().unwrap();
                if newest.run_delay_us.is_some() {
                    return (health.samples.len(), newest);
                }
            }
        })
        .await
        .unwrap();
        assert_eq!(newest.1.run_delay_us, Some(30.0));
        assert_eq!(newest.1.cpu_pressure_percent, None);
        assert!(newest.0 >= 1 && newest.0 <= MAX_SAMPLES);
        let text = metrics.encode();
        assert!(!text.contains("sked_agent_cpu_pressure_percent "), "unavailable is not exported as 0: {text}");
        assert!(!text.contains("sked_agent_health_samples_total 0"), "{text}");
    }
}
