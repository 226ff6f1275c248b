//! `make demo-node`: sked on a real node to try by hand. A local control plane, the sched_ext
//! kernel under qemu as a Kubernetes node (containerd and a kubelet), the agent and a scheduler
//! as images in a registry on 127.0.0.1, the chart installed with `helm install`, and an
//! example Scheduler attached in the node's kernel; prints what to run, then runs until Ctrl-C.

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

    let manifest = cluster.dir.join("canary.yaml");
    std::fs::write(&manifest, install.scheduler_manifest("canary"))?;
    step(&format!("kubectl apply -f {}", manifest.display()));
    let out = cluster.kubectl(&["apply", "-f", &manifest.to_string_lossy()])?;
    anyhow::ensure!(out.status.success(), "kubectl apply: {}", String::from_utf8_lossy(&out.stderr));
    let schedulers: kube::Api<sked_controller::Scheduler> = kube::Api::all(client.clone());
    let waited = wait_for_within("the canary attached in the node's kernel", Duration::from_secs(300), || async {
        let s = schedulers.get_opt("canary").await?;
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
    println!(
        "\nTry it (in another terminal):\n  export KUBECONFIG={kubeconfig}\n  kubectl get schedulers\n  \
         kubectl get pods -n {NS} -o wide\n  kubectl describe scheduler canary\n  kubectl delete scheduler canary\n\n\
         The node's console: {console}\nPress Ctrl-C to stop everything.",
        kubeconfig = cluster.kubeconfig.display(),
        console = install.node.vm.dir.join("console.log").display(),
    );
    tokio::signal::ctrl_c().await?;
    step("stopping");
    install.node.vm.shutdown().await
}
