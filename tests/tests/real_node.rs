//! sked on a real node: the sched_ext kernel under qemu with containerd and a kubelet
//! ([`TestNode`]), images built here and pulled by that kubelet, the chart installed with
//! `helm install`, and a Scheduler applied with `kubectl`. Nothing plays the kubelet for the
//! scheduler pods: readiness is the agent's /readyz as the kubelet probes it.
//!
//! The chart's controller runs on the host as a process ([`ControllerPods`]), not as a pod in
//! the VM: its image would need a release build of the controller (about 10 minutes on 2 cores)
//! and would share the emulated CPUs with the node. The agents reach it through the VM's console
//! relay, under the reports Service's name.
//!
//! Needs qemu, the kernels and the pinned kubelet: `make test-node` (not part of `make test`).

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use sked_controller::Scheduler;
use sked_tests::node::NodeInstall;
use sked_tests::{Fixture, condition, wait_for_within};

const NS: &str = "sked-system";
const NODE: &str = "sked-node";
/// Deadline of each wait on the node: a pod's start under emulation (three image pulls over the
/// console relay, three containers) takes a minute or more.
const SLOW: Duration = Duration::from_secs(300);

use sked_tests::command::output_text as text;

/// The scheduler pods of `scheduler` (not being deleted).
async fn pods_of(fx: &Fixture, scheduler: &str) -> Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(fx.client.clone(), NS);
    let list = pods.list(&ListParams::default().labels(&format!("name={scheduler}"))).await?;
    Ok(list.items.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect())
}

/// (Ready, restarts of the scheduler container) of a pod, as its kubelet reports them.
fn pod_state(pod: &Pod) -> (bool, i32) {
    let status = pod.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let restarts = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.iter().find(|c| c.name == "scx"))
        .map_or(0, |c| c.restart_count);
    (ready, restarts)
}

