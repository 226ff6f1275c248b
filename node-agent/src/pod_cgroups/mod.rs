//! CPU limits and usage of the node's Kubernetes pods, read through a read-only mount of the
//! host's cgroup2 tree, to show when a sched_ext scheduler ignores the pods' CPU limits: under
//! sched_ext the kernel does not enforce `cpu.max` or `cpu.weight` itself, the BPF scheduler
//! must (see [`crate::cgroup_ops`]).
//!
//! - [`find_pods`] lists the pod cgroups the kubelet makes, under either cgroup driver: systemd
//!   `kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid>.slice` (the uid's dashes
//!   written as underscores) or cgroupfs `kubepods/<qos>/pod<uid>`, Guaranteed pods right under
//!   `kubepods.slice` (`kubepods-pod<uid>.slice`) or `kubepods`;
//! - [`read_pod`] reads a pod's `cpu.max` (its limit: a quota of CPU time per period),
//!   `cpu.weight`, `cpu.stat` (CPU time used, times throttled) and `cpu.pressure`;
//! - [`judge`] compares two readings of one pod, [`MIN_WINDOW`] or more apart: the CPUs it used
//!   against its limit; [`Sampler`] keeps each pod's previous reading and sums one sample up in
//!   a [`Summary`].
//!
//! A limit is proven broken only when a pod is measured above it, by more than CFS itself lets
//! a pod overshoot ([`OVERSHOOT_FRACTION`] and [`OVERSHOOT_CPUS`]). A pod that was throttled or
//! used most of its limit exercised it, and if it stayed under, the limit held in that window. A
//! limited pod that never wants its limit leaves the check "not exercised", never "kept": it
//! proves nothing either way. Pods without a limit are never over one.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sked_proto::text::escape_and_cap;

use crate::health;

/// Shortest window judged: over a shorter one the reads and the clock reading, which are not
/// simultaneous, weigh too much.
pub const MIN_WINDOW: Duration = Duration::from_secs(1);
/// Overshoot of a limit tolerated, as a fraction of it. CFS hands a cgroup its quota once per
/// period, so a window whose ends fall inside periods can hold one period's quota more than its
/// length allows: 10 % of the limit at the kubelet's 100 ms period over a 1 s window.
pub const OVERSHOOT_FRACTION: f64 = 0.10;
/// Overshoot tolerated on top, in CPUs: CFS hands runtime to each CPU in slices (5 ms by
/// default, `sched_cfs_bandwidth_slice_us`) that can outlast the quota, and a pod's files are
/// read a little after the clock.
pub const OVERSHOOT_CPUS: f64 = 0.05;
/// Share of its limit a pod that was not throttled must use to have exercised it.
pub const EXERCISED_FRACTION: f64 = 0.9;
/// Most pods over their limit a [`Summary`] lists.
pub const MAX_OVER_LIMIT: usize = 8;
/// Most characters kept of [`Summary::unavailable`].
pub const MAX_UNAVAILABLE_CHARS: usize = 256;
/// Largest cgroup file read (`cpu.stat` is a few hundred bytes); a larger one is an error.
const MAX_FILE: u64 = 4 * 1024;
/// The top directory of each cgroup driver's layout, with its QoS directories.
const LAYOUTS: [(&str, [&str; 2]); 2] = [
    ("kubepods.slice", ["kubepods-burstable.slice", "kubepods-besteffort.slice"]),
    ("kubepods", ["burstable", "besteffort"]),
];

/// A pod's quality-of-service class, which puts its cgroup under a different parent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Qos {
    /// Every container's requests equal its limits; the pod's cgroup is right under the top.
    Guaranteed,
    /// Some request or limit set, not Guaranteed.
    Burstable,
    /// No request or limit at all.
    BestEffort,
}

impl Qos {
    /// The directory holding the class's pods under the systemd driver and the cgroupfs driver.
    fn parents(self) -> (&'static str, &'static str) {
        match self {
            Qos::Guaranteed => ("kubepods.slice", "kubepods"),
            Qos::Burstable => ("kubepods-burstable.slice", "burstable"),
            Qos::BestEffort => ("kubepods-besteffort.slice", "besteffort"),
        }
    }
}

