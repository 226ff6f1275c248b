//! The agent against real kernels: Debian's sched_ext-enabled cloud kernel and bookworm's 6.1
//! (no sched_ext), booted under qemu. The agent runs in the VM, detects changes through the
//! kernel's uevents, and reports over a virtio console port to the controller on the host,
//! with a token from a TokenRequest bound to the scheduler pod on the Node that stands for the
//! VM. A minimal BPF scheduler (`bpf/sked_canary.bpf.c`) is attached and detached in the VM.
//!
//! Needs qemu, clang, bpftool and the kernels: `make test-kernel` (not part of `make test`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context as _, Result};
use kube::ResourceExt;
use sked_controller::config::ControllerFlags;
use sked_controller::{Scheduler, SchedulerSpec};
use sked_tests::agents::{ReportsTls, agent_binary, bound_token, workspace_binary};
use sked_tests::cluster::{free_port, workspace_root};
use sked_tests::vm::TestVm;
use sked_tests::{Fixture, condition, run_command as run, spec_on, wait_for};

const NODE: &str = "kvm-node";
const SCHEDULER: &str = "canary";

/// Kernels, BPF objects and one initramfs per kernel.
struct Artifacts {
    dir: PathBuf,
}

impl Artifacts {
    fn build(dir: &Path) -> Result<Self> {
        let script = workspace_root().join("hack/kernel-e2e.sh");
        run(Command::new("bash").arg(&script).arg("prepare").arg(dir))?;
        let bins = [
            agent_binary()?,
            workspace_binary("sked-vm-relay", "SKED_VM_RELAY_BIN")?,
            workspace_binary("sked-canary-loader", "SKED_CANARY_LOADER_BIN")?,
        ];
        for (name, modules) in [("sched-ext", "none"), ("no-sched-ext", "modules-no-sched-ext")] {
            run(Command::new("bash")
                .arg(&script)
                .args(["initramfs"])
                .arg(dir)
                .arg(name)
                .arg(dir.join(modules))
                .args(&bins))?;
        }
        Ok(Self { dir: dir.to_path_buf() })
    }

    fn kernel(&self, name: &str) -> (PathBuf, PathBuf) {
        (self.dir.join(format!("vmlinuz-{name}")), self.dir.join(format!("{name}.cpio.gz")))
    }
}

struct Setup {
    fx: Fixture,
    tls: ReportsTls,
    reports: std::net::SocketAddr,
    token: String,
    pod: String,
}

async fn setup(dir: &Path) -> Result<Setup> {
    let tls = ReportsTls::generate(dir)?;
    let reports = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let flags = ControllerFlags {
        reports_bind_address: reports,
        reports_cert_file: Some(tls.cert.clone()),
        reports_key_file: Some(tls.key.clone()),
        ..ControllerFlags::default()
    };
    let fx = Fixture::start_with(flags).await?;
    fx.create_node(NODE, &[("pool", "vm")]).await?;
    let spec = SchedulerSpec {
        expected_ops: Some("sked_canary".into()),
        ..spec_on("ghcr.io/schedkit/sked_canary:v1", &[("pool", "vm")])
    };
    fx.create_scheduler(SCHEDULER, spec).await?;
    let pod = sked_tests::wait_bound_pods(&fx.client, &fx.namespace, SCHEDULER, 1)
        .await?
        .remove(NODE)
        .context("the canary pod is bound to the VM's Node")?;
    started(&fx, &pod.name_any()).await?;
    let token = bound_token(&fx.client, &fx.namespace, "sked-agent", Some(&pod)).await?;
    Ok(Setup { fx, tls, reports, token, pod: pod.name_any() })
}

impl Setup {
    /// Starts the agent in the VM. Polling is set to an hour: changes must arrive by uevent.
    async fn start_agent(&self, vm: &mut TestVm) -> Result<()> {
        start_agent_for(vm, &self.tls, &self.token, &self.pod).await
    }

    async fn wait_kernel(&self, what: &str, attached: i32, reason: &str) -> Result<Scheduler> {
        self.fx
            .wait_scheduler(SCHEDULER, what, |s| {
                s.status.as_ref().is_some_and(|st| st.kernel_attached == attached && st.desired_number_scheduled == 1)
                    && condition(s, "KernelAttached").is_some_and(|c| c.reason == reason)
            })
            .await
    }
}

/// Runs `body` against the VM; when it fails, prints what the VM saw: its agent, relay and
/// scheduler logs, its kernel log, and the console (which outlives a hung or crashed guest).
async fn diagnosed<T>(vm: &mut TestVm, body: impl AsyncFnOnce(&mut TestVm) -> Result<T>) -> Result<T> {
    let result = body(vm).await;
    if result.is_err() {
        let logs = vm
            .run(
                "for f in /run/agent.log /run/relay.log /run/canary.out; do echo \"== $f\"; tail -n 40 $f; done; \
                 echo '== dmesg'; dmesg | tail -n 40",
            )
            .await
            .unwrap_or_else(|e| format!("cannot read the VM's logs: {e:#}"));
        eprintln!("in the VM:\n{logs}\n== console\n{}", vm.console_tail(60));
    }
    result
}

/// Starts (or restarts) the agent in the VM for `pod`, with a token bound to it.
async fn start_agent_for(vm: &mut TestVm, tls: &ReportsTls, token: &str, pod: &str) -> Result<()> {
    vm.write_file("/run/sked/token", token.as_bytes()).await?;
    vm.write_file("/run/sked/ca.crt", &std::fs::read(&tls.ca)?).await?;
    vm.run(&format!(
        "if [ -f /run/agent.pid ]; then kill $(cat /run/agent.pid) 2>/dev/null; sleep 0.2; fi; \
         /bin/sked-agent --node-name {NODE} --pod-name {pod} --scheduler {SCHEDULER} --expected-ops sked_canary \
         --controller-address https://127.0.0.1:8443 --ca-file /run/sked/ca.crt --token-file /run/sked/token \
         --poll-interval 1h --health-interval 1s --heartbeat-interval 2s --pod-cpu-interval 2s \
         --listen-address 127.0.0.1:9464 \
         >> /run/agent.log 2>&1 & echo $! > /run/agent.pid"
    ))
    .await?;
    Ok(())
}

/// `attached <map> <unix ns>` as the loader prints it: the guest's time of the attach.
fn attach_time(out: &str) -> Option<u128> {
    out.lines().find_map(|l| l.strip_prefix("attached ")?.split_whitespace().nth(1)?.parse().ok())
}