/// `attached` of the one scheduled node run the scheduler in the kernel, and the KernelAttached
/// condition says so.
fn attached(s: &Scheduler, attached: i32) -> bool {
    let status = if attached == 1 { "True" } else { "False" };
    s.status.as_ref().is_some_and(|st| st.kernel_attached == attached && st.desired_number_scheduled == 1)
        && condition(s, "KernelAttached").is_some_and(|c| c.status == status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "boots a Kubernetes node under qemu: run it with `make test-node`"]
async fn a_scheduler_applied_with_kubectl_attaches_on_a_real_node() -> Result<()> {
    let started = Instant::now();
    let dir = tempfile::Builder::new().prefix("sked-node-e2e-").tempdir()?;
    let fx = Fixture::without_controller().await?;
    sked_tests::objects::fresh_release_namespace(&fx.client, NS).await;
    let mut install = NodeInstall::start(fx.cluster, &fx.client, dir.path(), NS, NODE).await?;
    for (what, took) in &install.timings {
        eprintln!("measured: {what}: {took:?}");
    }
    for (name, size) in &install.images.sizes {
        eprintln!("measured: image {name}: {:.1} MB compressed", *size as f64 / 1e6);
    }
    let result = on_the_node(&fx, &mut install).await;
    if result.is_err() {
        eprintln!("{}\ncontroller:\n{}", install.node.diagnostics().await, install.controller.logs());
    }
    result?;
    eprintln!("measured: whole test {:?}", started.elapsed());
    install.node.vm.shutdown().await
}

async fn on_the_node(fx: &Fixture, install: &mut NodeInstall) -> Result<()> {
    let (intruder, canary) = (install.scheduler_manifest("intruder"), install.scheduler_manifest("canary"));
    let (node, images) = (&mut install.node, &install.images);
    // kubectl apply -> verified digest -> DaemonSet -> the kubelet pulls and runs the pod -> the
    // scheduler attaches -> the agent in the pod reports.
    let applying = Instant::now();
    let out = fx.kubectl_apply(&canary)?;
    ensure!(out.status.success(), "kubectl apply:\n{}", text(&out));
    fx.wait_scheduler_within("canary", "KERNEL-ATTACHED 1/1", SLOW, |s| attached(s, 1)).await?;
    eprintln!("measured: kubectl apply -> KERNEL-ATTACHED 1/1: {:?}", applying.elapsed());
    let out = fx.cluster.kubectl(&["wait", "--for=condition=Ready", "scheduler/canary", "--timeout=120s"])?;
    ensure!(out.status.success(), "kubectl wait --for=condition=Ready:\n{}", text(&out));
    let out = fx.cluster.kubectl(&["get", "schedulers"])?;
    let listing = text(&out);
    eprintln!("{listing}");
    let row = listing.lines().find(|l| l.starts_with("canary")).context("kubectl get schedulers lists canary")?;
    ensure!(row.split_whitespace().any(|c| c == "1/1"), "KERNEL-ATTACHED shows 1/1: {row}");
    let digest = images.canary.rsplit_once('@').map(|(_, d)| d).context("the canary image has no digest")?;
    let pod = pods_of(fx, "canary").await?.pop().context("the canary pod")?;
    let image =
        pod.spec.as_ref().and_then(|s| s.containers.iter().find(|c| c.name == "scx")).and_then(|c| c.image.clone());
    ensure!(
        image.as_deref().is_some_and(|i| i.ends_with(digest)),
        "the pod runs the verified digest {digest}: {image:?}"
    );
    let uid = pod.uid().unwrap_or_default();
    let ops = node.vm.run("cat /sys/kernel/sched_ext/root/ops").await?;
    ensure!(ops.trim() == "sked_canary", "the kernel runs the canary: {ops:?}");

    // kubectl sked reads the same from the pod's condition: the node's row, and doctor.
    let plugin = sked_tests::agents::workspace_binary("kubectl-sked", "SKED_KUBECTL_SKED_BIN")?;
    let sked = |args: &[&str]| {
        std::process::Command::new(&plugin)
            .arg("--kubeconfig")
            .arg(&fx.cluster.kubeconfig)
            .args(["-n", NS])
            .args(args)
            .output()
    };
    let status = wait_for_within("kubectl sked status: the node attached", SLOW, || async {
        let said = text(&sked(&["status", "canary"])?);
        let row = said.lines().any(|l| l.starts_with(NODE) && l.contains(" attached ") && l.contains(" sked_canary "));
        Ok(row.then_some(said))
    })
    .await?;
    eprintln!("{status}");
    let doctor = text(&sked(&["doctor", NODE])?);
    ensure!(
        doctor.contains("Nothing to do: the kernel runs canary's scheduler (ops sked_canary)"),
        "kubectl sked doctor {NODE}:\n{doctor}"
    );
    ensure!(doctor.contains("sched_ext:") && doctor.contains("supported"), "kubectl sked doctor {NODE}:\n{doctor}");

    // The agent's /metrics, scraped from the pod's address.
    let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone()).context("the pod's IP")?;
    let metrics = node.vm.run(&format!("wget -qO- http://{ip}:{}/metrics", sked_proto::contract::AGENT_PORT)).await?;
    ensure!(metrics.contains("sked_agent_"), "the agent's /metrics from the pod:\n{metrics}");
    // It found the controller through the replicas' headless Service (the chart's
    // --reports-replicas), not the leader's Service: a stream every replica keeps.
    ensure!(metrics.lines().any(|l| l == "sked_agent_report_streams_open 1"), "the agent's /metrics:\n{metrics}");
    ensure!(
        install.controller.logged(&["report stream accepted", NODE, "\"every_replica\":true"]),
        "no stream through sked-reports-replicas in the controller's log:\n{}",
        install.controller.logs()
    );

    // The scheduler process killed: the pod turns NotReady and KernelAttached False; the
    // kubelet restarts it and both come back.
    let killing = Instant::now();
    node.vm.run("killall sked-canary-loader").await?;
    let not_ready = wait_for_within("the pod NotReady after its scheduler was killed", SLOW, || async {
        let pod = pods_of(fx, "canary").await?.pop();
        Ok(pod.filter(|p| !pod_state(p).0).map(|_| killing.elapsed()))
    })
    .await?;
    let detached = fx.wait_scheduler_within("canary", "KernelAttached False", SLOW, |s| attached(s, 0)).await?;
    eprintln!(
        "measured: scheduler killed -> pod NotReady {not_ready:?}, -> KernelAttached False {:?}",
        killing.elapsed()
    );
    if let Some(c) = condition(&detached, "KernelAttached") {
        eprintln!("KernelAttached {} {}: {}", c.status, c.reason, c.message);
    }
    fx.wait_scheduler_within("canary", "KERNEL-ATTACHED 1/1 after the kubelet's restart", SLOW, |s| attached(s, 1))
        .await?;
    let restarted = wait_for_within("the restarted pod Ready", SLOW, || async {
        let pod = pods_of(fx, "canary").await?.pop();
        Ok(pod.filter(|p| pod_state(p).0 && pod_state(p).1 >= 1))
    })
    .await?;
    eprintln!("measured: scheduler killed -> restarted, Ready and attached again: {:?}", killing.elapsed());
    ensure!(restarted.uid().unwrap_or_default() == uid, "the same pod, its container restarted");
    let restarts = pod_state(&restarted).1;

    // A second Scheduler for the same node loses it to the older one and leaves it alone.
    let out = fx.kubectl_apply(&intruder)?;
    ensure!(out.status.success(), "kubectl apply intruder:\n{}", text(&out));
    // (The canary serves no statistics: the agent says so once and counts it.)
    ensure!(metrics.contains("sked_agent_scx_stats_up 0"), "no statistics relayed for the canary:\n{metrics}");
    fx.wait_scheduler_within("intruder", "the intruder losing the node", SLOW, |s| {
        condition(s, "Degraded").is_some_and(|c| c.reason == "SchedulerConflict")
            && s.status.as_ref().is_some_and(|st| st.desired_number_scheduled == 0)
    })
    .await?;
    ensure!(pods_of(fx, "intruder").await?.is_empty(), "the intruder has no pod");
    let pod = pods_of(fx, "canary").await?.pop().context("the canary pod")?;
    ensure!(pod.uid().unwrap_or_default() == uid && pod_state(&pod) == (true, restarts), "the canary pod untouched");
    let ops = node.vm.run("cat /sys/kernel/sched_ext/root/ops").await?;
    ensure!(ops.trim() == "sked_canary", "the kernel still runs the canary: {ops:?}");

    upstream_scheduler(fx, install).await?;

    // kubectl delete: the node goes back to the kernel's default scheduler.
    let node = &mut install.node;
    let deleting = Instant::now();
    for name in ["intruder", "canary"] {
        let out = fx.cluster.kubectl(&["delete", "scheduler", name, "--wait=true", "--timeout=120s"])?;
        ensure!(out.status.success(), "kubectl delete scheduler {name}:\n{}", text(&out));
    }
    let all_pods: Api<Pod> = Api::namespaced(fx.client.clone(), NS);
    wait_for_within("the canary pod gone (its kubelet confirmed it stopped)", SLOW, || async {
        Ok(all_pods.list(&ListParams::default().labels("name=canary")).await?.items.is_empty().then_some(()))
    })
    .await?;
    node.vm
        .wait_until("the kernel back on its default scheduler", "grep -qx disabled /sys/kernel/sched_ext/state", SLOW)
        .await?;
    eprintln!("measured: kubectl delete scheduler -> pod gone, sched_ext disabled: {:?}", deleting.elapsed());
    Ok(())
}

