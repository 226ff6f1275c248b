use super::*;
use proptest::prelude::*;

const UID: &str = "0a1b2c3d-4e5f-4a6b-8c7d-0123456789ab";

/// The `n`th test uid.
fn uid_n(n: u64) -> String {
    format!("00000000-0000-4000-8000-{n:012x}")
}

/// `uid` as the systemd driver writes it.
fn sd(uid: &str) -> String {
    uid.replace('-', "_")
}

/// Makes the pod cgroup `root/rel` with a `cpu.max`, a weight of 100 and a `cpu.stat`.
fn pod(root: &Path, rel: &str, max: &str, usage_us: u64) -> PathBuf {
    let dir = root.join(rel);
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("cpu.max"), format!("{max}\n")).unwrap();
    fs::write(dir.join("cpu.weight"), "100\n").unwrap();
    stat(&dir, usage_us, 0);
    dir
}

fn stat(dir: &Path, usage_us: u64, nr_throttled: u64) {
    let throttled_us = nr_throttled * 1000;
    let text =
        format!("usage_usec {usage_us}\nuser_usec 0\nnr_throttled {nr_throttled}\nthrottled_usec {throttled_us}\n");
    fs::write(dir.join("cpu.stat"), text).unwrap();
}

fn reading(quota_us: Option<u64>, usage_us: u64, nr_throttled: u64) -> Reading {
    Reading { quota_us, period_us: 100_000, usage_us, nr_throttled, ..Reading::default() }
}

#[test]
fn uids_of_both_drivers_and_every_qos() {
    let s = sd(UID);
    let cases = [
        ("kubepods.slice", format!("kubepods-pod{s}.slice"), Qos::Guaranteed),
        ("kubepods-burstable.slice", format!("kubepods-burstable-pod{s}.slice"), Qos::Burstable),
        ("kubepods-besteffort.slice", format!("kubepods-besteffort-pod{s}.slice"), Qos::BestEffort),
        ("kubepods", format!("pod{UID}"), Qos::Guaranteed),
        ("burstable", format!("pod{UID}"), Qos::Burstable),
        ("besteffort", format!("pod{UID}"), Qos::BestEffort),
    ];
    for (parent, name, qos) in cases {
        assert_eq!(pod_uid(parent, &name), Some((UID.to_owned(), qos)), "{parent}/{name}");
    }
}

#[test]
fn malformed_names_are_rejected() {
    let (s, upper) = (sd(UID), UID.to_uppercase());
    let bad = [
        ("kubepods-burstable.slice", "kubepods-burstable-podX.slice".to_owned()),
        ("kubepods-burstable.slice", format!("kubepods-burstable-pod{}.slice", sd(&upper))),
        ("kubepods-burstable.slice", format!("kubepods-burstable-pod{}.slice", &s[1..])),
        ("kubepods-burstable.slice", format!("kubepods-burstable-pod{UID}.slice")),
        ("kubepods.slice", format!("kubepods-burstable-pod{s}.slice")),
        ("kubepods.slice", "kubepods-burstable.slice".to_owned()),
        ("burstable", format!("pod{s}")),
        ("burstable", format!("pod{upper}")),
        ("burstable", format!("pod{}", &UID[..35])),
        ("burstable", format!("pod{UID}0")),
        ("burstable", format!("pod{}", UID.replace('a', "g"))),
        ("burstable", format!("pod{}é", &UID[..34])),
        ("burstable", "pod".to_owned()),
        ("guaranteed", format!("pod{UID}")),
        ("kubepods", format!("cri-containerd-{UID}.scope")),
    ];
    for (parent, name) in bad {
        assert_eq!(pod_uid(parent, &name), None, "{parent}/{name}");
    }
}

