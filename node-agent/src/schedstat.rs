//! `/proc/schedstat`'s CPU lines, and what two readings of them say about the node's CPUs.
//!
//! Of a `cpu<N>` line the last three numbers are, per the kernel's
//! Documentation/scheduler/sched-stats.rst (fields 7, 8 and 9 in versions 15 to 17): the time
//! tasks ran on the CPU and the time tasks waited on its run queue (run delay), both in
//! nanoseconds, and the timeslices run on it. Over an interval they give:
//!
//! - run delay per timeslice: a latency signal, which a scheduler's slice length moves as much
//!   as any harm does;
//! - the slice-neutral signals: waiting tasks per CPU (Little's law: the time tasks waited over
//!   the time that passed), utilisation, timeslices per CPU-second, and CPUs left idle while
//!   tasks waited.

use std::time::Duration;

use sked_proto::text::escape_and_cap;

/// Fewest counters after `cpu<N>` in a CPU line (versions 15 to 17 have 9).
const CPU_FIELDS: usize = 9;

/// One `cpu<N>` line's cumulative counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuCounters {
    /// N of `cpu<N>`.
    pub cpu: u32,
    /// Time tasks ran on the CPU, in nanoseconds.
    pub running_ns: u64,
    /// Time tasks waited on the CPU's run queue, in nanoseconds.
    pub run_delay_ns: u64,
    /// Timeslices run on the CPU.
    pub timeslices: u64,
}

/// Parses `/proc/schedstat` into its CPU lines' counters, in the file's order.
///
/// Only the CPU lines are read, so every version of the format parses (the `version`,
/// `timestamp` and `domain<N>` lines differ between them): of a CPU line the last three numbers
/// are running time, run delay and timeslices. A CPU line with fewer than 9 counters, or one
/// that is not numbers, makes the whole file an error (a CPU left out would read as a drop), as
/// does a file without CPU lines.
pub fn parse(text: &str) -> Result<Vec<CpuCounters>, String> {
    let mut cpus = Vec::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let Some(name) = fields.next() else { continue };
        let Some(number) = name.strip_prefix("cpu").filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let malformed = || format!("malformed line {:?}", escape_and_cap(line, 80));
        let cpu = number.parse::<u32>().map_err(|_| malformed())?;
        let numbers: Vec<u64> = fields.map(str::parse::<u64>).collect::<Result<_, _>>().map_err(|_| malformed())?;
        match numbers[..] {
            [.., running_ns, run_delay_ns, timeslices] if numbers.len() >= CPU_FIELDS => {
                cpus.push(CpuCounters { cpu, running_ns, run_delay_ns, timeslices })
            }
            _ => return Err(malformed()),
        }
    }
    if cpus.is_empty() {
        return Err("no cpu lines".to_owned());
    }
    Ok(cpus)
}

/// What the CPU lines say about one interval; each signal is unset when unknown, never zero.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuSignals {
    /// Run delay over timeslices, in microseconds: the mean wait per timeslice (unset when no
    /// timeslice ran).
    pub run_delay_us: Option<f64>,
    /// Run delay over (wall time x CPUs): the mean number of tasks waiting per CPU.
    pub waiting_per_cpu: Option<f64>,
    /// Running time over (wall time x CPUs), 0 to 1.
    pub utilisation: Option<f64>,
    /// Timeslices over (wall seconds x CPUs).
    pub switches_per_cpu_second: Option<f64>,
    /// The smaller of the CPUs' idle time (wall time x CPUs less their running time, at least
    /// 0) and the tasks' waiting time, over (wall time x CPUs), 0 to 1. Idle is taken over all
    /// CPUs at once: schedstat credits running time when a timeslice ends, so with long slices
    /// one CPU shows more running time than the interval and another none; clamped per CPU,
    /// that would read as idle time that never was.
    pub idle_while_waiting: Option<f64>,
}