/// The uid (dashed, as the API shows it) and QoS class of the pod whose cgroup directory is
/// `dir_name` in the directory `parent`, under either driver; `None` for anything else (a QoS
/// directory, a container's, a malformed uid, a pod directory under the wrong parent). Only the
/// 36-character lowercase form of a uid is taken.
pub fn pod_uid(parent: &str, dir_name: &str) -> Option<(String, Qos)> {
    if let Some(unit) = dir_name.strip_suffix(".slice") {
        let (qos, escaped) = if let Some(uid) = unit.strip_prefix("kubepods-burstable-pod") {
            (Qos::Burstable, uid)
        } else if let Some(uid) = unit.strip_prefix("kubepods-besteffort-pod") {
            (Qos::BestEffort, uid)
        } else {
            (Qos::Guaranteed, unit.strip_prefix("kubepods-pod")?)
        };
        if qos.parents().0 != parent {
            return None;
        }
        Some((uid(escaped, b'_')?, qos))
    } else {
        let escaped = dir_name.strip_prefix("pod")?;
        let qos = [Qos::Guaranteed, Qos::Burstable, Qos::BestEffort].into_iter().find(|q| q.parents().1 == parent)?;
        Some((uid(escaped, b'-')?, qos))
    }
}

/// `text` as a dashed uid, when it is 8-4-4-4-12 lowercase hex digits joined by `separator`.
fn uid(text: &str, separator: u8) -> Option<String> {
    let bytes = text.as_bytes();
    let well_formed = bytes.len() == 36
        && bytes.iter().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => *b == separator,
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(b),
        });
    well_formed.then(|| text.replace(char::from(separator), "-"))
}

/// A pod's cgroup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pod {
    /// The pod's uid, dashed.
    pub uid: String,
    /// The pod's QoS class, from where its cgroup is.
    pub qos: Qos,
    /// The pod's cgroup directory.
    pub dir: PathBuf,
}

/// The pod cgroups [`find_pods`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodList {
    /// The pods of the lowest uids, at most the `max` asked for, sorted by uid.
    pub pods: Vec<Pod>,
    /// How many pod cgroups were found.
    pub found: usize,
    /// More pods were found than are listed.
    pub truncated: bool,
    /// Neither `kubepods.slice` nor `kubepods` is a directory under the root.
    pub no_kubepods: bool,
    /// The first directory that could not be listed, and why.
    pub error: Option<String>,
}

/// Lists the pod cgroups under the cgroup2 root `root` (see the module's documentation for the
/// layouts; nothing else is walked, so at most three levels deep): at most `max`, those of the
/// lowest uids.
pub fn find_pods(root: &Path, max: usize) -> PodList {
    let mut pods = BTreeMap::new();
    let mut list = PodList { no_kubepods: true, ..PodList::default() };
    let mut add = |parent: &str, dir: &Path, name: &str, list: &mut PodList| {
        let Some((uid, qos)) = pod_uid(parent, name) else { return };
        if pods.contains_key(&uid) {
            return;
        }
        list.found += 1;
        pods.insert(uid.clone(), Pod { uid, qos, dir: dir.join(name) });
        if pods.len() > max {
            pods.pop_last();
        }
    };
    for (top, qos_dirs) in LAYOUTS {
        let top_dir = root.join(top);
        if !top_dir.is_dir() {
            continue;
        }
        list.no_kubepods = false;
        for child in subdirs(&top_dir, &mut list.error) {
            if !qos_dirs.contains(&child.as_str()) {
                add(top, &top_dir, &child, &mut list);
                continue;
            }
            let qos_dir = top_dir.join(&child);
            for name in subdirs(&qos_dir, &mut list.error) {
                add(&child, &qos_dir, &name, &mut list);
            }
        }
    }
    list.pods = pods.into_values().collect();
    list.truncated = list.found > list.pods.len();
    list
}

/// The names of the directories in `dir` (those that are UTF-8); the first listing that fails
/// is noted in `error`.
fn subdirs(dir: &Path, error: &mut Option<String>) -> Vec<String> {
    match fs::read_dir(dir) {
        Ok(entries) => entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .collect(),
        Err(e) => {
            error.get_or_insert_with(|| format!("{}: {e}", dir.display()));
            Vec::new()
        }
    }
}

/// A cgroup's `cpu.max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuMax {
    /// CPU time allowed per period, in microseconds; `None` for `max` (no limit).
    pub quota_us: Option<u64>,
    /// The period, in microseconds (never 0).
    pub period_us: u64,
}