#[test]
fn pods_are_found_in_both_layouts_and_nowhere_else() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let dirs = [
        format!("kubepods.slice/kubepods-pod{}.slice", sd(&uid_n(1))),
        format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice", sd(&uid_n(2))),
        format!("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice", sd(&uid_n(3))),
        format!("kubepods/pod{}", uid_n(4)),
        format!("kubepods/burstable/pod{}", uid_n(5)),
        format!("kubepods/besteffort/pod{}", uid_n(6)),
    ];
    for dir in &dirs {
        fs::create_dir_all(root.join(dir).join(format!("pod{}", uid_n(9)))).unwrap();
    }
    fs::create_dir_all(root.join("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podX.slice")).unwrap();
    fs::create_dir_all(root.join(format!("system.slice/kubepods-pod{}.slice", sd(&uid_n(8))))).unwrap();
    fs::write(root.join(format!("kubepods/pod{}", uid_n(7))), "a file").unwrap();
    let list = find_pods(root, 100);
    let found: Vec<_> = list.pods.iter().map(|p| (p.uid.clone(), p.qos, p.dir.clone())).collect();
    let qos = [Qos::Guaranteed, Qos::Burstable, Qos::BestEffort];
    let expected: Vec<_> = (0..6).map(|i| (uid_n(i as u64 + 1), qos[i % 3], root.join(&dirs[i]))).collect();
    assert_eq!(found, expected);
    assert_eq!((list.found, list.truncated, list.no_kubepods, list.error), (6, false, false, None));

    let first = find_pods(root, 4);
    let uids: Vec<_> = first.pods.iter().map(|p| p.uid.clone()).collect();
    assert_eq!(uids, (1..=4).map(uid_n).collect::<Vec<_>>(), "the lowest uids");
    assert_eq!((first.found, first.truncated), (6, true));
    let none = find_pods(root, 0);
    assert!(none.pods.is_empty() && none.truncated);

    fs::remove_dir_all(root.join("kubepods")).unwrap();
    fs::remove_dir_all(root.join("kubepods.slice")).unwrap();
    let absent = find_pods(root, 100);
    assert!(absent.no_kubepods && absent.pods.is_empty() && absent.found == 0);
    assert!(find_pods(&root.join("absent"), 100).no_kubepods);
}

#[test]
fn each_file_parses_and_garbage_does_not() {
    assert_eq!(parse_cpu_max("max 100000\n"), Some(CpuMax { quota_us: None, period_us: 100_000 }));
    assert_eq!(parse_cpu_max("50000 100000"), Some(CpuMax { quota_us: Some(50_000), period_us: 100_000 }));
    for bad in ["", "max", "max 0", "50000 0", "0 100000", "5 100000 7", "-1 100000", "max max", "1.5 100000"] {
        assert_eq!(parse_cpu_max(bad), None, "{bad:?}");
    }
    let stat = "usage_usec 1234\nuser_usec 1000\nsystem_usec 234\nnr_periods 10\nnr_throttled 3\n\
                throttled_usec 4567\nnr_bursts 0\nburst_usec 0\n";
    assert_eq!(parse_cpu_stat(stat), Some(CpuStat { usage_us: 1234, nr_throttled: 3, throttled_us: 4567 }));
    assert_eq!(parse_cpu_stat("usage_usec 1\n"), None, "no throttling counters");
    assert_eq!(parse_cpu_stat(&stat.replace("1234", "12x")), None);
    assert_eq!(parse_cpu_stat("\0\n\n"), None);
    let pressure = "some avg10=0.00 avg60=0.00 avg300=0.00 total=42\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=7\n";
    assert_eq!(parse_pressure_some_total(pressure), Some(42));
    assert_eq!(parse_pressure_some_total("some avg10=0.00 total=lots\n"), None);
    assert_eq!(parse_pressure_some_total("full avg10=0.00 total=7\n"), None);
    assert_eq!((parse_weight("100\n"), parse_weight("1"), parse_weight("10000")), (Some(100), Some(1), Some(10_000)));
    for bad in ["0", "10001", "-5", "", "heavy", "1 2"] {
        assert_eq!(parse_weight(bad), None, "{bad:?}");
    }
}

#[test]
fn a_pod_needs_its_limit_and_usage_read_and_nothing_else() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = pod(tmp.path(), "p", "50000 100000", 1000);
    stat(&dir, 1000, 2);
    let read = read_pod(&dir).unwrap();
    let expected = Reading {
        quota_us: Some(50_000),
        period_us: 100_000,
        weight: Some(100),
        usage_us: 1000,
        nr_throttled: 2,
        throttled_us: 2000,
        pressure_some_us: None,
    };
    assert_eq!(read, expected);
    fs::write(dir.join("cpu.pressure"), "some avg10=0.00 avg60=0.00 avg300=0.00 total=42\n").unwrap();
    fs::remove_file(dir.join("cpu.weight")).unwrap();
    assert_eq!(read_pod(&dir), Ok(Reading { pressure_some_us: Some(42), weight: None, ..expected }));
    fs::write(dir.join("cpu.weight"), "heavy\n").unwrap();
    assert!(read_pod(&dir).unwrap_err().ends_with("cpu.weight: malformed: \"heavy\""));
    fs::write(dir.join("cpu.weight"), "100\n").unwrap();
    fs::write(dir.join("cpu.stat"), "x".repeat(5000)).unwrap();
    assert!(read_pod(&dir).unwrap_err().ends_with("cpu.stat: larger than 4096 bytes"));
    fs::remove_file(dir.join("cpu.max")).unwrap();
    let err = read_pod(&dir).unwrap_err();
    assert!(err.contains("cpu.max: No such file"), "{err}");
}