/// The signals of the interval of `wall` (monotonic) from `before` to `after`, over the CPUs
/// read at both ends. Every signal is unset when the two readings differ in their CPU lines (a
/// CPU went offline or came online: a different count, or other CPUs); each is unset when a
/// counter it is made of went backwards on a CPU; all but run delay per timeslice are unset
/// when no time passed.
pub fn signals(before: &[CpuCounters], after: &[CpuCounters], wall: Duration) -> CpuSignals {
    let same_cpus =
        !after.is_empty() && before.len() == after.len() && before.iter().zip(after).all(|(b, a)| b.cpu == a.cpu);
    if !same_cpus {
        return CpuSignals::default();
    }
    // Per CPU, how much a counter grew; `None` when it went backwards on any CPU.
    let growth = |field: fn(&CpuCounters) -> u64| -> Option<Vec<f64>> {
        before.iter().zip(after).map(|(b, a)| field(a).checked_sub(field(b)).map(|g| g as f64)).collect()
    };
    let total = |v: &[f64]| v.iter().sum::<f64>();
    let running = growth(|c| c.running_ns);
    let waited = growth(|c| c.run_delay_ns);
    let slices = growth(|c| c.timeslices);
    let run_delay_us = match (&waited, &slices) {
        (Some(waited), Some(slices)) if total(slices) > 0.0 => Some(total(waited) / total(slices) / 1000.0),
        _ => None,
    };
    let wall_ns = wall.as_nanos() as f64;
    if wall_ns <= 0.0 {
        return CpuSignals { run_delay_us, ..CpuSignals::default() };
    }
    let cpus = after.len() as f64;
    let idle_while_waiting = match (&running, &waited) {
        (Some(running), Some(waited)) => {
            let idle = (cpus - total(running) / wall_ns).max(0.0);
            let waiting = total(waited) / wall_ns;
            Some((idle.min(waiting) / cpus).clamp(0.0, 1.0))
        }
        _ => None,
    };
    CpuSignals {
        run_delay_us,
        waiting_per_cpu: waited.map(|w| total(&w) / (wall_ns * cpus)),
        utilisation: running.map(|r| (total(&r) / (wall_ns * cpus)).clamp(0.0, 1.0)),
        switches_per_cpu_second: slices.map(|s| total(&s) / (wall.as_secs_f64() * cpus)),
        idle_while_waiting,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn cpu(cpu: u32, running_ns: u64, run_delay_ns: u64, timeslices: u64) -> CpuCounters {
        CpuCounters { cpu, running_ns, run_delay_ns, timeslices }
    }

    /// Approximately equal (the signals are ratios of floats).
    fn near(value: Option<f64>, expected: f64) -> bool {
        value.is_some_and(|v| (v - expected).abs() < 1e-9)
    }

    const SECOND: u64 = 1_000_000_000;

    #[test]
    fn every_cpu_line_of_either_version_is_read() {
        assert_eq!(
            parse(SCHEDSTAT_V15),
            Ok(vec![cpu(0, 1145744436187, 63395567468, 5623213), cpu(1, 1121946046392, 36604432532, 4911787)])
        );
        assert_eq!(
            parse(SCHEDSTAT_V17),
            Ok(vec![cpu(0, 38553488226, 8219683893, 129898), cpu(1, 37070283404, 5916236203, 120117)])
        );
        // A future version with more counters: the last three are still the ones read.
        assert_eq!(parse("version 18\ncpu7 9 9 9 9 9 9 9 9 1 2 3\n"), Ok(vec![cpu(7, 1, 2, 3)]));
    }

    #[test]
    fn a_malformed_schedstat_is_an_error_not_fewer_cpus() {
        let short = "version 15\ncpu0 0 0 0 0 0 0 1 2 3\ncpu1 0 0 0 0 1 2 3\n";
        assert!(parse(short).unwrap_err().contains("cpu1"));
        assert!(parse("cpu0 0 0 0 0 0 0 1 x 3\n").is_err());
        assert!(parse("cpu99999999999 0 0 0 0 0 0 1 2 3\n").is_err(), "a CPU number past u32");
        assert_eq!(parse("version 15\ntimestamp 1\n"), Err("no cpu lines".to_owned()));
        assert!(parse("").is_err());
    }

    #[test]
    fn two_cpus_at_sixty_percent_give_each_signal() {
        // 2 s over 2 CPUs: each ran 1.2 s (60 %), its tasks waited 0.6 s (0.3 waiting), and ran
        // 2,000 timeslices (1,000 a CPU-second).
        let before = [cpu(0, 10 * SECOND, SECOND, 5000), cpu(1, 20 * SECOND, 2 * SECOND, 7000)];
        let after = [cpu(0, 11_200_000_000, 1_600_000_000, 7000), cpu(1, 21_200_000_000, 2_600_000_000, 9000)];
        let s = signals(&before, &after, Duration::from_secs(2));
        assert!(near(s.utilisation, 0.6), "{s:?}");
        assert!(near(s.waiting_per_cpu, 0.3), "{s:?}");
        assert!(near(s.switches_per_cpu_second, 1000.0), "{s:?}");
        // 1.2 s waited over 4,000 timeslices: 300 µs each.
        assert!(near(s.run_delay_us, 300.0), "{s:?}");
        // Idle 0.8 CPU (0.4 each), waiting 0.6 tasks: the smaller over 2 CPUs.
        assert!(near(s.idle_while_waiting, 0.3), "{s:?}");
    }

    #[test]
    fn idle_while_waiting_is_zero_on_busy_cpus_and_not_beside_an_idle_one() {
        let before = [cpu(0, 0, 0, 0), cpu(1, 0, 0, 0)];
        // Both CPUs ran the whole second and tasks waited on both: no CPU was idle.
        let busy = [cpu(0, SECOND, SECOND, 1000), cpu(1, SECOND, 2 * SECOND, 1000)];
        let s = signals(&before, &busy, Duration::from_secs(1));
        assert_eq!(s.idle_while_waiting, Some(0.0), "{s:?}");
        assert!(near(s.utilisation, 1.0) && near(s.waiting_per_cpu, 1.5), "{s:?}");
        // CPU 1 idled the whole second while two tasks waited on CPU 0: stranded.
        let stranded = [cpu(0, SECOND, 2 * SECOND, 1000), cpu(1, 0, 0, 0)];
        let s = signals(&before, &stranded, Duration::from_secs(1));
        assert!(near(s.idle_while_waiting, 0.5), "{s:?}");
        assert!(near(s.utilisation, 0.5), "{s:?}");
        // A CPU credited more running time than the interval (a long timeslice that ended in
        // it) lends it to the other's idle time: what schedstat credited late was run, not idle.
        let over = [cpu(0, 1_100_000_000, SECOND, 1000), cpu(1, 0, 0, 0)];
        let s = signals(&before, &over, Duration::from_secs(1));
        assert!(near(s.idle_while_waiting, 0.45), "{s:?}");
        assert!(near(s.utilisation, 0.55), "{s:?}");
        let too_busy = [cpu(0, 3 * SECOND, 0, 1), cpu(1, 3 * SECOND, 0, 1)];
        assert_eq!(signals(&before, &too_busy, Duration::from_secs(1)).utilisation, Some(1.0), "clamped");
    }

    #[test]
    fn a_change_of_cpus_leaves_the_per_cpu_signals_unset() {
        let before = [cpu(0, 0, 0, 0), cpu(1, 0, 0, 0)];
        let hotplugged = [cpu(0, SECOND, SECOND, 1000), cpu(1, SECOND, SECOND, 1000), cpu(2, 0, 0, 0)];
        let s = signals(&before, &hotplugged, Duration::from_secs(1));
        assert_eq!(s, CpuSignals::default(), "a CPU that came online adds its old counters to any sum");
        let fewer = signals(&before, &hotplugged[..1], Duration::from_secs(1));
        assert_eq!((fewer.utilisation, fewer.waiting_per_cpu), (None, None), "{fewer:?}");
        // As many CPUs, but another one: CPU 1 went offline and CPU 2 came online.
        let swapped = [cpu(0, SECOND, SECOND, 1000), cpu(2, SECOND, SECOND, 1000)];
        let s = signals(&before, &swapped, Duration::from_secs(1));
        assert_eq!((s.utilisation, s.idle_while_waiting), (None, None), "{s:?}");
    }

    #[test]
    fn counters_going_backwards_or_no_time_leave_signals_unset() {
        let before = [cpu(0, 5 * SECOND, 5 * SECOND, 5000), cpu(1, 5 * SECOND, 5 * SECOND, 5000)];
        // CPU 1's running time went backwards: utilisation and idle-while-waiting are unknown,
        // the signals of the other counters are not.
        let back = [cpu(0, 6 * SECOND, 6 * SECOND, 6000), cpu(1, 4 * SECOND, 6 * SECOND, 6000)];
        let s = signals(&before, &back, Duration::from_secs(1));
        assert_eq!((s.utilisation, s.idle_while_waiting), (None, None), "{s:?}");
        assert!(near(s.waiting_per_cpu, 1.0) && near(s.switches_per_cpu_second, 1000.0), "{s:?}");
        let fewer_slices = [cpu(0, 6 * SECOND, 6 * SECOND, 6000), cpu(1, 6 * SECOND, 6 * SECOND, 4999)];
        let s = signals(&before, &fewer_slices, Duration::from_secs(1));
        assert_eq!((s.switches_per_cpu_second, s.run_delay_us), (None, None), "though their sum grew: {s:?}");
        assert!(near(s.utilisation, 1.0), "{s:?}");
        let less_delay = [cpu(0, 6 * SECOND, 4 * SECOND, 6000), cpu(1, 6 * SECOND, 6 * SECOND, 6000)];
        let s = signals(&before, &less_delay, Duration::from_secs(1));
        assert_eq!((s.waiting_per_cpu, s.idle_while_waiting), (None, None), "{s:?}");
        // No time passed: nothing per wall time is known (not 0, not infinite).
        let s = signals(&before, &back, Duration::ZERO);
        let per_cpu = (s.waiting_per_cpu, s.utilisation, s.switches_per_cpu_second, s.idle_while_waiting);
        assert_eq!(per_cpu, (None, None, None, None), "{s:?}");
        // An idle interval is a known zero, except run delay per timeslice (no timeslice ran).
        let s = signals(&before, &before, Duration::from_secs(1));
        assert_eq!((s.utilisation, s.waiting_per_cpu, s.switches_per_cpu_second), (Some(0.0), Some(0.0), Some(0.0)));
        assert_eq!((s.idle_while_waiting, s.run_delay_us), (Some(0.0), None));
    }
}