/// The rollout's phase and whether the generation's revision completed, attached.
fn rolled(s: &Scheduler) -> (Option<sked_controller::api::RolloutPhase>, bool) {
    let rollout = s.status.as_ref().and_then(|st| st.rollout.as_ref());
    let generation = s.metadata.generation.unwrap_or(0);
    let current = rollout.and_then(|r| r.current_revision.as_ref()).is_some_and(|r| r.generation == generation);
    (rollout.map(|r| r.phase), current && attached(s, 1))
}

/// Applies `manifest` (a new revision of Scheduler `canary`) and follows its rollout to Complete,
/// with every phase seen on the way.
async fn roll(fx: &Fixture, manifest: &str, what: &str) -> Result<Vec<sked_controller::api::RolloutPhase>> {
    let out = fx.kubectl_apply(manifest)?;
    ensure!(out.status.success(), "kubectl apply ({what}):\n{}", text(&out));
    let generation = fx.schedulers().get("canary").await?.metadata.generation.unwrap_or(0);
    let phases = std::sync::Mutex::new(Vec::new());
    wait_for_within(what, SLOW, || async {
        let s = fx.schedulers().get("canary").await?;
        let (phase, done) = rolled(&s);
        let observed = s.status.as_ref().and_then(|st| st.rollout.as_ref()).and_then(|r| r.update_revision.as_ref());
        if let Some(phase) = phase.filter(|_| observed.is_some_and(|r| r.generation == generation)) {
            let mut phases = phases.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if phases.last() != Some(&phase) {
                phases.push(phase);
            }
        }
        Ok(done.then_some(()))
    })
    .await?;
    let phases = phases.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
    Ok(phases)
}

