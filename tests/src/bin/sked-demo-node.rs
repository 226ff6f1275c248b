//! `make demo-node`: sked on a real node to try by hand. A local control plane, the sched_ext
//! kernel under qemu as a Kubernetes node (containerd and a kubelet), the agent and a scheduler
//! as images in a registry on 127.0.0.1, the chart installed with `helm install`, and an
//! example Scheduler attached in the node's kernel; prints what to run, then runs until Ctrl-C.
//!
//! `SCHED=bpfland` runs the upstream scx_bpfland (built from crates.io) instead of the canary
//! scheduler, and shows its own statistics as the agent relays them.

use std::time::Duration;

use anyhow::{Context as _, Result};
use sked_tests::node::NodeInstall;
use sked_tests::{TestCluster, condition, wait_for_within};

const NS: &str = "sked-system";

fn step(what: &str) {
    eprintln!("demo-node: {what}");
}

#[tokio::main]
async fn main() -> Result<()> {
    step("starting the control plane on 127.0.0.1 (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)");
    let cluster: &'static TestCluster = Box::leak(Box::new(tokio::task::spawn_blocking(TestCluster::start).await??));
    let client = cluster.client().await?;
    step("building the node (kernel, containerd, kubelet) and the images, installing the chart, booting the node");
    step("under emulation this takes a few minutes; the first run also downloads and builds what it needs");
    let mut install = NodeInstall::start(cluster, &client, &cluster.dir.join("node"), NS, "sked-node").await?;
    for (what, took) in &install.timings {
        step(&format!("{what}: {took:.1?}"));
    }

    let upstream = match std::env::var("SCHED").unwrap_or_default().as_str() {
        "" | "canary" => false,
        "bpfland" | "scx_bpfland" => true,
        other => anyhow::bail!("SCHED={other}: the node runs SCHED=canary (the default) or SCHED=bpfland"),
    };
    let name = if upstream { "bpfland" } else { "canary" };
    let manifest = cluster.dir.join(format!("{name}.yaml"));
    let yaml = if upstream { install.bpfland_manifest(name, &[]) } else { install.scheduler_manifest(name) };
    std::fs::write(&manifest, yaml)?;
    step(&format!("kubectl apply -f {}", manifest.display()));
    let out = cluster.kubectl(&["apply", "-f", &manifest.to_string_lossy()])?;
    anyhow::ensure!(out.status.success(), "kubectl apply: {}", String::from_utf8_lossy(&out.stderr));
    let schedulers: kube::Api<sked_controller::Scheduler> = kube::Api::all(client.clone());
    let what = format!("{name} attached in the node's kernel");
    let waited = wait_for_within(&what, Duration::from_secs(300), || async {
        let s = schedulers.get_opt(name).await?;
        Ok(s.filter(|s| condition(s, "KernelAttached").is_some_and(|c| c.status == "True")))
    })
    .await;
    if let Err(e) = waited {
        eprintln!("{}", install.node.diagnostics().await);
        return Err(e);
    }
    let out = cluster.kubectl(&["get", "schedulers"])?;
    println!("{}", String::from_utf8_lossy(&out.stdout));
    let ops = install.node.vm.run("cat /sys/kernel/sched_ext/root/ops").await.context("reading the node's kernel")?;
    println!("the node's kernel runs: {}", ops.trim());
    let stats = if upstream {
        show_statistics(&client, &mut install, name).await?;
        format!(
            "\n  kubectl sked stats {node}    # its statistics, in a cluster whose API server reaches the pod network",
            node = install.node.name
        )
    } else {
        String::new()
    };
    println!(
        "\nTry it (in another terminal):\n  export KUBECONFIG={kubeconfig}\n  kubectl get schedulers\n  \
         kubectl get pods -n {NS} -o wide\n  kubectl describe scheduler {name}{stats}\n  kubectl delete scheduler {name}\n\n\
         The node's console: {console}\nPress Ctrl-C to stop everything.",
        kubeconfig = cluster.kubeconfig.display(),
        console = install.node.vm.dir.join("console.log").display(),
    );
    tokio::signal::ctrl_c().await?;
    step("stopping");
    install.node.vm.shutdown().await
}

/// Prints scx_bpfland's own statistics as the node's agent relays them (its /metrics, read in
/// the VM: the API server's pod proxy, which `kubectl sked stats` uses, cannot reach the VM's
/// pod network from this machine).
async fn show_statistics(client: &kube::Client, install: &mut NodeInstall, name: &str) -> Result<()> {
    use kube::ResourceExt as _;
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(client.clone(), NS);
    let list = pods.list(&kube::api::ListParams::default().labels(&format!("name={name}"))).await?;
    let pod = list.items.into_iter().find(|p| p.metadata.deletion_timestamp.is_none()).context("the scheduler pod")?;
    let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone()).context("the scheduler pod's IP")?;
    let scrape = format!("wget -qO- http://{ip}:{}/metrics", sked_proto::contract::AGENT_PORT);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let relayed = loop {
        let last = match install.node.vm.run(&scrape).await {
            Ok(text) => {
                let lines: Vec<String> = text.lines().filter(|l| l.starts_with("scx_")).map(str::to_owned).collect();
                if lines.len() >= 3 {
                    break lines;
                }
                format!("{} scx_ series", lines.len())
            }
            Err(e) => format!("{e:#}"),
        };
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "scx_bpfland's statistics not relayed by the agent within 60 s (last scrape: {last})"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    println!("scx_bpfland's own statistics, relayed by the agent of pod {} (its /metrics):", pod.name_any());
    for line in relayed {
        println!("  {line}");
    }
    Ok(())
}
