//! The judge's error rates on a simulated fleet as uneven as real ones: node load levels
//! log-normal (sigma 0.7), sample noise (sigma 0.2), each node's load drifting between the
//! window before its switch and its bake (sigma 0.1 or 0.2), a fleet-wide change of load over
//! the same time (sigma 0.3, which the controls share), 50 control nodes, 60 samples before the
//! switch and 6 during the bake (the defaults: a 5 s agent interval, a 300 s window, a 30 s
//! bake). Each test plays a thousand or more revisions and asserts the rate against its bound;
//! the rates are printed (`cargo test -p sked-core simulation -- --nocapture`) for the docs.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sked_api::{AnalysisSpec, AnalysisVerdict, IncreasePercent};

use super::*;

/// SplitMix64: a small, seedable generator, so every run plays the same fleets.
pub struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn uniform(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// A standard normal draw (Box-Muller).
    fn normal(&mut self) -> f64 {
        (-2.0 * self.uniform().ln()).sqrt() * (std::f64::consts::TAU * self.uniform()).cos()
    }

    fn lognormal(&mut self, sigma: f64) -> f64 {
        (sigma * self.normal()).exp()
    }
}

/// One simulated fleet's shape.
#[derive(Clone, Copy)]
pub struct Fleet {
    /// Samples during the bake (one each 5 s: 6 for the default 30 s).
    pub bake: i64,
    pub wave: usize,
    pub controls: usize,
    pub drift: f64,
    /// The share of the wave's nodes the revision slows, and by how much (1.0: not at all).
    pub regressed: f64,
    pub factor: f64,
}

const INTERVAL_MS: i64 = 5000;
const BEFORE: i64 = 60;

/// A node's load: tasks waiting per CPU and idle CPUs beside them, before and after the switch.
struct Load {
    waiting: f64,
    idle: f64,
    after_waiting: f64,
    after_idle: f64,
}

fn samples(rng: &mut Rng, load: &Load, bake: i64) -> Vec<Sample> {
    let sample = |rng: &mut Rng, at: i64, waiting: f64, idle: f64| {
        let w = waiting * rng.lognormal(0.2);
        Sample {
            at_ms: at * INTERVAL_MS,
            interval_ms: INTERVAL_MS,
            waiting_per_cpu: Some(w),
            idle_while_waiting: Some((idle * rng.lognormal(0.2)).min(1.0)),
            cpu_pressure: Some(100.0 * (1.0 - (-w).exp())),
            events: Some(BTreeMap::new()),
            ..Sample::default()
        }
    };
    let mut out: Vec<Sample> = (-BEFORE + 1..=0).map(|at| sample(rng, at, load.waiting, load.idle)).collect();
    out.extend((1..=bake).map(|at| sample(rng, at, load.after_waiting, load.after_idle)));
    out
}

/// Plays one revision on a fresh fleet and returns its verdict.
pub fn play(rng: &mut Rng, fleet: Fleet, limits: &Limits) -> AnalysisVerdict {
    let traffic = rng.lognormal(0.3);
    let names: Vec<String> = (0..fleet.wave + fleet.controls).map(|i| format!("n{i}")).collect();
    let mut health = BTreeMap::new();
    for (i, name) in names.iter().enumerate() {
        let slowed = i < fleet.wave && (i as f64) < fleet.regressed * fleet.wave as f64;
        let r = if slowed { fleet.factor } else { 1.0 };
        let waiting = 0.5 * rng.lognormal(0.7);
        let idle = 0.02 * rng.lognormal(0.7);
        let load = Load {
            waiting,
            idle,
            after_waiting: waiting * rng.lognormal(fleet.drift) * traffic * r,
            after_idle: idle * rng.lognormal(fleet.drift) * r,
        };
        health.insert(
            name.clone(),
            NodeHealth { samples: samples(rng, &load, fleet.bake), counters: Vec::new(), contracts: Vec::new() },
        );
    }
    let (wave, controls) = names.split_at(fleet.wave);
    let wave: Vec<&str> = wave.iter().map(String::as_str).collect();
    let controls: Vec<&str> = controls.iter().map(String::as_str).collect();
    let attached: Vec<(&str, i64)> = controls.iter().map(|c| (*c, i64::MIN)).collect();
    let taken_at = Time(jiff::Timestamp::UNIX_EPOCH);
    let baseline = freeze(limits, "r2", taken_at, &wave, &attached, &health);
    let case = Case {
        revision: "r2",
        limits,
        baseline: Some(&baseline),
        from_ms: 0,
        to_ms: fleet.bake * INTERVAL_MS,
        wave,
        controls,
        health: &health,
        may_wait: false,
    };
    match judge(&case) {
        Outcome::Judged(j) => j.verdict,
        Outcome::Waiting => AnalysisVerdict::Inconclusive,
    }
}

