//! The signals a bake is judged by, and how a change of each is measured.

use crate::analysis::Sample;

/// A scheduling-health signal of a node, from `/proc/schedstat` and `/proc/pressure/cpu`.
///
/// Waiting tasks, idle CPUs beside waiting tasks, utilisation and CPU pressure do not depend
/// on the slice length: a scheduler that runs the same work with longer slices leaves them as
/// they were. Switch rate and run delay per timeslice do (both are per timeslice), so they are
/// judged only when the spec names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Signal {
    WaitingTasks,
    IdleWhileWaiting,
    Utilisation,
    SwitchRate,
    RunDelay,
    CpuPressure,
}

/// How a signal's change from one window to the next is measured.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Scale {
    /// The log of the ratio of the two medians, each with `floor` added (a rise from almost
    /// nothing to a little more is not a rise): changes compose by multiplication.
    Ratio { floor: f64 },
    /// The difference in percentage points (`factor` turns the value into percent), a rise
    /// when `rise` and a fall otherwise.
    Points { factor: f64, rise: bool },
}

impl Signal {
    pub const ALL: [Signal; 6] = [
        Signal::WaitingTasks,
        Signal::IdleWhileWaiting,
        Signal::Utilisation,
        Signal::SwitchRate,
        Signal::RunDelay,
        Signal::CpuPressure,
    ];

    /// The signal's field in `spec.rollout.analysis` and its key in status.
    pub const fn key(self) -> &'static str {
        match self {
            Signal::WaitingTasks => "waitingTasks",
            Signal::IdleWhileWaiting => "idleWhileWaiting",
            Signal::Utilisation => "utilisation",
            Signal::SwitchRate => "switchRate",
            Signal::RunDelay => "runDelay",
            Signal::CpuPressure => "cpuPressure",
        }
    }

    /// The signal of a status key.
    pub fn of_key(key: &str) -> Option<Signal> {
        Signal::ALL.into_iter().find(|s| s.key() == key)
    }

    /// The signal in words.
    pub const fn name(self) -> &'static str {
        match self {
            Signal::WaitingTasks => "waiting tasks per CPU",
            Signal::IdleWhileWaiting => "idle CPUs beside waiting tasks",
            Signal::Utilisation => "CPU utilisation",
            Signal::SwitchRate => "switch rate",
            Signal::RunDelay => "run delay per timeslice",
            Signal::CpuPressure => "CPU pressure",
        }
    }

    const fn scale(self) -> Scale {
        match self {
            Signal::WaitingTasks => Scale::Ratio { floor: 0.05 },
            Signal::SwitchRate => Scale::Ratio { floor: 10.0 },
            Signal::RunDelay => Scale::Ratio { floor: 50.0 },
            Signal::IdleWhileWaiting => Scale::Points { factor: 100.0, rise: true },
            Signal::Utilisation => Scale::Points { factor: 100.0, rise: false },
            Signal::CpuPressure => Scale::Points { factor: 1.0, rise: true },
        }
    }

    /// The limit's unit and field, for a cause: "50 % (spec.rollout.analysis.waitingTasks.maxIncreasePercent)".
    pub fn limit_text(self, limit: f64) -> String {
        let field = match self.scale() {
            Scale::Ratio { .. } => "maxIncreasePercent",
            Scale::Points { rise: true, .. } => "maxIncreasePoints",
            Scale::Points { rise: false, .. } => "maxDecreasePoints",
        };
        let unit = if matches!(self.scale(), Scale::Ratio { .. }) { "%" } else { "points" };
        format!("{limit:.0} {unit} (spec.rollout.analysis.{}.{field})", self.key())
    }

    /// The signal's value in a sample, when known and sane.
    pub fn of(self, s: &Sample) -> Option<f64> {
        match self {
            Signal::WaitingTasks => s.waiting_per_cpu,
            Signal::IdleWhileWaiting => s.idle_while_waiting,
            Signal::Utilisation => s.utilisation,
            Signal::SwitchRate => s.switches_per_cpu_second,
            Signal::RunDelay => s.run_delay_us,
            Signal::CpuPressure => s.cpu_pressure,
        }
        .filter(|v| v.is_finite() && *v >= 0.0)
    }

    /// A value as users read it.
    pub fn show(self, v: f64) -> String {
        match self {
            Signal::WaitingTasks => format!("{v:.2}"),
            Signal::IdleWhileWaiting | Signal::Utilisation => format!("{:.1} %", v * 100.0),
            Signal::SwitchRate => format!("{v:.0}/s"),
            Signal::RunDelay => duration_us(v),
            Signal::CpuPressure => format!("{v:.1} %"),
        }
    }

    /// The change from `before` to `after`, in the signal's measure of change (harm is
    /// positive: a fall of utilisation is a positive change).
    pub fn change(self, before: f64, after: f64) -> f64 {
        match self.scale() {
            Scale::Ratio { floor } => ((after + floor) / (before + floor)).ln(),
            Scale::Points { factor, rise } => (after - before) * factor * if rise { 1.0 } else { -1.0 },
        }
    }

    /// The most a node's change may exceed the controls' change, for a limit in the spec's
    /// unit; times `factor` for the critical bound.
    pub fn bound(self, limit: f64, factor: f64) -> f64 {
        match self.scale() {
            Scale::Ratio { .. } => (factor * limit / 100.0).ln_1p(),
            Scale::Points { .. } => factor * limit,
        }
    }

    /// A change beyond the controls', in the limit's unit: "+140 %" or "+12.5 points".
    pub fn show_excess(self, excess: f64) -> String {
        match self.scale() {
            Scale::Ratio { .. } => format!("{:+.0} %", excess.exp_m1() * 100.0),
            Scale::Points { rise, .. } => format!("{:+.1} points", if rise { excess } else { -excess }),
        }
    }
}

/// A duration in microseconds, in the unit that reads best.
fn duration_us(us: f64) -> String {
    if us >= 1_000_000.0 {
        format!("{:.2} s", us / 1_000_000.0)
    } else if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{us:.0} µs")
    }
}