/// Parses `cpu.max`: `max <period>` or `<quota> <period>`, in microseconds, neither 0.
pub fn parse_cpu_max(text: &str) -> Option<CpuMax> {
    let mut fields = text.split_whitespace();
    let (quota, period) = (fields.next()?, fields.next()?);
    if fields.next().is_some() {
        return None;
    }
    let period_us = period.parse::<u64>().ok().filter(|p| *p > 0)?;
    let quota_us = match quota {
        "max" => None,
        quota => Some(quota.parse::<u64>().ok().filter(|q| *q > 0)?),
    };
    Some(CpuMax { quota_us, period_us })
}

/// The counters of `cpu.stat` that [`judge`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuStat {
    /// `usage_usec`: CPU time the cgroup's tasks used.
    pub usage_us: u64,
    /// `nr_throttled`: periods in which the cgroup ran out of quota.
    pub nr_throttled: u64,
    /// `throttled_usec`: time the cgroup spent throttled.
    pub throttled_us: u64,
}

/// Parses `cpu.stat`; `None` unless it has all three counters, as numbers.
pub fn parse_cpu_stat(text: &str) -> Option<CpuStat> {
    let (mut usage_us, mut nr_throttled, mut throttled_us) = (None, None, None);
    for line in text.lines() {
        let Some((key, value)) = line.split_once(' ') else { continue };
        let slot = match key {
            "usage_usec" => &mut usage_us,
            "nr_throttled" => &mut nr_throttled,
            "throttled_usec" => &mut throttled_us,
            _ => continue,
        };
        *slot = Some(value.trim().parse::<u64>().ok()?);
    }
    Some(CpuStat { usage_us: usage_us?, nr_throttled: nr_throttled?, throttled_us: throttled_us? })
}

/// Parses `cpu.pressure`: the `total=` (microseconds) of its `some` line.
pub fn parse_pressure_some_total(text: &str) -> Option<u64> {
    health::parse_pressure(text).ok()
}

/// Parses `cpu.weight`: 1 to 10000.
pub fn parse_weight(text: &str) -> Option<u64> {
    text.trim().parse::<u64>().ok().filter(|w| (1..=10_000).contains(w))
}

/// One reading of a pod's cgroup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reading {
    /// `cpu.max`'s quota in microseconds per period; `None`: no limit.
    pub quota_us: Option<u64>,
    /// `cpu.max`'s period in microseconds.
    pub period_us: u64,
    /// `cpu.weight`; `None` when it cannot be read.
    pub weight: Option<u64>,
    /// `cpu.stat`'s `usage_usec`.
    pub usage_us: u64,
    /// `cpu.stat`'s `nr_throttled`.
    pub nr_throttled: u64,
    /// `cpu.stat`'s `throttled_usec`.
    pub throttled_us: u64,
    /// `cpu.pressure`'s `some` total in microseconds; `None` when it cannot be read (PSI off).
    pub pressure_some_us: Option<u64>,
}

/// Reads the pod cgroup `dir`. `cpu.max` and `cpu.stat` must be read; `cpu.weight` and
/// `cpu.pressure` are left `None` when they cannot be (PSI off for the node or the cgroup),
/// but any file read that is malformed is an error. Each error names its file.
pub fn read_pod(dir: &Path) -> Result<Reading, String> {
    let max = read_required(dir, "cpu.max", parse_cpu_max)?;
    let stat = read_required(dir, "cpu.stat", parse_cpu_stat)?;
    Ok(Reading {
        quota_us: max.quota_us,
        period_us: max.period_us,
        weight: read_optional(dir, "cpu.weight", parse_weight)?,
        usage_us: stat.usage_us,
        nr_throttled: stat.nr_throttled,
        throttled_us: stat.throttled_us,
        pressure_some_us: read_optional(dir, "cpu.pressure", parse_pressure_some_total)?,
    })
}

