//! `make demo`: a local control plane, the CRD, the controller with its reports server, two
//! demo Nodes with an agent each (on a fake sysfs root), and an example Scheduler; prints
//! `kubectl get schedulers` and the DaemonSet, then runs until Ctrl-C.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, bail};
use kube::{Api, ResourceExt};
use sked_controller::Scheduler;
use sked_tests::agents::{AgentProcess, AgentSpec, ReportsTls, bound_token};
use sked_tests::{
    TestCluster, cluster, create_ready_node, ensure_namespace, ensure_service_account, install_crds, wait_bound_pods,
    wait_for,
};

const NODES: [&str; 2] = ["demo-node-1", "demo-node-2"];

/// One line per step of the demo's start.
fn step(what: &str) {
    eprintln!("demo: {what}");
}

#[tokio::main]
async fn main() -> Result<()> {
    step("starting the control plane on 127.0.0.1 (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)");
    let cluster = tokio::task::spawn_blocking(TestCluster::start).await??;
    let client = cluster.client().await?;
    step("installing the Scheduler CRD and two demo Nodes");
    install_crds(&client).await?;
    ensure_namespace(&client, "sked-system").await?;
    ensure_service_account(&client, "sked-system", "sked-agent").await?;

    // Two Nodes stand in for machines (there is no kubelet in the demo).
    for name in NODES {
        create_ready_node(&client, name, &[("schedkit.io/pool", "batch")]).await?;
    }

    // The controller binary sits next to this one (same Cargo target directory).
    let controller_bin = match std::env::var("SKED_CONTROLLER_BIN") {
        Ok(path) => PathBuf::from(path),
        Err(_) => std::env::current_exe()?.with_file_name("sked-controller"),
    };
    if !controller_bin.exists() {
        bail!("{} not found: build it with `cargo build -p sked-controller`", controller_bin.display());
    }
    let tls = ReportsTls::generate(&cluster.dir)?;
    let reports_port = cluster::free_port()?;
    // The demo has no registry to verify signatures against; its trust policy lets the
    // example's repository run unsigned. The built-in default requires schedkit's signature.
    let policy = cluster.dir.join("demo-trust-policy.yaml");
    std::fs::write(&policy, "rules:\n  - repository: ghcr.io/schedkit/*\n    unsigned: allow\n")?;
    step("starting sked-controller with its reports server");
    let log = std::fs::File::create(cluster.dir.join("sked-controller.log"))?;
    let mut controller = Command::new(&controller_bin)
        .env("KUBECONFIG", &cluster.kubeconfig)
        .args(["--log-format=json", &format!("--reports-bind-address=127.0.0.1:{reports_port}")])
        .arg("--reports-cert-file")
        .arg(&tls.cert)
        .arg("--reports-key-file")
        .arg(&tls.key)
        .arg("--trust-policy")
        .arg(&policy)
        .stdout(log.try_clone()?)
        .stderr(log)
        .stdin(Stdio::null())
        .spawn()
        .context("starting sked-controller")?;

    step("applying examples/scx-rusty.yaml");
    let example = cluster::workspace_root().join("examples/scx-rusty.yaml");
    let out = cluster.kubectl(&["apply", "-f", &example.to_string_lossy()])?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    if !out.status.success() {
        bail!("kubectl apply failed: {}", String::from_utf8_lossy(&out.stderr));
    }

    // An agent per node, with a token bound to that node's scheduler pod. The fake kernel of
    // demo-node-1 runs scx_rusty; demo-node-2's has no scheduler attached.
    step("starting an agent per node on a fake sched_ext sysfs");
    let pods = wait_bound_pods(&client, "sked-system", "scx-rusty", NODES.len()).await?;
    let mut agents = Vec::new();
    for node in NODES {
        let pod = &pods[node];
        let token = bound_token(&client, "sked-system", "sked-agent", Some(pod)).await?;
        let agent = AgentProcess::start(&AgentSpec {
            dir: &cluster.dir,
            node,
            pod: &pod.name_any(),
            scheduler: "scx-rusty",
            expected_ops: Some("rusty"),
            controller: &format!("https://localhost:{reports_port}"),
            ca: &tls.ca,
            server_name: None,
            token: &token,
        })?;
        agents.push(agent);
    }
    agents[0].set_kernel("enabled", Some("rusty_1.0.0_x86_64_unknown_linux_gnu"), 1)?;

    let schedulers: Api<Scheduler> = Api::all(client.clone());
    wait_for("the example Scheduler's status", || {
        let schedulers = schedulers.clone();
        async move {
            Ok(schedulers.get_opt("scx-rusty").await?.filter(|s| {
                s.status.as_ref().is_some_and(|st| st.desired_number_scheduled == 2 && st.kernel_attached == 1)
            }))
        }
    })
    .await?;

    for args in [
        vec!["get", "schedulers"],
        vec!["get", "daemonset", "-n", "sked-system", "-o", "wide"],
        vec![
            "get",
            "scheduler",
            "scx-rusty",
            "-o",
            "jsonpath={range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{\"\\n\"}{end}",
        ],
    ] {
        println!("\n$ kubectl {}", args.join(" "));
        let out = cluster.kubectl(&args)?;
        print!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
    let second = agents[1].sysfs.join("kernel/sched_ext");
    println!(
        "\nThe demo cluster is running. In another shell:\n  export KUBECONFIG={}\n  export PATH={}:$PATH\n  kubectl get schedulers\n\
         Attach the scheduler on demo-node-2's fake kernel and watch KERNEL-ATTACHED reach 2/2:\n  \
         mkdir -p {second}/root && echo rusty_1.0.0 > {second}/root/ops && echo enabled > {second}/state\n\
         Agent metrics: curl http://{}/metrics\nController log: {}\nPress Ctrl-C to stop and clean up.",
        cluster.kubeconfig.display(),
        cluster::tools_dir().display(),
        agents[1].http,
        cluster.dir.join("sked-controller.log").display(),
        second = second.display(),
    );
    tokio::signal::ctrl_c().await?;
    drop(agents);
    let _ = controller.kill();
    let _ = controller.wait();
    drop(cluster);
    Ok(())
}