/// The `scx_*` series of a scrape, by series.
fn relayed(scrape: &str) -> std::collections::BTreeMap<String, String> {
    let series = scrape.lines().filter(|l| l.starts_with("scx_"));
    series.filter_map(|l| l.rsplit_once(' ').map(|(k, v)| (k.to_owned(), v.to_owned()))).collect()
}

/// scx_bpfland 1.1.4, built from crates.io, under sked: a revision that cannot start says why and
/// is rolled back; the real one rolls out from the canary scheduler (canary, bake, complete),
/// attaches with its own ops name, its statistics are relayed and move, its kill and restart are
/// seen; then the canary scheduler is rolled back in the same way.
async fn upstream_scheduler(fx: &Fixture, install: &mut NodeInstall) -> Result<()> {
    let (broken, good, back) = (
        install.bpfland_manifest("canary", &["--no-such-flag"]),
        install.bpfland_manifest("canary", &[]),
        install.scheduler_manifest("canary"),
    );
    let node = &mut install.node;
    // A revision whose scheduler exits at once: rolled back, with its own last words as the cause.
    let breaking = Instant::now();
    let out = fx.kubectl_apply(&broken)?;
    ensure!(out.status.success(), "kubectl apply (bpfland, a flag it refuses):\n{}", text(&out));
    let failed = fx
        .wait_scheduler_within("canary", "the broken revision rolled back", SLOW, |s| {
            let rollout = s.status.as_ref().and_then(|st| st.rollout.as_ref());
            rollout.is_some_and(|r| r.phase == sked_controller::api::RolloutPhase::RolledBack && r.failed.is_some())
                && attached(s, 1)
        })
        .await?;
    let cause = failed.status.and_then(|st| st.rollout).and_then(|r| r.failed).map(|f| f.cause).unwrap_or_default();
    eprintln!("measured: the broken revision applied -> rolled back: {:?}; its cause: {cause}", breaking.elapsed());
    ensure!(
        cause.contains("crash-looping") && cause.contains("--no-such-flag"),
        "the cause quotes what the scheduler said: {cause}"
    );
    let ops = node.vm.run("cat /sys/kernel/sched_ext/root/ops").await?;
    ensure!(ops.trim() == "sked_canary", "rolled back to the canary: {ops:?}");

    // The upstream scheduler, rolled out: canary, bake, complete.
    let rolling = Instant::now();
    let phases = roll(fx, &good, "scx_bpfland rolled out and attached").await?;
    eprintln!("measured: canary -> scx_bpfland rolled out: {:?} (phases {phases:?})", rolling.elapsed());
    ensure!(
        phases.first() == Some(&sked_controller::api::RolloutPhase::Canary),
        "the node went first as the canary: {phases:?}"
    );
    let ops = node.vm.run("cat /sys/kernel/sched_ext/root/ops").await?;
    ensure!(ops.trim().starts_with("bpfland_1.1.4"), "the kernel runs scx_bpfland: {ops:?}");
    let pod = pods_of(fx, "canary").await?.pop().context("the bpfland pod")?;
    let (uid, ip) = (pod.uid().unwrap_or_default(), pod.status.as_ref().and_then(|s| s.pod_ip.clone()).context("IP")?);

    // Its statistics, relayed by the agent: they move, and the scrape passes promtool.
    let scrape = format!("wget -qO- http://{ip}:{}/metrics", sked_proto::contract::AGENT_PORT);
    let relaying = Instant::now();
    let deadline = Instant::now() + SLOW;
    let first = loop {
        let scraped = node.vm.run(&scrape).await?;
        if relayed(&scraped).len() >= 3 {
            break scraped;
        }
        ensure!(Instant::now() < deadline, "scx_bpfland's statistics never relayed:\n{scraped}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    eprintln!("measured: scx_bpfland attached -> its statistics relayed: {:?}", relaying.elapsed());
    let before = relayed(&first);
    ensure!(
        before.keys().all(|k| k.contains("scheduler=\"canary\"") && k.contains("ops=\"bpfland_1.1.4")),
        "{before:?}"
    );
    let moved = loop {
        let scraped = node.vm.run(&scrape).await?;
        let now = relayed(&scraped);
        let moved: Vec<String> =
            now.iter().filter(|(k, v)| before.get(*k) != Some(v)).map(|(k, _)| k.clone()).collect();
        // The dispatch counters grow while the kernel runs it; the gauges (nr_running) may hold
        // still on an idle VM.
        if moved.iter().filter(|k| k.contains("_dispatches{")).count() >= 2 {
            break moved;
        }
        if Instant::now() >= deadline {
            let relay: Vec<&str> = scraped.lines().filter(|l| l.contains("scx_stats") && !l.starts_with('#')).collect();
            bail!(
                "fewer than two dispatch counters moved in {SLOW:?}: moved {moved:?}; first {before:?}; now {now:?}; the relay: {relay:?}"
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let names: std::collections::BTreeSet<&str> = before.keys().filter_map(|k| k.split('{').next()).collect();
    eprintln!(
        "measured: relayed -> two dispatch counters moved: {:?}; {} series of scx_bpfland ({names:?}), moving: {moved:?}",
        relaying.elapsed(),
        before.len()
    );
    sked_tests::promtool_check_metrics(&first).context("the agent's scrape, with scx_bpfland's statistics")?;

    // Killed: NotReady, KernelAttached False, restarted by the kubelet, attached again.
    let killing = Instant::now();
    node.vm.run("killall scx_bpfland").await?;
    fx.wait_scheduler_within("canary", "KernelAttached False after scx_bpfland was killed", SLOW, |s| attached(s, 0))
        .await?;
    let restarted = wait_for_within("scx_bpfland restarted, Ready and attached", SLOW, || async {
        let pod = pods_of(fx, "canary").await?.pop();
        Ok(pod.filter(|p| pod_state(p).0 && pod_state(p).1 >= 1))
    })
    .await?;
    fx.wait_scheduler_within("canary", "KERNEL-ATTACHED 1/1 again", SLOW, |s| attached(s, 1)).await?;
    eprintln!("measured: scx_bpfland killed -> restarted and attached again: {:?}", killing.elapsed());
    ensure!(restarted.uid().unwrap_or_default() == uid, "the same pod, its container restarted");

    // And back to the canary scheduler, the same way.
    let rolling = Instant::now();
    let phases = roll(fx, &back, "the canary scheduler rolled out again").await?;
    eprintln!("measured: scx_bpfland -> canary rolled out: {:?} (phases {phases:?})", rolling.elapsed());
    ensure!(phases.first() == Some(&sked_controller::api::RolloutPhase::Canary), "{phases:?}");
    let ops = node.vm.run("cat /sys/kernel/sched_ext/root/ops").await?;
    ensure!(ops.trim() == "sked_canary", "the kernel runs the canary again: {ops:?}");
    cpu_contract(fx, install).await
}

/// The pods' CPU contract on the real node: a pod limited to half a CPU (`limits.cpu: 500m`,
/// its cgroup made by the kubelet) spins on two threads. Under the canary, which implements no
/// cgroup callback, the Scheduler's PodCPUContract turns False naming the pod; scx_bpfland
/// rolled out with `analysis.cpuContract` is rolled back, naming the pod and the callback.
async fn cpu_contract(fx: &Fixture, install: &mut NodeInstall) -> Result<()> {
    let gated = install.bpfland_manifest("canary", &["--exit-dump-len", "4096"]).replace(
        "    attachTimeoutSeconds: 240\n",
        "    attachTimeoutSeconds: 240\n    analysis:\n      cpuContract: true\n      minControlNodes: 0\n      \
         onInconclusive: Proceed\n",
    );
    let spinner: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "spinner", "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            // No token: nothing here publishes the kube-root-ca.crt its volume would need.
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "spin", "image": install.images.canary,
                "command": ["/usr/local/bin/sked-canary-loader", "spin", "2"],
                "resources": {"limits": {"cpu": "500m", "memory": "32Mi"}},
            }],
        },
    }))?;
    let pods: Api<Pod> = Api::namespaced(fx.client.clone(), "default");
    let uid = pods.create(&Default::default(), &spinner).await?.uid().unwrap_or_default();
    let limited = Instant::now();
    let broken = fx
        .wait_scheduler_within("canary", "PodCPUContract False under the canary", SLOW, |s| {
            condition(s, "PodCPUContract").is_some_and(|c| c.reason == "LimitsNotEnforced" && c.message.contains(&uid))
        })
        .await?;
    let message = condition(&broken, "PodCPUContract").map(|c| c.message.clone()).unwrap_or_default();
    eprintln!("measured: a pod limited to 500m created -> PodCPUContract False: {:?}; {message}", limited.elapsed());
    ensure!(message.contains("lacks ops.cgroup_set_bandwidth"), "{message}");

    let rolling = Instant::now();
    let out = fx.kubectl_apply(&gated)?;
    ensure!(out.status.success(), "kubectl apply (bpfland, cpuContract):\n{}", text(&out));
    let cause_of = |s: &Scheduler| {
        s.status.as_ref().and_then(|st| st.rollout.as_ref()).and_then(|r| r.failed.as_ref()).map(|f| f.cause.clone())
    };
    let failed = fx
        .wait_scheduler_within("canary", "scx_bpfland rolled back for the pods' CPU contract", SLOW, |s| {
            cause_of(s).is_some_and(|c| c.contains(&uid)) && attached(s, 1)
        })
        .await?;
    let cause = cause_of(&failed).unwrap_or_default();
    eprintln!("measured: scx_bpfland with cpuContract applied -> rolled back: {:?}; {cause}", rolling.elapsed());
    ensure!(cause.contains("no ops.cgroup_set_bandwidth") && cause.contains(NODE), "{cause}");
    pods.delete("spinner", &Default::default()).await?;
    Ok(())
}
