//! `make demo`: a local control plane, the CRD, the controller, two demo Nodes and an example
//! Scheduler; prints `kubectl get schedulers` and the DaemonSet, then runs until Ctrl-C.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use kube::Api;
use sked_controller::Scheduler;
use sked_tests::{
    TestCluster, cluster, create_ready_node, ensure_namespace, ensure_service_account, install_crds, wait_for,
};

#[tokio::main]
async fn main() -> Result<()> {
    let cluster = tokio::task::spawn_blocking(TestCluster::start).await??;
    let client = cluster.client().await?;
    install_crds(&client).await?;
    ensure_namespace(&client, "sked-system").await?;
    ensure_service_account(&client, "sked-system", "sked-agent").await?;

    // Two Nodes stand in for machines (there is no kubelet in the demo).
    for name in ["demo-node-1", "demo-node-2"] {
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
    let log = std::fs::File::create(cluster.dir.join("sked-controller.log"))?;
    let mut controller = Command::new(&controller_bin)
        .env("KUBECONFIG", &cluster.kubeconfig)
        .args(["--log-format=json"])
        .stdout(log.try_clone()?)
        .stderr(log)
        .stdin(Stdio::null())
        .spawn()
        .context("starting sked-controller")?;

    let example = cluster::workspace_root().join("examples/scx-rusty.yaml");
    let out = cluster.kubectl(&["apply", "-f", &example.to_string_lossy()])?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    if !out.status.success() {
        bail!("kubectl apply failed: {}", String::from_utf8_lossy(&out.stderr));
    }

    let schedulers: Api<Scheduler> = Api::all(client.clone());
    wait_for("the example Scheduler's status", || {
        let schedulers = schedulers.clone();
        async move {
            Ok(schedulers
                .get_opt("scx-rusty")
                .await?
                .filter(|s| s.status.as_ref().is_some_and(|st| st.desired_number_scheduled == 2)))
        }
    })
    .await?;

    for args in [vec!["get", "schedulers"], vec!["get", "daemonset", "-n", "sked-system", "-o", "wide"]] {
        println!("\n$ kubectl {}", args.join(" "));
        let out = cluster.kubectl(&args)?;
        print!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
    println!(
        "\nThe demo cluster is running. In another shell:\n  export KUBECONFIG={}\n  export PATH={}:$PATH\n  kubectl get schedulers\n\
         Controller log: {}\nPress Ctrl-C to stop and clean up.",
        cluster.kubeconfig.display(),
        cluster::tools_dir().display(),
        cluster.dir.join("sked-controller.log").display()
    );
    tokio::signal::ctrl_c().await?;
    let _ = controller.kill();
    let _ = controller.wait();
    drop(cluster);
    tokio::time::sleep(Duration::from_millis(10)).await;
    Ok(())
}