/// The agent's "kernel state changed" lines: (unix ns, trigger, verdict).
fn agent_changes(log: &str) -> Vec<(u128, String, String)> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["msg"] == "kernel state changed")
        .filter_map(|v| {
            let time: jiff::Timestamp = v["time"].as_str()?.parse().ok()?;
            Some((
                u128::try_from(time.as_nanosecond()).ok()?,
                v["trigger"].as_str()?.to_owned(),
                v["verdict"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "boots qemu with Debian kernels: run it with `make test-kernel`"]
async fn a_real_kernel_drives_kernel_attached() -> Result<()> {
    let started = Instant::now();
    let dir = tempfile::Builder::new().prefix("sked-kernel-e2e-").tempdir()?;
    let artifacts = tokio::task::block_in_place(|| Artifacts::build(&dir.path().join("artifacts")))?;
    eprintln!("measured: artifacts ready after {:?}", started.elapsed());
    let s = setup(dir.path()).await?;

    // The sched_ext kernel.
    let (kernel, initramfs) = artifacts.kernel("sched-ext");
    let booting = Instant::now();
    let mut vm = TestVm::boot(&kernel, &initramfs, &dir.path().join("vm-sched-ext"), s.reports).await?;
    eprintln!("measured: boot to /init ready ({}): {:?}", vm.kernel_release, booting.elapsed());
    diagnosed(&mut vm, async |vm| attach_detach_foreign(&s, vm).await).await?;
    vm.shutdown().await?;

    // A kernel without sched_ext.
    let (kernel, initramfs) = artifacts.kernel("no-sched-ext");
    let mut vm = TestVm::boot(&kernel, &initramfs, &dir.path().join("vm-no-sched-ext"), s.reports).await?;
    diagnosed(&mut vm, async |vm| without_sched_ext(&s, vm).await).await?;
    vm.shutdown().await?;
    eprintln!("measured: whole real-kernel test: {:?}", started.elapsed());
    Ok(())
}

/// The canary attaches and detaches, then a scheduler the pod does not hold attaches.
async fn attach_detach_foreign(s: &Setup, vm: &mut TestVm) -> Result<()> {
    assert_eq!(vm.run("cat /sys/kernel/sched_ext/state").await?.trim(), "disabled");
    let reports_at_start = s.fx.report_stats.reports.get();
    s.start_agent(vm).await?;
    // The agent's own first report (the condition says NotAttached before any report too): the
    // attach below must come after the agent is watching.
    wait_for("the agent's first report", || async {
        Ok((s.fx.report_stats.reports.get() > reports_at_start).then_some(()))
    })
    .await?;
    let sched = s.wait_kernel("the VM's agent reporting nothing attached", 0, "NotAttached").await?;
    assert_eq!(sched.status.as_ref().and_then(|st| st.kernel_attached_summary.clone()).as_deref(), Some("0/1"));
    limited_pod_under_the_default(vm).await?;

    // Attach the canary the way a scheduler pod does: a process holding the link.
    let reports_before = s.fx.report_stats.reports.get();
    let out = vm
        .run(
            "/bin/sked-canary-loader hold /sked/sked_canary.bpf.o > /run/canary.out 2>&1 & echo $! > /run/canary.pid; \
             for i in $(seq 1 200); do grep -q attached /run/canary.out && break; sleep 0.05; done; cat /run/canary.out",
        )
        .await?;
    let attached_at = Instant::now();
    let guest_attach = attach_time(&out).with_context(|| format!("loader output: {out}"))?;
    wait_for("the agent's report of the attach", || async {
        Ok((s.fx.report_stats.reports.get() > reports_before).then_some(()))
    })
    .await?;
    let to_report = attached_at.elapsed();
    assert_eq!(vm.run("cat /sys/kernel/sched_ext/root/ops").await?.trim(), "sked_canary");
    let sched = s.wait_kernel("KERNEL-ATTACHED 1/1", 1, "KernelAttached").await?;
    let to_status = attached_at.elapsed();
    assert_eq!(sched.status.as_ref().and_then(|st| st.kernel_attached_summary.clone()).as_deref(), Some("1/1"));
    assert_eq!(condition(&sched, "KernelAttached").map(|c| c.status.as_str()), Some("True"));
    s.fx.wait_event(SCHEDULER, "Normal", "KernelAttached", 1).await?;
    // The kubelet marks the pod Ready: the revision ran everywhere, so the detach below is a
    // change to report, not a first revision to take back to the kernel's default.
    s.fx.mark_pods_ready(SCHEDULER).await?;
    s.fx.wait_scheduler(SCHEDULER, "the first deployment complete", |s| {
        s.status.as_ref().and_then(|st| st.rollout.as_ref()).is_some_and(|r| r.current_revision.is_some())
    })
    .await?;

    limited_pod_under_the_canary(s, vm).await?;

    // Detach: the process goes away, and with it the scheduler.
    vm.run("kill $(cat /run/canary.pid); while grep -q enabled /sys/kernel/sched_ext/state; do sleep 0.05; done")
        .await?;
    let detached_at = Instant::now();
    let sched = s.wait_kernel("0/1 after the detach", 0, "NotAttached").await?;
    let detach_to_status = detached_at.elapsed();
    assert_eq!(condition(&sched, "KernelAttached").map(|c| c.status.as_str()), Some("False"));
    s.fx.wait_event(SCHEDULER, "Normal", "NotAttached", 1).await?;

    // Another scheduler, attached by hand (pinned, no process of the pod holds it).
    vm.run("/bin/sked-canary-loader pin /sked/sked_intruder.bpf.o /sys/fs/bpf/sked_intruder").await?;
    let sched = s.wait_kernel("ForeignScheduler", 0, "ForeignScheduler").await?;
    let message = condition(&sched, "KernelAttached").map(|c| c.message.clone()).unwrap_or_default();
    assert!(message.contains(NODE) && message.contains("sked_intruder"), "{message}");
    s.fx.wait_event(SCHEDULER, "Warning", "ForeignScheduler", 1).await?;
    vm.run("rm /sys/fs/bpf/sked_intruder").await?;
    s.wait_kernel("NotAttached after the foreign scheduler left", 0, "NotAttached").await?;

    // The agent saw every change as it happened (polling is an hour): a uevent, or the kernel's
    // log line of an exit, whichever came first.
    let log = vm.run("cat /run/agent.log").await?;
    let changes = agent_changes(&log);
    let attached =
        changes.iter().find(|(_, _, verdict)| verdict == "Attached").context("the agent logged the attach")?;
    // Every change of verdict after the first (a re-read that finds only details changed, such
    // as the state settling after the attach, is no news).
    let mut verdict_changes = changes.windows(2).filter(|w| w[0].2 != w[1].2).map(|w| &w[1]);
    assert!(
        verdict_changes.all(|(_, trigger, _)| trigger == "uevent" || trigger == "kmsg"),
        "verdict changes not seen by uevent or the kernel log: {changes:?}"
    );
    eprintln!(
        "measured: kernel attach -> agent noticed (guest clock): {:?}",
        std::time::Duration::from_nanos(u64::try_from(attached.0.saturating_sub(guest_attach)).unwrap_or(u64::MAX))
    );
    eprintln!("measured: attach returned -> controller received the report (host): {to_report:?}");
    eprintln!("measured: attach returned -> status KERNEL-ATTACHED 1/1 (host): {to_status:?}");
    eprintln!("measured: detach returned -> status 0/1 (host): {detach_to_status:?}");
    Ok(())
}

/// The UID of the pod whose cgroup the CPU-contract checks make in the VM (the kubelet's
/// systemd layout: a Burstable pod, its UID's dashes as underscores).
const LIMITED_POD: &str = "0a1b2c3d-4e5f-4a6b-8c7d-0123456789ab";

/// The limited pod's cgroup, under the VM's cgroup2 root.
fn limited_pod_cgroup() -> String {
    let uid = LIMITED_POD.replace('-', "_");
    format!("/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice")
}

/// Prints the CPUs the limited pod used over 3 s, from its cpu.stat.
async fn measure_limited_pod(vm: &mut TestVm, under: &str) -> Result<f64> {
    let dir = limited_pod_cgroup();
    let out = vm
        .run(&format!(
            "a=$(grep usage_usec {dir}/cpu.stat | cut -d' ' -f2); sleep 3; b=$(grep usage_usec {dir}/cpu.stat | cut -d' ' -f2); \
             echo $a $b"
        ))
        .await?;
    let used: Vec<f64> = out.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    let [a, b] = used[..] else { anyhow::bail!("cpu.stat of the limited pod: {out:?}") };
    let cpus = (b - a) / 3_000_000.0;
    eprintln!("measured: a pod limited to 0.50 CPU with two spinning tasks, under {under}: {cpus:.2} CPU");
    Ok(cpus)
}

/// Makes a pod's cgroup limited to half a CPU (`cpu.max 50000 100000`) in the kubelet's systemd
/// layout, with two spinning tasks in it (their pids in /run/spin.pids).
async fn start_limited_pod(vm: &mut TestVm) -> Result<()> {
    let dir = limited_pod_cgroup();
    vm.run(&format!(
        "grep -q ' /sys/fs/cgroup cgroup2' /proc/mounts || mount -t cgroup2 none /sys/fs/cgroup; cd /sys/fs/cgroup && echo +cpu > cgroup.subtree_control && \
         mkdir -p kubepods.slice/kubepods-burstable.slice && echo +cpu > kubepods.slice/cgroup.subtree_control && \
         echo +cpu > kubepods.slice/kubepods-burstable.slice/cgroup.subtree_control && mkdir -p {dir} && \
         echo '50000 100000' > {dir}/cpu.max && \
         for i in 1 2; do sh -c 'echo $$ > {dir}/cgroup.procs; while :; do :; done' >/dev/null 2>&1 & \
         echo $! >> /run/spin.pids; done"
    ))
    .await?;
    Ok(())
}

/// The limited pod under the kernel's default scheduler: the agent finds its limit exercised
/// and kept.
async fn limited_pod_under_the_default(vm: &mut TestVm) -> Result<()> {
    start_limited_pod(vm).await?;
    let metrics = vm
        .run(
            "for i in $(seq 1 300); do m=$(wget -qO- http://127.0.0.1:9464/metrics); \
             echo \"$m\" | grep -q '^sked_agent_pods_cpu_limit_exercised 1' && break; sleep 0.1; done; \
             echo \"$m\" | grep '^sked_agent_pods_'",
        )
        .await?;
    assert!(metrics.contains("sked_agent_pods_cpu_limit_exercised 1"), "the limit wanted: {metrics}");
    assert!(metrics.contains("sked_agent_pods_over_cpu_limit 0"), "and kept: {metrics}");
    let cpus = measure_limited_pod(vm, "the kernel's default scheduler").await?;
    assert!(cpus < 0.6, "the kernel's default keeps cpu.max: {cpus:.2} CPU");
    Ok(())
}

/// The same pod under the canary (which implements no cgroup callback): the Scheduler's
/// PodCPUContract condition turns False, naming the pod, what it used and the missing callback,
/// with one Warning; then the pod's tasks stop.
async fn limited_pod_under_the_canary(s: &Setup, vm: &mut TestVm) -> Result<()> {
    let sched =
        s.fx.wait_scheduler(SCHEDULER, "PodCPUContract False, naming the pod", |s| {
            condition(s, "PodCPUContract").is_some_and(|c| {
                c.status == "False" && c.reason == "LimitsNotEnforced" && c.message.contains(LIMITED_POD)
            })
        })
        .await?;
    let message = condition(&sched, "PodCPUContract").map(|c| c.message.clone()).unwrap_or_default();
    eprintln!("measured: PodCPUContract under the canary: {message}");
    for words in [
        &format!("pod UID {LIMITED_POD} used"),
        "against its limit of 0.50 on node kvm-node",
        "lacks ops.cgroup_set_bandwidth",
    ] {
        assert!(message.contains(words), "{words:?} in {message}");
    }
    s.fx.wait_event(SCHEDULER, "Warning", "LimitsNotEnforced", 1).await?;
    let cpus = measure_limited_pod(vm, "the canary").await?;
    assert!(cpus > 0.6, "the canary does not keep cpu.max: {cpus:.2} CPU");
    vm.run("kill $(cat /run/spin.pids); rm /run/spin.pids").await?;
    Ok(())
}

/// On a kernel without sched_ext, the node is labelled as one that cannot run it and leaves
/// placement.
async fn without_sched_ext(s: &Setup, vm: &mut TestVm) -> Result<()> {
    assert!(vm.run("ls /sys/kernel/sched_ext 2>&1 || true").await?.contains("No such file"), "no sched_ext here");
    s.start_agent(vm).await?;
    let labelled = wait_for("the node labelled sched-ext=unsupported", || async {
        let node = s.fx.nodes().get(NODE).await?;
        let labels = node.labels();
        let unsupported = labels.get("sked.schedkit.io/sched-ext").is_some_and(|v| v == "unsupported");
        Ok((unsupported && !labels.contains_key("sked.schedkit.io/scheduler")).then_some(()))
    })
    .await;
    labelled?;
    let sched =
        s.fx.wait_scheduler(SCHEDULER, "the node counted as unsupported", |s| {
            s.status.as_ref().is_some_and(|st| st.unsupported_nodes == 1 && st.desired_number_scheduled == 0)
        })
        .await?;
    let message = condition(&sched, "KernelAttached").map(|c| c.message.clone()).unwrap_or_default();
    assert!(message.contains(NODE) && message.contains("no sched_ext"), "{message}");
    Ok(())
}

/// The agent's `/metrics` in the VM: the sum of the `root/events` counters of `ops`.
async fn events_total(vm: &mut TestVm, ops: &str) -> Result<u64> {
    let text = vm.run("wget -qO- http://127.0.0.1:9464/metrics").await?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("sked_agent_sched_ext_events_total{") && l.contains(&format!("ops=\"{ops}\"")))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum())
}

/// Waits for a `status.lastExit` with `reason`, and says how long after the kernel logged it the
/// status showed it (guest and host clocks: qemu starts the guest's from the host's).
async fn wait_exit(s: &Setup, reason: &str) -> Result<sked_controller::api::KernelExit> {
    let sched =
        s.fx.wait_scheduler(SCHEDULER, reason, |s| {
            s.status.as_ref().and_then(|st| st.last_exit.as_ref()).is_some_and(|e| e.reason == reason)
        })
        .await?;
    let exit = sched.status.and_then(|st| st.last_exit).context("lastExit")?;
    let logged: jiff::Timestamp = exit.time.parse()?;
    eprintln!(
        "measured: kernel logged \"{reason}\" -> status.lastExit (host): {:?}",
        jiff::Timestamp::now().duration_since(logged)
    );
    Ok(exit)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "boots qemu with Debian kernels: run it with `make test-kernel`"]
async fn the_kernel_s_reasons_for_ejecting_a_scheduler_reach_its_status() -> Result<()> {
    in_sched_ext_vm("exits", async |s, vm| stall_and_sysrq(s, vm).await).await
}

/// A stall and SysRq-S eject the canary; the kernel's reasons reach the Scheduler.
async fn stall_and_sysrq(s: &Setup, vm: &mut TestVm) -> Result<()> {
    s.start_agent(vm).await?;

    // A stall: the scheduler never runs a task named sked-stall; the watchdog (1 s) ejects it.
    vm.run(
        "/bin/sked-canary-loader hold /sked/sked_stall.bpf.o > /run/canary.out 2>&1 & echo $! > /run/canary.pid; \
         for i in $(seq 1 200); do grep -q attached /run/canary.out && break; sleep 0.05; done",
    )
    .await?;
    s.wait_kernel("the stalling canary attached", 1, "KernelAttached").await?;
    // The kubelet marks the pod Ready: a revision that ran everywhere, so the ejections below are
    // exits to report, not a first revision to take back to the kernel's default.
    s.fx.mark_pods_ready(SCHEDULER).await?;
    s.fx.wait_scheduler(SCHEDULER, "the first deployment complete", |s| {
        s.status.as_ref().and_then(|st| st.rollout.as_ref()).is_some_and(|r| r.current_revision.is_some())
    })
    .await?;
    vm.run("sh -c 'echo -n sked-stall > /proc/self/comm; while :; do sleep 0.1; done' > /dev/null 2>&1 & echo $! > /run/victim.pid")
        .await?;
    let exit = wait_exit(s, "runnable task stall").await?;
    assert!(exit.ejected && exit.node == NODE && exit.ops == "sked_canary", "{exit:?}");
    assert!(exit.detail.contains("sked-stall") && exit.detail.contains("failed to run"), "{exit:?}");
    // The backtrace the kernel printed with the error follows its lines.
    let traced =
        s.fx.wait_scheduler(SCHEDULER, "the kernel's backtrace of the stall", |s| {
            s.status.as_ref().and_then(|st| st.last_exit.as_ref()).is_some_and(|e| !e.trace.is_empty())
        })
        .await?;
    let trace = traced.status.and_then(|st| st.last_exit).map(|e| e.trace).unwrap_or_default();
    eprintln!("measured: the kernel's backtrace of the stall, {} lines: {trace:?}", trace.len());
    let sched = s.wait_kernel("not attached after the stall", 0, "NotAttached").await?;
    let message = condition(&sched, "KernelAttached").map(|c| c.message.clone()).unwrap_or_default();
    assert!(message.contains("the kernel ejected sked_canary") && message.contains("runnable task stall"), "{message}");
    s.fx.wait_event(SCHEDULER, "Warning", "KernelEjected", 1).await?;
    let kmsg = vm.run("kill $(cat /run/victim.pid) $(cat /run/canary.pid); dmesg | grep -e sched_ext -e sysrq").await?;
    eprintln!("kernel log:\n{kmsg}");

    // SysRq-S, on the plain canary.
    vm.run(
        "while grep -q enabled /sys/kernel/sched_ext/state; do sleep 0.05; done; \
         /bin/sked-canary-loader hold /sked/sked_canary.bpf.o > /run/canary.out 2>&1 & echo $! > /run/canary.pid",
    )
    .await?;
    s.wait_kernel("the canary attached again", 1, "KernelAttached").await?;
    // Its root/events counters, scraped from the agent, move as the kernel schedules.
    let before = events_total(vm, "sked_canary").await?;
    let deadline = Instant::now() + sked_tests::DEADLINE;
    let after = loop {
        vm.run("ls -R /sys > /dev/null 2>&1; sleep 0.2").await?;
        let now = events_total(vm, "sked_canary").await?;
        if now > before {
            break now;
        }
        anyhow::ensure!(Instant::now() < deadline, "the root/events counters did not move from {before}");
    };
    eprintln!("measured: root/events of the canary, two scrapes apart: {before} -> {after}");
    vm.run("echo S > /proc/sysrq-trigger").await?;
    let exit = wait_exit(s, "disabled by sysrq-S").await?;
    assert!(exit.ejected && exit.detail.is_empty(), "{exit:?}");
    s.fx.wait_event(SCHEDULER, "Warning", "KernelEjected", 2).await?;
    let raw = vm.run("timeout 1 cat /dev/kmsg | grep -e 'sched_ext:' -e sysrq || true").await?;
    eprintln!("kernel log records (/dev/kmsg):\n{raw}");
    let metrics = vm.run("wget -qO- http://127.0.0.1:9464/metrics").await?;
    for reason in ["runnable task stall", "disabled by sysrq-S"] {
        let series = format!("sked_agent_sched_ext_exits_total{{reason=\"{reason}\"}} 1");
        assert!(metrics.lines().any(|l| l == series), "missing {series:?} in\n{metrics}");
    }
    Ok(())
}

/// Runs `body` in a sched_ext VM of its own, with a control plane, the canary Scheduler and its
/// pod bound to the VM's Node (`what` names the test in its directory and its time).
async fn in_sched_ext_vm(what: &str, body: impl AsyncFnOnce(&Setup, &mut TestVm) -> Result<()>) -> Result<()> {
    let started = Instant::now();
    let dir = tempfile::Builder::new().prefix(&format!("sked-kernel-{what}-")).tempdir()?;
    let artifacts = tokio::task::block_in_place(|| Artifacts::build(&dir.path().join("artifacts")))?;
    let s = setup(dir.path()).await?;
    let (kernel, initramfs) = artifacts.kernel("sched-ext");
    let mut vm = TestVm::boot(&kernel, &initramfs, &dir.path().join(format!("vm-{what}")), s.reports).await?;
    diagnosed(&mut vm, async |vm| body(&s, vm).await).await?;
    vm.shutdown().await?;
    eprintln!("measured: real-kernel {what} test: {:?}", started.elapsed());
    Ok(())
}

/// Plays the kubelet for the VM's Node: waits for the live pod of the canary Scheduler that is
/// not `old`, starts the agent for it and runs `scheduler` (a shell command) as its process.
async fn run_pod(s: &Setup, vm: &mut TestVm, old: &str, scheduler: &str) -> Result<k8s_openapi::api::core::v1::Pod> {
    let pod = wait_for("the next canary pod", || async {
        let pods = sked_tests::wait_bound_pods(&s.fx.client, &s.fx.namespace, SCHEDULER, 1).await?;
        Ok(pods.get(NODE).filter(|p| p.name_any() != old).cloned())
    })
    .await?;
    // The old pod's scheduler process goes with its pod.
    vm.run(
        "if [ -f /run/canary.pid ]; then kill $(cat /run/canary.pid) 2>/dev/null; rm /run/canary.pid; fi; \
            while grep -q enabled /sys/kernel/sched_ext/state; do sleep 0.05; done",
    )
    .await?;
    started(&s.fx, &pod.name_any()).await?;
    let token = bound_token(&s.fx.client, &s.fx.namespace, "sked-agent", Some(&pod)).await?;
    start_agent_for(vm, &s.tls, &token, &pod.name_any()).await?;
    vm.run(&format!("{scheduler} > /run/canary.out 2>&1 & echo $! > /run/canary.pid")).await?;
    Ok(pod)
}

/// Plays the kubelet taking `pod` up: Running, not Ready yet (the agent in the VM is its
/// container; a pod no kubelet took up would be skipped by a rollout, not judged).
async fn started(fx: &Fixture, pod: &str) -> Result<()> {
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(fx.client.clone(), &fx.namespace);
    sked_tests::kubelet::set_pod_ready(&pods, pod, false).await
}

fn rollout_phase(s: &Scheduler) -> Option<sked_controller::api::RolloutPhase> {
    s.status.as_ref()?.rollout.as_ref().map(|r| r.phase)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "boots qemu with Debian kernels: run it with `make test-kernel`"]
async fn a_revision_that_fails_to_attach_in_a_real_kernel_is_rolled_back() -> Result<()> {
    in_sched_ext_vm("rollback", async |s, vm| roll_back(s, vm).await).await
}

/// A first revision the kernel ejects goes back to the kernel's default; retried, a good
/// revision attaches, a broken one does not and is rolled back, the good one returns.
async fn roll_back(s: &Setup, vm: &mut TestVm) -> Result<()> {
    use sked_controller::api::RolloutPhase;
    let params = kube::api::PatchParams::default();
    let good = "/bin/sked-canary-loader hold /sked/sked_canary.bpf.o";

    // Revision zero: the first revision attaches, then SysRq-S ejects it before it is Ready.
    let doomed = run_pod(s, vm, "", good).await?;
    s.wait_kernel("the first revision attached", 1, "KernelAttached").await?;
    vm.run("echo S > /proc/sysrq-trigger").await?;
    let failed = s.fx.wait_scheduler(SCHEDULER, "failed", |s| rollout_phase(s) == Some(RolloutPhase::Failed)).await?;
    let failure = failed.status.and_then(|st| st.rollout).and_then(|r| r.failed).context("failure recorded")?;
    assert!(failure.cause.contains("disabled by sysrq-S"), "{}", failure.cause);
    s.fx.wait_event(SCHEDULER, "Warning", "RolledBack", 1).await?;
    wait_for("the node back on the kernel's default, without the pod", || async {
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(s.fx.client.clone(), &s.fx.namespace);
        let left = pods.list(&kube::api::ListParams::default().labels(&format!("name={SCHEDULER}"))).await?;
        let label = s.fx.nodes().get(NODE).await?.labels().get(sked_controller::api::labels::OWNER_LABEL).cloned();
        Ok((left.items.is_empty() && label.is_none()).then_some(()))
    })
    .await?;
    assert_eq!(vm.run("cat /sys/kernel/sched_ext/state").await?.trim(), "disabled");

    // Retried with a new spec: the good revision attaches; the kubelet marks its pod Ready.
    let retry = serde_json::json!({"spec": {"args": ["--retry"]}});
    s.fx.schedulers().patch(SCHEDULER, &params, &kube::api::Patch::Merge(&retry)).await?;
    let first = run_pod(s, vm, &doomed.name_any(), good).await?;
    s.wait_kernel("the good revision attached", 1, "KernelAttached").await?;
    s.fx.mark_pods_ready(SCHEDULER).await?;
    s.fx.wait_scheduler(SCHEDULER, "the first deployment complete", |s| {
        rollout_phase(s) == Some(RolloutPhase::Complete)
            && s.status.as_ref().and_then(|st| st.rollout.as_ref()).is_some_and(|r| r.current_revision.is_some())
    })
    .await?;

    // A new revision whose scheduler cannot attach: its object does not exist in the image.
    let broken = serde_json::json!({"spec": {
        "args": ["--broken"],
        "rollout": {"bakeSeconds": 1, "attachTimeoutSeconds": 10},
    }});
    s.fx.schedulers().patch(SCHEDULER, &params, &kube::api::Patch::Merge(&broken)).await?;
    let bad = "/bin/sked-canary-loader hold /sked/missing.bpf.o";
    let second = run_pod(s, vm, &first.name_any(), bad).await?;
    let failed =
        s.fx.wait_scheduler(SCHEDULER, "rolled back", |s| rollout_phase(s) == Some(RolloutPhase::RolledBack)).await?;
    let failure = failed.status.and_then(|st| st.rollout).and_then(|r| r.failed).context("failure recorded")?;
    assert_eq!(failure.node, NODE);
    assert!(failure.cause.starts_with("the kernel did not run the scheduler within 10s"), "{}", failure.cause);
    // The second: the first said it went back to the kernel's default.
    s.fx.wait_event(SCHEDULER, "Warning", "RolledBack", 2).await?;

    // The good revision comes back and attaches again in the real kernel.
    let third = run_pod(s, vm, &second.name_any(), good).await?;
    let args = third.spec.as_ref().and_then(|p| p.containers.first()).and_then(|c| c.args.clone());
    assert_eq!(args, Some(vec!["--retry".to_owned()]), "the retried revision is back");
    s.wait_kernel("the good revision attached again", 1, "KernelAttached").await?;
    assert_eq!(vm.run("cat /sys/kernel/sched_ext/root/ops").await?.trim(), "sked_canary");
    contract_gate(s, vm, &third.name_any(), good).await
}

/// The pods' CPU contract gates a bake (`analysis.cpuContract`): a pod limited to half a CPU
/// spins while a new revision of the canary, which implements no cgroup callback, bakes; the
/// revision is rolled back by analysis, naming the pod, the node, the revision and the callback.
async fn contract_gate(s: &Setup, vm: &mut TestVm, running: &str, canary: &str) -> Result<()> {
    s.fx.mark_pods_ready(SCHEDULER).await?;
    start_limited_pod(vm).await?;
    let gated = serde_json::json!({"spec": {"args": ["--contract"], "rollout": {
        "bakeSeconds": 10, "attachTimeoutSeconds": 60,
        "analysis": {"cpuContract": true, "minSamples": 3, "minControlNodes": 0, "onInconclusive": "Proceed"},
    }}});
    let params = kube::api::PatchParams::default();
    s.fx.schedulers().patch(SCHEDULER, &params, &kube::api::Patch::Merge(&gated)).await?;
    run_pod(s, vm, running, canary).await?;
    s.wait_kernel("the gated revision attached", 1, "KernelAttached").await?;
    s.fx.mark_pods_ready(SCHEDULER).await?;
    let cause_of = |s: &Scheduler| {
        s.status.as_ref().and_then(|st| st.rollout.as_ref()).and_then(|r| r.failed.as_ref()).map(|f| f.cause.clone())
    };
    let failed =
        s.fx.wait_scheduler(SCHEDULER, "rolled back for the pods' CPU contract", |s| {
            cause_of(s).is_some_and(|c| c.contains("cgroup_set_bandwidth"))
        })
        .await?;
    let cause = cause_of(&failed).unwrap_or_default();
    eprintln!("measured: the gated revision's failure: {cause}");
    for words in
        [&format!("pod UID {LIMITED_POD} used"), "on node kvm-node under revision", "no ops.cgroup_set_bandwidth"]
    {
        assert!(cause.contains(words), "{words:?} in {cause}");
    }
    s.fx.wait_event(SCHEDULER, "Warning", "AnalysisFailed", 1).await?;
    vm.run("kill $(cat /run/spin.pids); rm /run/spin.pids").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "boots qemu with Debian kernels: run it with `make test-kernel`"]
async fn a_cpu_going_off_line_restarts_the_scheduler_and_fails_no_revision() -> Result<()> {
    in_sched_ext_vm("hotplug", async |s, vm| hotplug(s, vm).await).await
}

/// A vCPU taken off line and back under the canary scheduler, during a new revision's bake: the
/// kernel unregisters the scheduler itself and asks for a restart (the canary implements no
/// cpu_online/cpu_offline), its loader registers it again, and the rollout goes on to
/// Complete: no ejection, no rollback.
async fn hotplug(s: &Setup, vm: &mut TestVm) -> Result<()> {
    use sked_controller::api::RolloutPhase;
    let params = kube::api::PatchParams::default();
    let canary = "/bin/sked-canary-loader hold /sked/sked_canary.bpf.o";
    let first = run_pod(s, vm, "", canary).await?;
    s.wait_kernel("the first revision attached", 1, "KernelAttached").await?;
    s.fx.mark_pods_ready(SCHEDULER).await?;
    let complete = |generation: i64| {
        move |s: &Scheduler| {
            rollout_phase(s) == Some(RolloutPhase::Complete)
                && s.status
                    .as_ref()
                    .and_then(|st| st.rollout.as_ref())
                    .and_then(|r| r.current_revision.as_ref())
                    .is_some_and(|r| r.generation == generation)
        }
    };
    s.fx.wait_scheduler(SCHEDULER, "the first deployment complete", complete(1)).await?;

    // A new revision, baked 20 s: the CPU goes off line and back within its bake.
    let next = serde_json::json!({"spec": {"args": ["--hotplug"], "rollout": {"bakeSeconds": 20, "attachTimeoutSeconds": 60}}});
    s.fx.schedulers().patch(SCHEDULER, &params, &kube::api::Patch::Merge(&next)).await?;
    run_pod(s, vm, &first.name_any(), canary).await?;
    s.wait_kernel("the new revision attached", 1, "KernelAttached").await?;
    s.fx.mark_pods_ready(SCHEDULER).await?;
    let online = "/sys/devices/system/cpu/cpu1/online";
    vm.run(&format!("echo 0 > {online}")).await?;
    let exit = wait_exit(s, "unregistered from the main kernel").await?;
    assert!(exit.restart && !exit.ejected && exit.ops == "sked_canary", "{exit:?}");
    let attached = vm
        .run(
            "for i in $(seq 1 200); do [ $(grep -c ^attached /run/canary.out) -ge 2 ] && break; sleep 0.05; done; \
             grep -c ^attached /run/canary.out",
        )
        .await?;
    assert_eq!(attached.trim(), "2", "the loader registered the canary again");
    s.wait_kernel("attached again after the restart", 1, "KernelAttached").await?;
    vm.run(&format!("echo 1 > {online}")).await?;
    let sched = s.fx.wait_scheduler(SCHEDULER, "the new revision complete", complete(2)).await?;
    let loader = vm.run("cat /run/canary.out").await?;
    eprintln!("measured: the canary's loader through the hotplug:\n{loader}");
    assert!(loader.lines().filter(|l| l.starts_with("restart ")).count() >= 1, "{loader}");
    let events = s.fx.scheduler_events(SCHEDULER).await?;
    let warnings: Vec<&(String, String)> = events.keys().filter(|(kind, _)| kind == "Warning").collect();
    assert!(warnings.is_empty(), "no ejection, no rollback: {warnings:?}");
    assert!(sched.status.and_then(|st| st.rollout).is_some_and(|r| r.failed.is_none()));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "boots qemu with Debian kernels: run it with `make test-kernel`"]
async fn a_revision_that_slows_a_real_kernel_is_rolled_back_by_analysis() -> Result<()> {
    in_sched_ext_vm("analysis", async |s, vm| analysis(s, vm).await).await
}

/// Prints what the VM's agent costs: its resident memory, and its CPU time over its life as a
/// share of one CPU (under emulation, so more than on hardware).
async fn agent_cost(vm: &mut TestVm) -> Result<()> {
    let out = vm
        .run("pid=$(cat /run/agent.pid); grep VmRSS /proc/$pid/status; cut -d' ' -f14,15,22 /proc/$pid/stat; cut -d' ' -f1 /proc/uptime")
        .await?;
    let lines: Vec<&str> = out.lines().collect();
    let numbers = |i: usize| -> Vec<f64> {
        lines.get(i).map(|l| l.split_whitespace().filter_map(|w| w.parse().ok()).collect()).unwrap_or_default()
    };
    let (stat, uptime) = (numbers(1), numbers(2));
    if let ([user, system, start], [up]) = (stat.as_slice(), uptime.as_slice()) {
        // Clock ticks at USER_HZ, 100 on x86.
        let life = up - start / 100.0;
        let share = (user + system) / 100.0 / life * 100.0;
        eprintln!(
            "measured: VM agent at a 1 s sample: {}; CPU {share:.2} % of one core over {life:.0} s",
            lines[0].trim()
        );
    }
    Ok(())
}

/// Waits until the controller received `n` more reports from the VM's agent (a heartbeat every
/// 2 s carries the samples taken since the last, one a second). Waited on from the host: a test
/// that polled the VM would add its own runnable tasks to what the agent measures, more in the
/// window before a switch than in the bake.
async fn more_reports(s: &Setup, n: u64) -> Result<()> {
    let from = s.fx.report_stats.reports.get();
    wait_for(&format!("{n} more reports from the VM's agent"), || async {
        Ok((s.fx.report_stats.reports.get() >= from + n).then_some(()))
    })
    .await
}

/// Under a CPU-bound load (four spinning shells on two CPUs), judged by the slice-neutral
/// signals at their default limits and by the node's own change alone (the VM is one node,
/// `minControlNodes: 0`): a revision of the canary passes; the slow variant (250 ms turns from
/// one FIFO, a waking task first) passes too, since a longer slice runs the same work; the
/// stranding variant (only CPU 0 runs tasks that may move, in 5 ms slices) attaches, stays
/// attached, and is rolled back by the analysis of its bake, for the CPU it leaves idle beside
/// waiting tasks.
async fn analysis(s: &Setup, vm: &mut TestVm) -> Result<()> {
    use sked_controller::api::{AnalysisVerdict, RolloutPhase};
    let good = "/bin/sked-canary-loader hold /sked/sked_canary.bpf.o";
    let first = run_pod(s, vm, "", good).await?;
    s.wait_kernel("the canary attached", 1, "KernelAttached").await?;
    s.fx.mark_pods_ready(SCHEDULER).await?;
    s.fx.wait_scheduler(SCHEDULER, "the first deployment complete", |s| {
        rollout_phase(s) == Some(RolloutPhase::Complete)
    })
    .await?;
    // The load first, for longer than the agent's report carries (its last 16 samples, one a
    // second): the window before the next switch must be the loaded node's, not a quiet one's.
    // (With a first deployment that baked 30 s, the agent's first report after the analysis
    // below carried 16 quiet samples, and the good revision failed by +2344 %.)
    vm.run("for i in 1 2 3 4; do sh -c 'while :; do :; done' >/dev/null 2>&1 & done").await?;
    more_reports(s, 12).await?;
    // Then the analysis, alone: pacing changes no revision, and the controller keeps the
    // node's samples from then on (its own window before the next switch).
    let pacing = serde_json::json!({"spec": {"rollout": analysed_rollout()}});
    s.fx.schedulers().patch(SCHEDULER, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&pacing)).await?;

    // A good revision: its bake is judged against the node's own samples before its switch.
    let (second, sched) = bake(s, &first.name_any(), "--again", good, vm).await?;
    let verdict = verdict_of(sched)?;
    let canary = agent_signals(s, vm).await?;
    measured("canary", &verdict, &canary);
    assert_eq!(verdict.verdict, AnalysisVerdict::Passed, "{verdict:?}");

    // The slow revision: the same work in 250 ms turns. Run delay per timeslice grows; the
    // slice-neutral signals stay within their limits. (Were waking tasks queued behind those
    // turns too, each wakeup would wait about that long: waiting tasks per CPU rose 90 % so,
    // a harm to every task that sleeps, and caught.)
    let slow = "/bin/sked-canary-loader hold /sked/sked_slow.bpf.o";
    let (third, sched) = bake(s, &second.name_any(), "--slow", slow, vm).await?;
    let verdict = verdict_of(sched)?;
    let slow_signals = agent_signals(s, vm).await?;
    measured("slow variant (250 ms slices)", &verdict, &slow_signals);
    assert_eq!(
        verdict.verdict,
        AnalysisVerdict::Passed,
        "a longer slice alone fails no slice-neutral signal: {verdict:?}"
    );
    // The turns were longer: the signal that depends on the slice moved. Run delay per
    // timeslice is about the tasks waiting per CPU times the slice, so its ratio to them (the
    // slice as the tasks felt it) is what grows; the delay alone also follows the load, which
    // shifts between two bakes under emulation. The 250 ms turns are cut short by every
    // wakeup (waking tasks preempt), so the felt slice grows far less than the turn: 2026-12-07,
    // 17 ms for the canary against 24 ms and 32 ms for the slow variant in two runs. Only the
    // direction is asserted.
    let felt = |s: &AgentSignals| s.run_delay_ms / s.waiting_per_cpu.max(0.1);
    assert!(felt(&slow_signals) > felt(&canary), "slow: {slow_signals}; canary: {canary}");

    // The stranding revision: attached all along, rolled back by the analysis of its bake.
    let strand = "/bin/sked-canary-loader hold /sked/sked_strand.bpf.o";
    let (_, sched) = bake(s, &third.name_any(), "--strand", strand, vm).await?;
    let stranding = agent_signals(s, vm).await?;
    stranded(s, vm, sched, &stranding).await?;
    // Its turns are short: run delay per timeslice (not judged here) stays near the canary's,
    // so a latency signal would not have told this harm.
    assert!(stranding.run_delay_ms < 2.0 * canary.run_delay_ms, "stranding: {stranding}; canary: {canary}");

    agent_cost(vm).await?;
    // Emulation can be slow enough for the RCU stall detector: say so (an ejection it caused
    // fails the test above).
    let stalls = vm.run("dmesg | grep -i -e 'rcu.*stall' -e 'task stall' || true").await?;
    if !stalls.trim().is_empty() {
        eprintln!("stalls in the VM's kernel log:\n{stalls}");
    }
    // The revision that passed last is what the node gets back (the rollback's pod attaching is
    // the rollback test's part).
    wait_for("the DaemonSet back on the revision that passed", || async {
        let ds = s.fx.daemonsets().get(SCHEDULER).await?;
        let template = ds.spec.template.spec.and_then(|p| p.containers.into_iter().next());
        Ok((template.and_then(|c| c.args) == Some(vec!["--slow".to_owned()])).then_some(()))
    })
    .await
}

/// The rollout every revision of the analysis test bakes under: the slice-neutral signals at
/// their default limits (waiting tasks per CPU +50 %, idle CPUs beside waiting tasks +10
/// points, utilisation -10 points), each node judged by its own change.
fn analysed_rollout() -> serde_json::Value {
    serde_json::json!({
        "bakeSeconds": 6, "attachTimeoutSeconds": 60,
        "analysis": {
            "waitingTasks": {}, "idleWhileWaiting": {}, "utilisation": {},
            "minSamples": 5, "minControlNodes": 0,
        },
    })
}

/// Switches the VM's node to the revision `args` makes, running `scheduler` (after 4 reports,
/// about 8 samples, under the revision before: the node's own window before its switch), and
/// returns its pod and the Scheduler once the rollout completed with a verdict on its bake or
/// was rolled back.
async fn bake(
    s: &Setup,
    old: &str,
    args: &str,
    scheduler: &str,
    vm: &mut TestVm,
) -> Result<(k8s_openapi::api::core::v1::Pod, Scheduler)> {
    use sked_controller::api::RolloutPhase;
    let judged = |s: &Scheduler| s.status.as_ref()?.rollout.as_ref()?.analysis.as_ref().map(|a| a.revision.clone());
    let before = judged(&s.fx.schedulers().get(SCHEDULER).await?);
    more_reports(s, 4).await?;
    let patch = serde_json::json!({"spec": {"args": [args], "rollout": analysed_rollout()}});
    s.fx.schedulers().patch(SCHEDULER, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await?;
    let pod = run_pod(s, vm, old, scheduler).await?;
    s.wait_kernel(&format!("the {args} revision attached"), 1, "KernelAttached").await?;
    s.fx.mark_pods_ready(SCHEDULER).await?;
    // A failed verdict goes with its revision: the rollback leaves only its cause.
    let sched =
        s.fx.wait_scheduler(SCHEDULER, &format!("the verdict on the bake of {args}"), |s| match rollout_phase(s) {
            Some(RolloutPhase::RolledBack) => true,
            Some(RolloutPhase::Complete) => judged(s).is_some_and(|r| Some(&r) != before.as_ref()),
            _ => false,
        })
        .await?;
    Ok((pod, sched))
}

/// The verdict on a bake that passed (a rollback is an error, with its cause).
fn verdict_of(sched: Scheduler) -> Result<sked_controller::api::AnalysisStatus> {
    let rollout = sched.status.and_then(|st| st.rollout).context("a rollout")?;
    if let Some(failed) = rollout.failed {
        anyhow::bail!("rolled back on {}: {}", failed.node, failed.cause);
    }
    rollout.analysis.context("a verdict")
}

/// The stranding revision was rolled back for a slice-neutral signal on the VM's node, by a
/// figure well past its limit, and was attached until then.
async fn stranded(s: &Setup, vm: &mut TestVm, sched: Scheduler, agent: &AgentSignals) -> Result<()> {
    let rollout = sched.status.and_then(|st| st.rollout).context("a rollout")?;
    let failure = rollout
        .failed
        .with_context(|| format!("the stranding revision was not rolled back: {:?}", rollout.analysis))?;
    eprintln!("measured: stranding variant (CPU 0 alone, 5 ms slices) under load: {}; {agent}", failure.cause);
    assert_eq!((failure.node.as_str(), failure.reason.as_deref()), (NODE, Some("AnalysisFailed")));
    let (signal, figure) = cause_figure(&failure.cause).with_context(|| format!("a figure in {}", failure.cause))?;
    // 4 tasks that may move and CPU 0 alone runs them: CPU 1 idles (about 50 points of the
    // CPUs' time) while 3 wait (1.5 a CPU, from 1.0).
    let harm = match signal {
        "idle CPUs beside waiting tasks" => figure.during - figure.before >= 20.0,
        "CPU utilisation" => figure.before - figure.during >= 20.0,
        "waiting tasks per CPU" => figure.during >= 1.3 * figure.before,
        _ => false,
    };
    assert!(harm, "{signal} {figure:?}: {}", failure.cause);
    assert_eq!(vm.run("cat /sys/kernel/sched_ext/root/ops").await?.trim(), "sked_canary", "attached until rolled back");
    s.fx.wait_event(SCHEDULER, "Warning", "AnalysisFailed", 1).await?;
    Ok(())
}

/// A signal's median before the switch and over the bake (percent values in percent).
#[derive(Debug)]
struct Figure {
    before: f64,
    during: f64,
}

/// The slice-neutral signal a failure's cause names, with its figures: "CPU utilisation on
/// kvm-node went from 99.9 % before its switch to 50.1 % during the bake of revision ...".
fn cause_figure(cause: &str) -> Option<(&'static str, Figure)> {
    let (signal, rest) = ["waiting tasks per CPU", "idle CPUs beside waiting tasks", "CPU utilisation"]
        .into_iter()
        .find_map(|signal| Some((signal, cause.strip_prefix(format!("{signal} on {NODE} went from ").as_str())?)))?;
    let (before, rest) = rest.split_once(" before its switch to ")?;
    let (during, _) = rest.split_once(" during the bake")?;
    let number = |v: &str| v.trim_end_matches(" %").parse::<f64>().ok();
    Some((signal, Figure { before: number(before)?, during: number(during)? }))
}

/// Prints a verdict on a bake, with what the VM's agent measured after it.
fn measured(what: &str, verdict: &sked_controller::api::AnalysisStatus, agent: &AgentSignals) {
    let details: Vec<&str> = verdict.nodes.iter().map(|n| n.detail.as_str()).collect();
    eprintln!(
        "measured: {what} under load: {:?}: {}; {}; {agent}",
        verdict.verdict,
        verdict.message,
        details.join(" | ")
    );
}

/// What the VM's agent measured, the median of its last sample at three heartbeats: waiting
/// tasks per CPU, utilisation and run delay per timeslice (which no verdict here judges).
#[derive(Debug)]
struct AgentSignals {
    waiting_per_cpu: f64,
    utilisation: f64,
    run_delay_ms: f64,
}

impl std::fmt::Display for AgentSignals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the agent's last samples: waiting tasks per CPU {:.2}, utilisation {:.1} %, run delay per timeslice {:.1} ms",
            self.waiting_per_cpu,
            self.utilisation * 100.0,
            self.run_delay_ms
        )
    }
}

async fn agent_signals(s: &Setup, vm: &mut TestVm) -> Result<AgentSignals> {
    let mut scrapes: [Vec<f64>; 3] = Default::default();
    for _ in 0..3 {
        more_reports(s, 1).await?;
        let text = vm.run("wget -qO- http://127.0.0.1:9464/metrics").await?;
        let names =
            ["sked_agent_waiting_tasks_per_cpu", "sked_agent_cpu_utilisation_ratio", "sked_agent_run_delay_seconds"];
        for (values, name) in scrapes.iter_mut().zip(names) {
            let value = text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok());
            values.push(value.with_context(|| format!("{name} in the VM agent's metrics"))?);
        }
    }
    let [waiting, used, delay] = scrapes.map(|mut v| {
        v.sort_by(f64::total_cmp);
        v[1]
    });
    Ok(AgentSignals { waiting_per_cpu: waiting, utilisation: used, run_delay_ms: delay * 1000.0 })
}