/// Reads and parses `dir/name`, which must be read.
fn read_required<T>(dir: &Path, name: &str, parse: fn(&str) -> Option<T>) -> Result<T, String> {
    let path = dir.join(name);
    let text = read_small(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    parsed(&path, &text, parse)
}

/// Reads and parses `dir/name`: `None` when it cannot be read.
fn read_optional<T>(dir: &Path, name: &str, parse: fn(&str) -> Option<T>) -> Result<Option<T>, String> {
    let path = dir.join(name);
    let Ok(text) = read_small(&path) else { return Ok(None) };
    parsed(&path, &text, parse).map(Some)
}

/// `parse(text)`, or an error naming `path` and showing the text.
fn parsed<T>(path: &Path, text: &str, parse: fn(&str) -> Option<T>) -> Result<T, String> {
    parse(text).ok_or_else(|| format!("{}: malformed: {:?}", path.display(), escape_and_cap(text.trim(), 80)))
}

/// Reads a file of at most [`MAX_FILE`] bytes (lossily as UTF-8); a larger one is an error.
fn read_small(path: &Path) -> io::Result<String> {
    health::read_at_most(path, MAX_FILE)
}

/// What two readings of a pod say.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PodWindow {
    /// CPUs the pod used on average over the window.
    pub used_cpus: f64,
    /// The pod's limit in CPUs (the higher of the two readings', should it have been resized);
    /// `None` when it had none at either end.
    pub limit_cpus: Option<f64>,
    /// The pod ran out of quota at least once.
    pub throttled: bool,
    /// The pod used more than its limit and the overshoot CFS allows: the limit was not kept.
    pub over_limit: bool,
    /// The pod has a limit and was over it, throttled, or used [`EXERCISED_FRACTION`] of it.
    pub exercised: bool,
}

/// The window from `before` to `after`, `elapsed` apart; `None` when it is shorter than
/// [`MIN_WINDOW`] or a counter went backwards (the cgroup was made anew).
pub fn judge(before: &Reading, after: &Reading, elapsed: Duration) -> Option<PodWindow> {
    if elapsed < MIN_WINDOW || went_backwards(before, after) {
        return None;
    }
    let used_cpus = after.usage_us.saturating_sub(before.usage_us) as f64 / elapsed.as_micros() as f64;
    let limit_cpus = limit_of(before).zip(limit_of(after)).map(|(a, b)| a.max(b));
    let throttled = after.nr_throttled > before.nr_throttled;
    let over_limit = limit_cpus.is_some_and(|l| used_cpus > l * (1.0 + OVERSHOOT_FRACTION) + OVERSHOOT_CPUS);
    let exercised = limit_cpus.is_some_and(|l| over_limit || throttled || used_cpus >= EXERCISED_FRACTION * l);
    Some(PodWindow { used_cpus, limit_cpus, throttled, over_limit, exercised })
}

/// A reading's limit in CPUs.
fn limit_of(reading: &Reading) -> Option<f64> {
    let quota = reading.quota_us?;
    (reading.period_us > 0).then(|| quota as f64 / reading.period_us as f64)
}

/// Whether a cumulative counter is lower in `after` than in `before`.
fn went_backwards(before: &Reading, after: &Reading) -> bool {
    after.usage_us < before.usage_us
        || after.nr_throttled < before.nr_throttled
        || after.throttled_us < before.throttled_us
}

/// A pod measured above its limit.
#[derive(Clone, Debug, PartialEq)]
pub struct OverLimit {
    /// The pod's uid.
    pub uid: String,
    /// CPUs it used (see [`PodWindow::used_cpus`]).
    pub used_cpus: f64,
    /// Its limit in CPUs.
    pub limit_cpus: f64,
}

/// One sample of the node's pods. Counts are of the pods judged in this sample (those with a
/// window: read now and at least [`MIN_WINDOW`] before), except `pods`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    /// Pod cgroups found (more than were read when `truncated`).
    pub pods: u32,
    /// Pods judged.
    pub judged: u32,
    /// Pods judged that have a CPU limit.
    pub limited: u32,
    /// Pods judged whose limit was exercised (see [`PodWindow::exercised`]).
    pub exercised: u32,
    /// Pods judged that were throttled.
    pub throttled: u32,
    /// Pods judged over their limit.
    pub over_limit_pods: u32,
    /// Of those, at most [`MAX_OVER_LIMIT`], the most CPUs over their limit first.
    pub over_limit: Vec<OverLimit>,
    /// Distinct `cpu.weight` values among the pods judged.
    pub distinct_weights: u32,
    /// More pods were found than the sampler reads.
    pub truncated: bool,
    /// Why nothing could be read (escaped, at most [`MAX_UNAVAILABLE_CHARS`] characters).
    pub unavailable: Option<String>,
}

/// Samples the pods under a cgroup2 root, judging each against its previous reading.
#[derive(Debug)]
pub struct Sampler {
    root: PathBuf,
    max_pods: usize,
    /// Each pod's baseline: when it was read, and the reading.
    previous: HashMap<String, (Duration, Reading)>,
}