#[test]
fn judge_proves_a_limit_broken_only_above_it() {
    let (ten, half) = (Duration::from_secs(10), Some(50_000));
    let greedy = judge(&reading(half, 1_000, 0), &reading(half, 13_801_000, 0), ten).unwrap();
    assert_eq!(greedy.limit_cpus, Some(0.5));
    assert!((greedy.used_cpus - 1.38).abs() < 1e-12 && greedy.over_limit && greedy.exercised, "{greedy:?}");
    let idle = judge(&reading(Some(100_000), 0, 0), &reading(Some(100_000), 1_000_000, 0), ten).unwrap();
    assert!(!idle.over_limit && !idle.exercised, "0.1 of 1 CPU says nothing: {idle:?}");
    let held = judge(&reading(half, 0, 10), &reading(half, 5_000_000, 60), ten).unwrap();
    assert!(held.throttled && held.exercised && !held.over_limit, "{held:?}");
    let overshoot = judge(&reading(half, 0, 0), &reading(half, 5_800_000, 0), ten).unwrap();
    assert!(overshoot.exercised && !overshoot.over_limit, "0.58 is within CFS's overshoot: {overshoot:?}");
    let free = judge(&reading(None, 0, 0), &reading(None, 80_000_000, 0), ten).unwrap();
    assert_eq!((free.limit_cpus, free.over_limit, free.exercised), (None, false, false));
    let resized = judge(&reading(half, 0, 0), &reading(Some(200_000), 15_000_000, 0), ten).unwrap();
    assert_eq!((resized.limit_cpus, resized.over_limit), (Some(2.0), false), "the higher limit of the two");
    assert_eq!(judge(&reading(half, 0, 0), &reading(half, 9_000_000, 0), Duration::from_millis(999)), None);
    assert_eq!(judge(&reading(half, 10, 0), &reading(half, 5, 0), ten), None, "made anew");
    assert_eq!(judge(&reading(half, 10, 3), &reading(half, 20, 1), ten), None, "made anew");
}

#[test]
fn the_sampler_judges_each_pod_over_its_own_window() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let burstable = format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice", sd(&uid_n(1)));
    let greedy = pod(root, &burstable, "50000 100000", 0);
    let idle = pod(root, &format!("kubepods/burstable/pod{}", uid_n(2)), "100000 100000", 0);
    let free = pod(root, &format!("kubepods/besteffort/pod{}", uid_n(3)), "max 100000", 0);
    fs::write(free.join("cpu.weight"), "2\n").unwrap();
    let mut sampler = Sampler::new(root.to_owned(), 10);
    assert_eq!(sampler.sample(Duration::from_secs(100)), Summary { pods: 3, ..Summary::default() });
    stat(&greedy, 13_800_000, 0);
    stat(&idle, 1_000_000, 0);
    stat(&free, 40_000_000, 0);
    let short = sampler.sample(Duration::from_millis(100_500));
    assert_eq!(short, Summary { pods: 3, ..Summary::default() }, "too short a window: the baselines stay");
    let s = sampler.sample(Duration::from_secs(110));
    let counts = (s.pods, s.judged, s.limited, s.exercised, s.throttled, s.over_limit_pods, s.distinct_weights);
    assert_eq!(counts, (3, 3, 2, 1, 0, 1, 2));
    assert_eq!(s.over_limit, [OverLimit { uid: uid_n(1), used_cpus: 1.38, limit_cpus: 0.5 }]);
    assert_eq!((s.truncated, s.unavailable), (false, None));

    // The greedy pod's cgroup is made anew, the idle pod is gone, another pod comes.
    stat(&greedy, 500, 0);
    fs::remove_dir_all(&idle).unwrap();
    pod(root, &format!("kubepods/pod{}", uid_n(4)), "max 100000", 0);
    stat(&free, 50_000_000, 0);
    let s = sampler.sample(Duration::from_secs(120));
    assert_eq!((s.pods, s.judged, s.limited, s.over_limit_pods), (3, 1, 0, 0), "only the free pod has a window");
    assert!(!sampler.previous.contains_key(&uid_n(2)), "forgotten");
    assert_eq!(
        sampler.previous[&uid_n(1)],
        (Duration::from_secs(120), Reading { usage_us: 500, ..read_pod(&greedy).unwrap() })
    );
    stat(&greedy, 4_000_500, 0);
    let s = sampler.sample(Duration::from_secs(130));
    assert_eq!((s.judged, s.limited, s.exercised, s.over_limit_pods), (3, 1, 0, 0), "0.4 of 0.5 CPU: not exercised");
}

