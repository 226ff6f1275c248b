//! Arbiter benchmark: 5,000 nodes x 200 Schedulers with overlapping selectors.
//! `cargo bench -p sked-core --bench arbiter` prints the figures (not a timed test).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use sked_core::arbiter::{Arbiter, Claim, assign};

const NODES: usize = 5_000;
const SCHEDULERS: usize = 200;

fn labels(i: usize) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("pool".to_string(), format!("p{}", i % 20)),
        ("zone".to_string(), format!("z{}", i % 5)),
        ("rack".to_string(), format!("r{}", i % 100)),
        ("kubernetes.io/hostname".to_string(), format!("node-{i}")),
    ])
}

/// Overlapping selectors: by pool (20), by zone (5), pool+zone, and a few catch-alls.
fn claims() -> Vec<Claim> {
    (0..SCHEDULERS)
        .map(|i| {
            let selector = match i % 4 {
                0 => BTreeMap::from([("pool".to_string(), format!("p{}", i % 20))]),
                1 => BTreeMap::from([("zone".to_string(), format!("z{}", i % 5))]),
                2 => BTreeMap::from([
                    ("pool".to_string(), format!("p{}", i % 20)),
                    ("zone".to_string(), format!("z{}", i % 5)),
                ]),
                _ if i % 40 == 3 => BTreeMap::new(),
                _ => BTreeMap::from([("rack".to_string(), format!("r{}", i % 100))]),
            };
            Claim {
                name: format!("s{i:03}"),
                uid: format!("u{i}"),
                created: (i as i64 * 7919) % 1000,
                generation: 1,
                selector,
            }
        })
        .collect()
}

fn time<T>(runs: u32, mut f: impl FnMut() -> T) -> Duration {
    let start = Instant::now();
    for _ in 0..runs {
        black_box(f());
    }
    start.elapsed() / runs
}

fn main() {
    let nodes: BTreeMap<String, BTreeMap<String, String>> =
        (0..NODES).map(|i| (format!("node-{i}"), labels(i))).collect();
    let claims = claims();

    let full = time(5, || assign(&claims, &nodes));
    let a = assign(&claims, &nodes);
    let owned: usize = a.values().map(|p| p.owned.len()).sum();
    let lost: usize = a.values().map(|p| p.lost.len()).sum();
    println!("assign (full recompute), {NODES} nodes x {SCHEDULERS} Schedulers: {full:?} ({owned} owned, {lost} lost)");

    let build = time(3, || {
        let mut arb = Arbiter::new();
        arb.replace_nodes(nodes.clone());
        arb.replace_schedulers(claims.clone());
        arb
    });
    println!("Arbiter initial load (relist of every Node, then of every Scheduler): {build:?}");

    let mut arb = Arbiter::new();
    arb.replace_nodes(nodes.clone());
    arb.replace_schedulers(claims.clone());
    let mut flip = 0usize;
    let relabel = time(1_000, || {
        flip += 1;
        arb.upsert_node("node-42", labels(42 + flip))
    });
    println!("one-node relabel (incremental, with the Schedulers it moves): {relabel:?}");

    let mut generation = 1;
    let sched_change = time(20, || {
        generation += 1;
        let mut c = claims[7].clone();
        c.generation = generation;
        c.selector = BTreeMap::from([("pool".to_string(), format!("p{}", generation % 20))]);
        arb.upsert_scheduler(c)
    });
    println!("one Scheduler's selector change (incremental): {sched_change:?}");

    let placement = time(50, || arb.placement("s100"));
    println!("placement of one Scheduler (read in each reconcile): {placement:?}");
}