impl Sampler {
    /// A sampler of at most `max_pods` pods (those of the lowest uids) under the cgroup2 root
    /// `root` (the host's, mounted into the agent).
    pub fn new(root: PathBuf, max_pods: usize) -> Self {
        Self { root, max_pods, previous: HashMap::new() }
    }

    /// Lists and reads the pods, the monotonic clock reading `monotonic` (from any fixed origin)
    /// just taken. A pod seen first has no window yet; a pod read less than [`MIN_WINDOW`]
    /// after its baseline keeps it; one whose counters went backwards (its cgroup made anew),
    /// or that could not be read, starts again; pods gone are forgotten.
    /// Forgets every pod's previous reading: the next sample starts new windows. Called when the
    /// node's scheduler changes, so no window spans two schedulers.
    pub fn forget(&mut self) {
        self.previous.clear();
    }

    pub fn sample(&mut self, monotonic: Duration) -> Summary {
        let list = find_pods(&self.root, self.max_pods);
        let mut summary = Summary { pods: count(list.found), truncated: list.truncated, ..Summary::default() };
        let mut previous = std::mem::take(&mut self.previous);
        let mut windows = Vec::new();
        let mut first_error = None;
        for pod in &list.pods {
            match read_pod(&pod.dir) {
                Ok(reading) => {
                    let (baseline, window) = advance(previous.remove(&pod.uid), monotonic, reading);
                    windows.extend(window.map(|w| (pod.uid.clone(), reading.weight, w)));
                    self.previous.insert(pod.uid.clone(), baseline);
                }
                Err(why) => {
                    first_error.get_or_insert(why);
                }
            }
        }
        tally(&mut summary, &windows);
        let why = if !self.root.is_dir() {
            Some(format!("{}: not a directory: is the host's cgroup2 tree mounted?", self.root.display()))
        } else if list.no_kubepods {
            Some(format!("no kubepods cgroup under {}: is the host's cgroup2 tree mounted?", self.root.display()))
        } else if list.pods.is_empty() {
            list.error
        } else if self.previous.is_empty() {
            first_error.map(|e| format!("no pod cgroup could be read ({} tried): {e}", list.pods.len()))
        } else {
            None
        };
        summary.unavailable = why.map(|why| escape_and_cap(&why, MAX_UNAVAILABLE_CHARS));
        summary
    }
}

/// A pod's new baseline and window, from its baseline (if any) and its reading at `now`.
fn advance(
    baseline: Option<(Duration, Reading)>,
    now: Duration,
    reading: Reading,
) -> ((Duration, Reading), Option<PodWindow>) {
    let Some((then, before)) = baseline else { return ((now, reading), None) };
    match now.checked_sub(then) {
        Some(elapsed) if elapsed < MIN_WINDOW && !went_backwards(&before, &reading) => ((then, before), None),
        Some(elapsed) => ((now, reading), judge(&before, &reading, elapsed)),
        None => ((now, reading), None),
    }
}

/// Adds the pods' windows (uid, weight, window) to `summary`'s counts.
fn tally(summary: &mut Summary, windows: &[(String, Option<u64>, PodWindow)]) {
    let mut weights = BTreeSet::new();
    let mut over = Vec::new();
    for (uid, weight, window) in windows {
        weights.extend(*weight);
        summary.limited += u32::from(window.limit_cpus.is_some());
        summary.exercised += u32::from(window.exercised);
        summary.throttled += u32::from(window.throttled);
        if let Some(limit_cpus) = window.limit_cpus.filter(|_| window.over_limit) {
            over.push(OverLimit { uid: uid.clone(), used_cpus: window.used_cpus, limit_cpus });
        }
    }
    over.sort_by(|a, b| {
        (b.used_cpus - b.limit_cpus).total_cmp(&(a.used_cpus - a.limit_cpus)).then_with(|| a.uid.cmp(&b.uid))
    });
    summary.judged = count(windows.len());
    summary.over_limit_pods = count(over.len());
    summary.distinct_weights = count(weights.len());
    over.truncate(MAX_OVER_LIMIT);
    summary.over_limit = over;
}