#[test]
fn the_sampler_says_why_nothing_could_be_read() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let s = Sampler::new(root.join("absent"), 10).sample(Duration::ZERO);
    assert!(
        s.unavailable
            .as_ref()
            .is_some_and(|why| why.ends_with("absent: not a directory: is the host's cgroup2 tree mounted?")),
        "{s:?}"
    );
    let mut sampler = Sampler::new(root.to_owned(), 1);
    let why = format!("no kubepods cgroup under {}: is the host's cgroup2 tree mounted?", root.display());
    assert_eq!(sampler.sample(Duration::ZERO).unavailable, Some(why));
    let bad = pod(root, &format!("kubepods/pod{}", uid_n(1)), "\x1b[2J", 0);
    pod(root, &format!("kubepods/pod{}", uid_n(2)), "max 100000", 0);
    let s = sampler.sample(Duration::ZERO);
    let why = s.unavailable.unwrap_or_default();
    assert!(why.starts_with("no pod cgroup could be read (1 tried): ") && why.contains("cpu.max: malformed"), "{why}");
    assert!(!why.chars().any(char::is_control), "{why}");
    assert_eq!((s.pods, s.truncated), (2, true));
    fs::write(bad.join("cpu.max"), "max 100000").unwrap();
    assert_eq!(sampler.sample(Duration::ZERO).unavailable, None);
}

fn any_reading() -> impl Strategy<Value = Reading> {
    (any::<Option<u64>>(), any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
        |(quota_us, period_us, usage_us, nr_throttled, throttled_us)| Reading {
            quota_us,
            period_us,
            usage_us,
            nr_throttled,
            throttled_us,
            ..Reading::default()
        },
    )
}

proptest! {
    #[test]
    fn judge_takes_any_reading(
        before in any_reading(),
        after in any_reading(),
        secs in any::<u64>(),
        nanos in 0..1_000_000_000u32,
    ) {
        let window = judge(&before, &after, Duration::new(secs, nanos));
        if went_backwards(&before, &after) || secs == 0 {
            prop_assert_eq!(window, None);
        }
        if let Some(w) = window {
            prop_assert!(w.used_cpus >= 0.0 && !w.used_cpus.is_nan());
            prop_assert!(!w.over_limit || w.exercised);
        }
    }

    #[test]
    fn over_limit_is_above_the_limit_and_cfs_overshoot(
        quota in 1_000..=6_400_000u64,
        period in 1_000..=1_000_000u64,
        elapsed_us in 1_000_000..=600_000_000u64,
        factor in 0.0..3.0f64,
        start in 0..=u64::MAX / 2,
    ) {
        let limit = quota as f64 / period as f64;
        let delta = (limit * factor * elapsed_us as f64) as u64;
        let before = Reading { quota_us: Some(quota), period_us: period, usage_us: start, ..Reading::default() };
        let after = Reading { usage_us: start + delta, ..before };
        let w = judge(&before, &after, Duration::from_micros(elapsed_us)).unwrap();
        let used = delta as f64 / elapsed_us as f64;
        prop_assert_eq!(w.limit_cpus, Some(limit));
        if used <= limit {
            prop_assert!(!w.over_limit, "{:?}", w);
        }
        if used > limit * (1.0 + OVERSHOOT_FRACTION) + OVERSHOOT_CPUS + 1e-9 {
            prop_assert!(w.over_limit && w.exercised, "{:?}", w);
        }
    }
}

#[test]
fn the_watch_starts_its_windows_again_when_the_scheduler_changes() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let dir = pod(root, &format!("kubepods/burstable/pod{UID}"), "50000 100000", 0);
    let mut watch = Watch::new(Sampler::new(root.to_owned(), 10));
    let a: Instance = (Some(1), Some("a".into()));
    let b: Instance = (Some(2), Some("b".into()));
    let secs = Duration::from_secs;
    let first = watch.tick(a.clone(), secs(0));
    assert_eq!((first.withdrawn, first.summary), (false, None), "no window yet: nothing to publish");
    stat(&dir, 2_000_000, 0);
    let under_a = watch.tick(a.clone(), secs(2)).summary.unwrap();
    assert_eq!(under_a.over_limit_pods, 1, "1.00 CPU against 0.50 under a");
    // b attaches half a second later (too short a window to move the baseline), the pod having
    // used 2 s of CPU meanwhile under a: what a saw is withdrawn, and b's first window starts
    // at b's first sample, not at a's last.
    stat(&dir, 4_000_000, 0);
    let switched = watch.tick(b.clone(), Duration::from_millis(2500));
    assert_eq!((switched.withdrawn, switched.summary), (true, None));
    stat(&dir, 4_400_000, 0);
    let under_b = watch.tick(b, Duration::from_millis(4500)).summary.unwrap();
    assert_eq!((under_b.judged, under_b.over_limit_pods), (1, 0), "0.20 CPU under b, none of a's 4.00");
}