/// The share of `runs` revisions on fleets of shape `fleet` that `limits` fails.
pub fn failure_rate(seed: u64, runs: usize, fleet: Fleet, limits: &Limits) -> f64 {
    let mut rng = Rng(seed);
    let failed = (0..runs).filter(|_| play(&mut rng, fleet, limits) == AnalysisVerdict::Failed).count();
    failed as f64 / runs as f64
}

const RUNS: usize = 1000;

fn clean(wave: usize, drift: f64) -> Fleet {
    Fleet { bake: 6, wave, controls: 50, drift, regressed: 0.0, factor: 1.0 }
}

#[test]
fn with_no_regression_at_most_one_revision_in_a_hundred_is_rolled_back() {
    let limits = Limits::of(&AnalysisSpec::default());
    for drift in [0.1, 0.2] {
        for wave in [1, 16, 64, 256] {
            let rate = failure_rate(7 + wave as u64, RUNS, clean(wave, drift), &limits);
            println!("no regression, drift {drift}, wave {wave}: {:.1} % rolled back", rate * 100.0);
            assert!(rate <= 0.01, "drift {drift}, wave {wave}: {:.1} % of good revisions rolled back", rate * 100.0);
        }
    }
}

#[test]
fn a_thirty_percent_regression_on_a_fifth_of_a_wave_is_caught() {
    // A 30 % rise is within the default 50 %: judged at 20 %, with a quorum under the share of
    // the wave it touches, over a 2-minute bake (24 samples: 6 leave each node's median too
    // noisy to tell a 30 % rise on a few nodes from chance).
    let limits = Limits::of(&AnalysisSpec {
        waiting_tasks: Some(IncreasePercent { max_increase_percent: Some(20) }),
        failed_nodes_percent: Some(10),
        ..AnalysisSpec::default()
    });
    let fleet = Fleet { bake: 24, wave: 256, controls: 50, drift: 0.1, regressed: 0.2, factor: 1.3 };
    let caught = failure_rate(11, RUNS, fleet, &limits);
    let false_rate = failure_rate(13, RUNS, Fleet { regressed: 0.0, ..fleet }, &limits);
    println!(
        "30 % on a fifth of 256, drift 0.1, 2-minute bake, limit 20 %, quorum 10 %: caught {:.1} %, no regression rolled back {:.1} %",
        caught * 100.0,
        false_rate * 100.0
    );
    // With 50 controls the controls' median change and spread are estimates every node of the
    // wave is judged against at once: an unlucky pair fails many nodes together, so the bound
    // sits further out to cover it (`Limits::spread_z`) and some partial regressions pass. With
    // more controls (sked keeps up to 200) the estimates settle.
    assert!(caught >= 0.90, "caught {:.1} %", caught * 100.0);
    assert!(false_rate <= 0.02, "false {:.1} %", false_rate * 100.0);
    let many = Fleet { controls: 200, ..fleet };
    let caught = failure_rate(19, RUNS, many, &limits);
    let false_rate = failure_rate(23, RUNS, Fleet { regressed: 0.0, ..many }, &limits);
    println!(
        "the same with 200 controls: caught {:.1} %, no regression rolled back {:.1} %",
        caught * 100.0,
        false_rate * 100.0
    );
    assert!(caught >= 0.95, "caught {:.1} %", caught * 100.0);
    assert!(false_rate <= 0.01, "false {:.1} %", false_rate * 100.0);
}

#[test]
fn a_regression_of_the_whole_wave_is_caught_at_the_defaults() {
    let limits = Limits::of(&AnalysisSpec::default());
    for wave in [1, 16, 256] {
        let fleet = Fleet { bake: 6, wave, controls: 50, drift: 0.1, regressed: 1.0, factor: 2.0 };
        let caught = failure_rate(17 + wave as u64, RUNS, fleet, &limits);
        println!("2x on the whole wave of {wave}, drift 0.1: caught {:.1} %", caught * 100.0);
        // One node is one noisy measurement: its bound sits further out.
        let bound = if wave == 1 { 0.9 } else { 0.95 };
        assert!(caught >= bound, "wave {wave}: caught {:.1} %", caught * 100.0);
    }
}