/// `n` as a count on the wire.
fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Most pods one sample reads: a node runs at most a few hundred (the kubelet's default
/// `maxPods` is 110), and the pods beyond it are counted, not read.
pub const MAX_PODS: usize = 512;

impl Summary {
    /// The summary as a report carries it, over a window of `window`.
    pub fn to_wire(&self, window: Duration) -> sked_proto::PodCpu {
        sked_proto::PodCpu {
            pods: self.pods,
            limited: self.limited,
            exercised: self.exercised,
            throttled: self.throttled,
            over_limit: self
                .over_limit
                .iter()
                .map(|o| sked_proto::PodOverLimit {
                    uid: o.uid.clone(),
                    used_cpus: o.used_cpus,
                    limit_cpus: o.limit_cpus,
                })
                .collect(),
            distinct_weights: self.distinct_weights,
            truncated: self.truncated,
            unavailable: self.unavailable.clone().unwrap_or_default(),
            window_ms: u32::try_from(window.as_millis()).unwrap_or(u32::MAX),
        }
    }
}

/// The scheduler instance a window is read under: the kernel's `enable_seq` and the ops name.
pub type Instance = (Option<u64>, Option<String>);

/// The sampler as the agent runs it: the windows start again whenever the node's scheduler
/// changes, and a sample is published only once it has windows (or says why nothing can be
/// read), so a summary never mixes two schedulers.
#[derive(Debug)]
pub struct Watch {
    sampler: Sampler,
    under: Option<Instance>,
    /// The next sample has no windows yet (the first, or the first under a new scheduler).
    fresh: bool,
}

/// What one tick of a [`Watch`] publishes.
#[derive(Debug, PartialEq)]
pub struct Tick {
    /// The scheduler changed: what was published before is withdrawn.
    pub withdrawn: bool,
    /// The new summary, when there is one to publish.
    pub summary: Option<Summary>,
}

impl Watch {
    pub fn new(sampler: Sampler) -> Self {
        Self { sampler, under: None, fresh: true }
    }

    /// Samples under the scheduler instance `now`, at `monotonic`.
    pub fn tick(&mut self, now: Instance, monotonic: Duration) -> Tick {
        let withdrawn = self.under.as_ref().is_some_and(|under| *under != now);
        if withdrawn {
            self.sampler.forget();
            self.fresh = true;
        }
        self.under = Some(now);
        let summary = self.sampler.sample(monotonic);
        let publish = !std::mem::take(&mut self.fresh) || summary.unavailable.is_some();
        Tick { withdrawn, summary: publish.then_some(summary) }
    }
}

/// Samples the pods under `root` every `interval` for as long as the task runs, as a [`Watch`]
/// under the scheduler `observed` shows, publishing on `tx` with that scheduler (the report
/// streams read the newest, and send it only with an observation of the same scheduler; `None`
/// while there is nothing to say of the current one) and in the agent's metrics.
/// The reads run on a blocking thread: a node's few hundred small files take milliseconds, but
/// they are file reads all the same.
pub async fn run(
    root: PathBuf,
    interval: Duration,
    tx: tokio::sync::watch::Sender<Option<(Instance, sked_proto::PodCpu)>>,
    observed: tokio::sync::watch::Receiver<crate::observation::Observation>,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
) {
    let origin = std::time::Instant::now();
    let watch = std::sync::Arc::new(std::sync::Mutex::new(Watch::new(Sampler::new(root, MAX_PODS))));
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut told: Option<Option<String>> = None;
    loop {
        tick.tick().await;
        let now = {
            let o = observed.borrow();
            (o.read.enable_seq, o.read.ops.clone())
        };
        let watch = watch.clone();
        let under = now.clone();
        let ticked = tokio::task::spawn_blocking(move || crate::lock(&watch).tick(now, origin.elapsed())).await;
        let Ok(Tick { withdrawn, summary }) = ticked else { continue };
        if withdrawn {
            tx.send_replace(None);
            metrics.pods_sampled(0, 0, 0);
        }
        let Some(summary) = summary else { continue };
        if told.as_ref() != Some(&summary.unavailable) {
            match &summary.unavailable {
                None => tracing::info!(pods = summary.pods, "reading the pods' CPU limits and usage"),
                Some(why) => tracing::warn!(reason = %why, "the pods' CPU limits and usage cannot be read"),
            }
            told = Some(summary.unavailable.clone());
        }
        metrics.pods_sampled(summary.limited, summary.exercised, summary.over_limit_pods);
        tx.send_replace(Some((under, summary.to_wire(interval))));
    }
}

#[cfg(test)]
mod tests;
