//! Scheduling health of the node, from the kernel's own accounting: the agent samples a few
//! cumulative counters every interval and turns each two readings into a [`HealthSample`].
//!
//! - `/proc/schedstat`: per CPU, the time tasks ran, the time they waited on its run queue (run
//!   delay) and the timeslices run, whatever scheduling class ran the tasks (a sched_ext
//!   scheduler's too): run delay per timeslice, waiting tasks and utilisation per CPU, switch
//!   rate, idle CPUs beside waiting tasks (see [`crate::schedstat`]);
//! - `/proc/pressure/cpu`: the `some` line's `total`, microseconds in which some task waited
//!   for a CPU;
//! - the sched_ext event counters (`root/events`) and `enable_seq`, read at each sampling
//!   instant: rates per second within one scheduler instance (one `enable_seq`).
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
use crate::schedstat::{self, CpuCounters, CpuSignals};
use crate::sysfs;

/// Most samples a [`Window`] keeps (and a report carries).
pub const MAX_SAMPLES: usize = 16;
/// Most characters kept of [`Health::unavailable`].
pub const MAX_UNAVAILABLE_CHARS: usize = 512;
/// Largest procfs file read: `/proc/schedstat` grows with the CPUs and their scheduling domains
/// (about a kilobyte per CPU); a larger one is reported unavailable, not read in part.
const MAX_FILE: u64 = 4 * 1024 * 1024;

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
    /// `/proc/schedstat`: the counters of each CPU line, in the file's order.
    pub schedstat: Option<Vec<CpuCounters>>,
    /// `/proc/pressure/cpu`: the `some` line's `total`, in microseconds.
    pub pressure_total_us: Option<u64>,
    /// The attached scheduler's event counters and the `enable_seq` they were read under.
    pub events: Option<(u64, BTreeMap<String, u64>)>,
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

/// The sample of the interval from `before` to `after`. A signal is unset when either end
/// lacks it or a counter went backwards; the /proc/schedstat signals also as
/// [`schedstat::signals`] says (other CPUs at the two ends, no timeslice, no time), pressure
/// and rates also when no time passed.
pub fn sample(before: &Counters, after: &Counters) -> HealthSample {
    let wall = after.monotonic.saturating_sub(before.monotonic);
    let cpu = match (&before.schedstat, &after.schedstat) {
        (Some(cpus0), Some(cpus1)) => schedstat::signals(cpus0, cpus1, wall),
        _ => CpuSignals::default(),
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
        run_delay_us: cpu.run_delay_us,
        cpu_pressure_percent,
        events_known: rates.is_some(),
        event_rates: rates.unwrap_or_default().into_iter().collect(),
        waiting_per_cpu: cpu.waiting_per_cpu,
        utilisation: cpu.utilisation,
        switches_per_cpu_second: cpu.switches_per_cpu_second,
        idle_while_waiting: cpu.idle_while_waiting,
        cpus: after.schedstat.as_ref().map_or(0, |cpus| u32::try_from(cpus.len()).unwrap_or(u32::MAX)),
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

/// The newest samples (at most [`MAX_SAMPLES`]), what could not be read, and the event counters
/// the newest reading found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Window {
    samples: VecDeque<HealthSample>,
    unavailable: String,
    event_names: Vec<String>,
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

    /// Sets the names of the event counters read at the newest reading (`None`: none read),
    /// sorted, those at 0 too.
    pub fn set_event_names(&mut self, events: Option<&(u64, BTreeMap<String, u64>)>) {
        self.event_names = events.map(|(_, counters)| counters.keys().cloned().collect()).unwrap_or_default();
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The window as the wire carries it: samples oldest first. Its `sent_unix_ms` is left 0:
    /// a report sets it when it is built (see [`crate::report::to_report`]).
    pub fn health(&self) -> Health {
        Health {
            samples: self.samples.iter().cloned().collect(),
            unavailable: self.unavailable.clone(),
            sent_unix_ms: 0,
            event_names: self.event_names.clone(),
        }
    }
}

/// The `unavailable` text of `problems` (one per source): joined, escaped and capped at
/// [`MAX_UNAVAILABLE_CHARS`].
pub fn unavailable_text(problems: &[String]) -> String {
    escape_and_cap(&problems.join("; "), MAX_UNAVAILABLE_CHARS)
}

/// Reads the counters under `proc_root` and the sched_ext event counters under `sysfs_root`
/// (see [`sysfs::read_events`]), right after the clock readings given. Returns them and a
/// problem per procfs source that could not be read: its path, the error, and for a missing
/// file what it means (no event counters is no problem: no scheduler is attached, or the
/// kernel has none).
pub fn read_counters(
    proc_root: &Path,
    sysfs_root: &Path,
    monotonic: Duration,
    unix_ms: i64,
) -> (Counters, Vec<String>) {
    let mut problems = Vec::new();
    let schedstat = source(&proc_root.join("schedstat"), schedstat::parse, SCHEDSTAT_HINT, &mut problems);
    let pressure_total_us = source(&proc_root.join("pressure/cpu"), parse_pressure, PRESSURE_HINT, &mut problems);
    let events = sysfs::read_events(sysfs_root);
    (Counters { monotonic, unix_ms, schedstat, pressure_total_us, events }, problems)
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
    read_at_most(path, MAX_FILE)
}

/// Reads a file of at most `max` bytes (lossily as UTF-8); a larger one is an error, not read in
/// part.
pub(crate) fn read_at_most(path: &Path, max: u64) -> io::Result<String> {
    let mut buf = Vec::new();
    fs::File::open(path)?.take(max + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > max {
        return Err(io::Error::other(format!("larger than {max} bytes")));
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Samples every `interval` for as long as the task runs: reads the counters under `proc_root`
/// and the event counters under `sysfs_root` at each tick, adds the sample of the interval
/// since the previous reading to the window, and publishes the window on `tx`. The first
/// reading is at once and only sets the baseline (and what is unavailable). A zero `interval`
/// samples nothing.
pub async fn run(
    interval: Duration,
    proc_root: PathBuf,
    sysfs_root: PathBuf,
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
        let now_ms = jiff::Timestamp::now().as_millisecond();
        let (counters, problems) = read_counters(&proc_root, &sysfs_root, origin.elapsed(), now_ms);
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
        window.set_event_names(counters.events.as_ref());
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

    const PRESSURE: &str = "some avg10=1.25 avg60=0.80 avg300=0.31 total=123456789
full avg10=0.00 avg60=0.00 avg300=0.00 total=0
";

    const SECOND: u64 = 1_000_000_000;

    /// CPU `cpu`'s counters.
    fn cpu(cpu: u32, running_ns: u64, run_delay_ns: u64, timeslices: u64) -> CpuCounters {
        CpuCounters { cpu, running_ns, run_delay_ns, timeslices }
    }

    fn counters(at_s: u64, schedstat: Option<Vec<CpuCounters>>, pressure: Option<u64>) -> Counters {
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
    fn pressure_reads_the_some_total_with_or_without_full() {
        assert_eq!(parse_pressure(PRESSURE), Ok(123456789));
        assert_eq!(parse_pressure("some avg10=0.00 avg60=0.00 avg300=0.00 total=42\n"), Ok(42));
        assert!(parse_pressure("full avg10=0.00 avg60=0.00 avg300=0.00 total=42\n").is_err());
        assert!(parse_pressure("some avg10=0.00 total=lots\n").is_err());
    }

    #[test]
    fn deltas_give_every_schedstat_signal_and_pressure() {
        let before = counters(10, Some(vec![cpu(0, 0, SECOND, 100), cpu(1, 0, 0, 0)]), Some(1_000_000));
        // 5 s over 2 CPUs: CPU 0 ran 4 s and its tasks waited 3 s over 500 timeslices, CPU 1
        // ran 1 s over 100 (3 s waited over 600 timeslices: 5 ms each); 0.5 s of stall (10 %).
        let cpus = vec![cpu(0, 4 * SECOND, 4 * SECOND, 600), cpu(1, SECOND, 0, 100)];
        let after = counters(15, Some(cpus), Some(1_500_000));
        let s = sample(&before, &after);
        assert_eq!((s.interval_ms, s.time_unix_ms, s.cpus), (5000, after.unix_ms, 2));
        assert_eq!(s.run_delay_us, Some(5000.0));
        assert_eq!(s.cpu_pressure_percent, Some(10.0));
        assert_eq!(s.waiting_per_cpu, Some(0.3), "3 s waited over 5 s x 2 CPUs");
        assert_eq!(s.utilisation, Some(0.5));
        assert_eq!(s.switches_per_cpu_second, Some(60.0));
        // Idle: 1 s on CPU 0, 4 s on CPU 1; waited 3 s: 3 s over 5 s x 2 CPUs.
        assert_eq!(s.idle_while_waiting, Some(0.3));
        assert!(!s.events_known && s.event_rates.is_empty());
        // More stall than wall time (clock granularity) is capped at 100 %.
        let clamped = sample(&before, &counters(15, None, Some(7_000_000)));
        assert_eq!(clamped.cpu_pressure_percent, Some(100.0));
        assert_eq!((clamped.cpus, clamped.utilisation), (0, None), "no schedstat at the end");
    }

    #[test]
    fn counters_going_backwards_a_cpu_change_or_no_time_leave_signals_unset() {
        let two = |delay, slices| Some(vec![cpu(0, 5 * SECOND, delay, slices), cpu(1, 5 * SECOND, delay, slices)]);
        let before = counters(10, two(1_000_000, 100), Some(1_000_000));
        let back = sample(&before, &counters(15, two(900_000, 200), Some(999_999)));
        assert_eq!((back.run_delay_us, back.cpu_pressure_percent, back.waiting_per_cpu), (None, None, None));
        assert_eq!(back.utilisation, Some(0.0), "running time did not go backwards: a known 0");
        let idle = sample(&before, &counters(15, two(1_000_000, 100), Some(1_000_000)));
        assert_eq!(idle.run_delay_us, None, "no timeslice ran");
        assert_eq!(idle.cpu_pressure_percent, Some(0.0), "no stall is a known zero");
        let no_time = sample(&before, &counters(10, two(2_000_000, 200), Some(1_000_100)));
        assert_eq!((no_time.cpu_pressure_percent, no_time.utilisation, no_time.waiting_per_cpu), (None, None, None));
        // A CPU came online: the interval is not over the same CPUs.
        let three = Some(vec![cpu(0, 6 * SECOND, 0, 0), cpu(1, 6 * SECOND, 0, 0), cpu(2, 6 * SECOND, 0, 0)]);
        let hotplug = sample(&before, &counters(15, three, None));
        let per_cpu = (hotplug.waiting_per_cpu, hotplug.utilisation, hotplug.switches_per_cpu_second);
        assert_eq!((per_cpu, hotplug.idle_while_waiting, hotplug.cpus), ((None, None, None), None, 3));
    }

    #[test]
    fn missing_sources_are_unavailable_not_zero() {
        let tmp = tempfile::tempdir().unwrap();
        let sysfs = tmp.path().join("sys");
        let (read, problems) = read_counters(tmp.path(), &sysfs, Duration::from_secs(1), 1000);
        assert_eq!((read.schedstat.clone(), read.pressure_total_us, &read.events), (None, None, &None));
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
        assert_eq!(
            (s.waiting_per_cpu, s.utilisation, s.switches_per_cpu_second, s.idle_while_waiting),
            (None, None, None, None)
        );

        std::fs::create_dir(tmp.path().join("pressure")).unwrap();
        std::fs::write(tmp.path().join("pressure/cpu"), PRESSURE).unwrap();
        std::fs::write(tmp.path().join("schedstat"), "cpu0 \x1b[2J 1 2\n").unwrap();
        let (read, problems) = read_counters(tmp.path(), &sysfs, Duration::from_secs(1), 1000);
        assert_eq!((read.schedstat, read.pressure_total_us), (None, Some(123456789)));
        let text = unavailable_text(&problems);
        assert!(text.contains("schedstat: malformed line") && text.contains("\\u{1b}"), "{text}");
        assert!(!text.chars().any(char::is_control), "{text}");
    }

    #[test]
    fn event_rates_are_known_only_under_one_enable() {
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
    fn the_window_keeps_the_newest_sixteen_oldest_first_and_the_newest_event_names() {
        let mut window = Window::default();
        assert!(window.is_empty());
        for i in 0..40 {
            window.push(HealthSample { time_unix_ms: i, ..HealthSample::default() });
        }
        window.set_unavailable("x".to_owned());
        window.set_event_names(events(2, &[("SCX_EV_Z", 1), ("SCX_EV_BYPASS_DURATION", 0)]).as_ref());
        let health = window.health();
        assert_eq!(window.len(), MAX_SAMPLES);
        let times: Vec<i64> = health.samples.iter().map(|s| s.time_unix_ms).collect();
        assert_eq!(times, (24..40).collect::<Vec<_>>());
        assert_eq!(health.unavailable, "x");
        assert_eq!(health.event_names, ["SCX_EV_BYPASS_DURATION", "SCX_EV_Z"], "sorted, those at 0 too");
        assert_eq!(health.sent_unix_ms, 0, "set when a report is built");
        window.set_event_names(None);
        assert!(window.health().event_names.is_empty());
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
        let sysfs_root = tmp.path().join("sys");
        sysfs::fixture::write(&sysfs_root, "enabled", Some("lavd"), 1).unwrap();
        let schedstat = |running, delay, slices| {
            let line = |n| format!("cpu{n} 0 0 0 0 0 0 {running} {delay} {slices}\n");
            format!("version 17\n{}{}", line(0), line(1))
        };
        std::fs::write(proc_root.join("schedstat"), schedstat(5, 1_000_000, 100)).unwrap();
        let (tx, mut rx) = watch::channel(Health::default());
        let metrics = Arc::new(Metrics::new());
        tokio::spawn(run(Duration::from_millis(50), proc_root.clone(), sysfs_root, tx, metrics.clone()));
        rx.changed().await.unwrap();
        let first = rx.borrow_and_update().clone();
        assert!(first.samples.is_empty(), "the first reading is the baseline");
        assert!(first.unavailable.contains("pressure/cpu"), "{}", first.unavailable);
        // The fixture's counters, read at the sampling instant, BYPASS_DURATION at 0 too.
        let names = ["SCX_EV_BYPASS_DURATION", "SCX_EV_REFILL_SLICE_DFL", "SCX_EV_SELECT_CPU_FALLBACK"];
        assert_eq!(first.event_names, names);
        std::fs::write(proc_root.join("schedstat"), schedstat(5, 4_000_000, 200)).unwrap();
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
        assert_eq!(newest.1.cpus, 2);
        assert!(newest.1.events_known && newest.1.utilisation.is_some() && newest.1.waiting_per_cpu.is_some());
        assert!(newest.0 >= 1 && newest.0 <= MAX_SAMPLES);
        let text = metrics.encode();
        assert!(!text.contains("sked_agent_cpu_pressure_percent "), "unavailable is not exported as 0: {text}");
        assert!(text.contains("sked_agent_waiting_tasks_per_cpu "), "{text}");
        assert!(!text.contains("sked_agent_health_samples_total 0"), "{text}");
    }
}
