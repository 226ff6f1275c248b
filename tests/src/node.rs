//! A real Kubernetes node: the sched_ext kernel under qemu with containerd, runc and a kubelet
//! built from the pinned Kubernetes release (`hack/kernel-e2e.sh node`), joined to the test
//! control plane. The VM has no network device: the kubelet reaches the API server and
//! containerd the image registry through virtio console relays ([`crate::vmlink`]) listening in
//! the VM on the addresses the host uses; the agents reach the controller's reports server
//! through one listening on the reports Service's port at the pods' gateway.
//!
//! Inside the VM the pods get addresses in 10.88.0.0/24 (CNI ptp), the node side of each pod's
//! link is 10.88.0.1, and a name server there ([`crate::vmdns`]) answers the Service names the
//! pods dial with that address, where the reports relay listens: a stand-in for cluster DNS
//! and a Service's virtual IP, the only parts of a cluster the test does not run for real.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};

use crate::cluster::{TestCluster, tools_dir, workspace_root};
use crate::command::run_command as run;
use crate::fixture::wait_for_within;
use crate::vm::TestVm;

/// Where the node side of every pod's link is (CNI ptp's gateway): the pods' name server and
/// the relay to the controller's reports server listen here.
pub const POD_GATEWAY: &str = "10.88.0.1";
/// The node's own address (on a dummy device; nothing leaves the VM).
pub const NODE_IP: &str = "10.87.0.1";

/// The sched_ext kernel, its BPF objects and the node's initramfs, in one directory.
pub struct NodeArtifacts {
    pub dir: PathBuf,
}

impl NodeArtifacts {
    /// Builds them (kernels and packages come from the per-user cache after the first time).
    pub fn build(dir: &Path) -> Result<Self> {
        let script = workspace_root().join("hack/kernel-e2e.sh");
        run(Command::new("bash").arg(&script).arg("prepare").arg(dir))?;
        let relay = crate::agents::workspace_binary("sked-vm-relay", "SKED_VM_RELAY_BIN")?;
        run(Command::new("bash").arg(&script).arg("node").arg(dir).arg(tools_dir().join("kubelet")).arg(relay))?;
        Ok(Self { dir: dir.to_path_buf() })
    }

    pub fn kernel(&self) -> PathBuf {
        self.dir.join("vmlinuz-sched-ext")
    }

    pub fn initramfs(&self) -> PathBuf {
        self.dir.join("node.cpio")
    }

    /// The canary scheduler's BPF object.
    pub fn canary_object(&self) -> PathBuf {
        self.dir.join("sked_canary.bpf.o")
    }
}

/// Images pushed by `hack/images.sh`: `registry/repository@digest` each.
pub struct NodeImages {
    pub agent: String,
    pub canary: String,
    pub pause: String,
    /// scx_bpfland 1.1.4, built from crates.io (`hack/scx-scheduler.sh`).
    pub bpfland: String,
    /// (name, compressed size in bytes) of each image.
    pub sizes: Vec<(String, u64)>,
}

/// The version of the upstream scheduler the node runs (`hack/scx-scheduler.sh`'s default).
pub const BPFLAND_VERSION: &str = "1.1.4";

impl NodeImages {
    /// Builds the agent, canary, pause and scx_bpfland images and pushes them to `registry`
    /// (host:port). The agent is the workspace's build (`SKED_NODE_AGENT_BIN` may name another),
    /// the scheduler the binary `SKED_SCX_BPFLAND_BIN` names (`make test-node` builds it with
    /// hack/scx-scheduler.sh), or one built here the same way.
    pub fn push(registry: &str, artifacts: &NodeArtifacts) -> Result<Self> {
        let agent = crate::agents::workspace_binary("sked-agent", "SKED_NODE_AGENT_BIN")?;
        let bpfland = match std::env::var("SKED_SCX_BPFLAND_BIN") {
            Ok(path) if !path.is_empty() => PathBuf::from(path),
            _ => {
                let script = workspace_root().join("hack/scx-scheduler.sh");
                PathBuf::from(run(Command::new("bash").arg(&script).arg("scx_bpfland"))?.trim())
            }
        };
        let loader = crate::agents::workspace_binary("sked-canary-loader", "SKED_CANARY_LOADER_BIN")?;
        let out = run(Command::new("bash")
            .arg(workspace_root().join("hack/images.sh"))
            .arg(registry)
            .arg(&agent)
            .arg(&loader)
            .arg(artifacts.canary_object())
            .arg(tools_dir().join("pause"))
            .arg(&bpfland)
            .env("SCX_VERSION", BPFLAND_VERSION)
            .env("SKED_TOOLS_BIN", tools_dir()))?;
        let mut found: std::collections::BTreeMap<&str, String> = Default::default();
        let mut sizes = Vec::new();
        for line in out.lines() {
            let mut fields = line.split_whitespace();
            let (Some(name), Some(reference), Some(size)) = (fields.next(), fields.next(), fields.next()) else {
                continue;
            };
            sizes.push((name.to_owned(), size.parse().unwrap_or(0)));
            if let Some(known) = ["agent", "canary", "pause", "scx"].into_iter().find(|k| *k == name) {
                found.insert(known, reference.to_owned());
            }
        }
        let mut take = |name: &str| found.remove(name);
        match (take("agent"), take("canary"), take("pause"), take("scx")) {
            (Some(agent), Some(canary), Some(pause), Some(bpfland)) => {
                Ok(Self { agent, canary, pause, bpfland, sizes })
            }
            _ => bail!("hack/images.sh did not print the four images:\n{out}"),
        }
    }
}

/// What a node is joined with.
pub struct NodeConfig<'a> {
    pub name: &'a str,
    pub labels: &'a [(&'a str, &'a str)],
    /// The image registry, `127.0.0.1:<port>` on the host and in the VM alike.
    pub registry: &'a str,
    /// The pod sandbox image (`registry/repository@digest`).
    pub pause_image: &'a str,
    /// The controller's reports server on the host.
    pub reports: SocketAddr,
    /// The port its Service names; pods dial it at [`POD_GATEWAY`].
    pub reports_port: u16,
    /// Names the pods' name server answers with [`POD_GATEWAY`] (the reports Service's).
    pub service_names: &'a [String],
}

/// A running node VM whose kubelet has joined the cluster.
pub struct TestNode {
    pub vm: TestVm,
    pub name: String,
}

impl TestNode {
    /// Boots the node, starts containerd and the kubelet, and returns once the Node is Ready
    /// (lifting the `node.kubernetes.io/not-ready` taint as the node lifecycle controller,
    /// which the test control plane does not run, would).
    pub async fn start(
        cluster: &TestCluster,
        client: &Client,
        artifacts: &NodeArtifacts,
        dir: &Path,
        config: &NodeConfig<'_>,
    ) -> Result<Self> {
        let api: SocketAddr =
            cluster.server.trim_start_matches("https://").parse().context("the API server address")?;
        let registry: SocketAddr = config.registry.parse().context("the registry address")?;
        let forwards = [("api", api), ("registry", registry), ("reports", config.reports)];
        let vm = TestVm::boot_with(&artifacts.kernel(), &artifacts.initramfs(), dir, 3072, &forwards).await?;
        let mut node = Self { vm, name: config.name.to_owned() };
        if let Err(e) = node.join(cluster, client, config, api, registry).await {
            bail!("{e:#}\n{}", node.diagnostics().await);
        }
        Ok(node)
    }

    async fn join(
        &mut self,
        cluster: &TestCluster,
        client: &Client,
        config: &NodeConfig<'_>,
        api: SocketAddr,
        registry: SocketAddr,
    ) -> Result<()> {
        let vm = &mut self.vm;
        // The relays, each on the address its host side has (the reports one on every address
        // of the VM, so pods reach it through their gateway).
        let reports_listen = format!("0.0.0.0:{}", config.reports_port);
        for (name, listen) in
            [("api", api.to_string()), ("registry", registry.to_string()), ("reports", reports_listen)]
        {
            vm.run(&format!(
                "dev=; for p in /sys/class/virtio-ports/*; do [ \"$(cat $p/name)\" = sked.{name} ] && dev=/dev/${{p##*/}}; done; \
                 [ -n \"$dev\" ] || {{ echo 'no console port sked.{name}'; exit 1; }}; \
                 sked-vm-relay $dev {listen} >> /run/relay-{name}.log 2>&1 &"
            ))
            .await?;
        }
        let names: Vec<String> = config.service_names.iter().map(|n| format!("{n}={POD_GATEWAY}")).collect();
        vm.run(&format!("sked-vm-relay dns 0.0.0.0:53 {} >> /run/dns.log 2>&1 &", names.join(" "))).await?;
        // Every relay (TCP) and the name server (UDP) listening before anything dials them.
        let ports = [api.port(), registry.port(), config.reports_port];
        let check = ports.iter().map(|p| format!("netstat -ltn | grep -q ':{p} '")).collect::<Vec<_>>().join(" && ");
        let check = format!("{check} && netstat -lun | grep -q ':53 '");
        vm.wait_until("the console relays and the name server listening", &check, Duration::from_secs(60)).await?;

        // containerd: overlayfs snapshots, pulls over plain HTTP from the test registry, the
        // sandbox image from it.
        let containerd = format!(
            "version = 2\nroot = \"/var/lib/containerd\"\nstate = \"/run/containerd\"\n\
             [plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"{pause}\"\n\
             [plugins.\"io.containerd.grpc.v1.cri\".cni]\n  bin_dir = \"/usr/lib/cni\"\n  conf_dir = \"/etc/cni/net.d\"\n\
             [plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"/etc/containerd/certs.d\"\n",
            pause = config.pause_image,
        );
        vm.write_file("/etc/containerd/config.toml", containerd.as_bytes()).await?;
        let hosts = format!(
            "server = \"http://{r}\"\n[host.\"http://{r}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
            r = config.registry
        );
        vm.write_file(&format!("/etc/containerd/certs.d/{}/hosts.toml", config.registry), hosts.as_bytes()).await?;
        vm.run("containerd --config /etc/containerd/config.toml >> /run/containerd.log 2>&1 &").await?;
        vm.wait_until("containerd's socket", "test -S /run/containerd/containerd.sock", Duration::from_secs(120))
            .await?;

        // The kubelet: a client certificate for system:node:<name> (the Node authorizer and
        // NodeRestriction apply), cgroupfs on the cgroup v2 hierarchy, cluster DNS at the
        // pods' gateway.
        let credentials = cluster.node_credentials(config.name)?;
        vm.write_file("/etc/kubernetes/ca.crt", std::fs::read(cluster.dir.join("ca.crt"))?.as_slice()).await?;
        vm.write_file("/etc/kubernetes/kubelet.crt", credentials.cert_pem.as_bytes()).await?;
        vm.write_file("/etc/kubernetes/kubelet.key", credentials.key_pem.as_bytes()).await?;
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\n    certificate-authority: /etc/kubernetes/ca.crt\n\
             users:\n- name: kubelet\n  user:\n    client-certificate: /etc/kubernetes/kubelet.crt\n    client-key: /etc/kubernetes/kubelet.key\n\
             contexts:\n- name: test\n  context:\n    cluster: test\n    user: kubelet\ncurrent-context: test\n",
            server = cluster.server
        );
        vm.write_file("/etc/kubernetes/kubeconfig", kubeconfig.as_bytes()).await?;
        let kubelet = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             cgroupDriver: cgroupfs\nfailSwapOn: false\n\
             containerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n\
             authentication:\n  anonymous:\n    enabled: false\n  webhook:\n    enabled: false\n\
             authorization:\n  mode: AlwaysAllow\n\
             clusterDNS: [\"{POD_GATEWAY}\"]\nclusterDomain: cluster.local\nresolvConf: /etc/resolv.conf\n\
             readOnlyPort: 0\nserializeImagePulls: false\n\
             evictionHard:\n  memory.available: 1Mi\n  nodefs.available: 1%\n  imagefs.available: 1%\n  nodefs.inodesFree: 1%\n\
             imageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\n\
             localStorageCapacityIsolation: false\n"
        );
        vm.write_file("/etc/kubernetes/kubelet.yaml", kubelet.as_bytes()).await?;
        let labels: Vec<String> = config.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        vm.run(&format!(
            "kubelet --config=/etc/kubernetes/kubelet.yaml --kubeconfig=/etc/kubernetes/kubeconfig \
             --hostname-override={name} --node-ip={NODE_IP} --node-labels={labels} --v=1 >> /run/kubelet.log 2>&1 &",
            name = config.name,
            labels = labels.join(","),
        ))
        .await?;

        let nodes: Api<Node> = Api::all(client.clone());
        wait_for_within("the node's kubelet to register and report Ready", Duration::from_secs(300), || async {
            let Some(node) = nodes.get_opt(config.name).await? else { return Ok(None) };
            let ready = node
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            Ok(ready.then_some(()))
        })
        .await?;
        crate::kubelet::lift_not_ready_taint(client, config.name).await?;
        Ok(())
    }

    /// The tails of the node's logs (kubelet, containerd, relays, name server), its kernel log
    /// and console: what to read when something on the node went wrong.
    pub async fn diagnostics(&mut self) -> String {
        let logs = self
            .vm
            .run(
                "for f in /run/kubelet.log /run/containerd.log /run/relay-api.log /run/relay-registry.log \
                 /run/relay-reports.log /run/dns.log; do echo \"== $f\"; tail -n 30 $f 2>/dev/null; done; \
                 echo '== pod logs'; for f in $(find /var/log/pods -name '*.log' 2>/dev/null); do echo \"-- $f\"; tail -n 20 $f; done; \
                 echo '== dmesg'; dmesg | tail -n 30",
            )
            .await
            .unwrap_or_else(|e| format!("cannot read the node's logs: {e:#}"));
        format!("on the node:\n{logs}\n== console\n{}", self.vm.console_tail(40))
    }
}

/// The port of the chart's reports Service (`reports.port`, 8443 unless changed): the pods dial
/// it at [`POD_GATEWAY`].
const REPORTS_SERVICE_PORT: u16 = 8443;

/// Label selecting the chart's controller pods.
const CONTROLLER_PODS: &str = "app.kubernetes.io/name=sked,control-plane=controller-manager";

/// sked installed for a real node, as `make test-node` and `make demo-node` run it: images built
/// and pushed to a registry on 127.0.0.1 (the scheduler's signed with a cosign key the trust
/// policy names), cert-manager, `helm install ./charts/sked` with the values this node needs
/// (its controller pod run as a process on a stand-in control-plane Node), and the node VM
/// joined and Ready.
pub struct NodeInstall {
    pub registry: crate::registry::TestRegistry,
    pub images: NodeImages,
    /// The signed canary scheduler by tag, as a user names it in a Scheduler.
    pub canary_tag: String,
    /// The signed scx_bpfland image by tag.
    pub bpfland_tag: String,
    pub controller: crate::controller_pods::ControllerPods,
    pub node: TestNode,
    /// How long each step took.
    pub timings: Vec<(&'static str, Duration)>,
    _cosign: crate::registry::Cosign,
}

impl NodeInstall {
    pub async fn start(
        cluster: &'static TestCluster,
        client: &Client,
        dir: &Path,
        namespace: &str,
        node_name: &str,
    ) -> Result<Self> {
        let mut timings = Vec::new();
        let mut step = std::time::Instant::now();
        let mut lap = |what: &'static str, timings: &mut Vec<(&'static str, Duration)>| {
            timings.push((what, step.elapsed()));
            step = std::time::Instant::now();
        };
        let artifacts = {
            let dir = dir.join("artifacts");
            tokio::task::spawn_blocking(move || NodeArtifacts::build(&dir)).await??
        };
        lap("kernel and node initramfs", &mut timings);

        let registry = crate::registry::TestRegistry::start()?;
        let images = {
            let (host, dir) = (registry.host.clone(), artifacts.dir.clone());
            tokio::task::spawn_blocking(move || NodeImages::push(&host, &NodeArtifacts { dir })).await??
        };
        let cosign = crate::registry::Cosign::new()?;
        let key = cosign.generate_key_pair("sked-node")?;
        let canary_tag = format!("{}/sked/canary:v1", registry.host);
        cosign.sign_with_key(&canary_tag, &key.key)?;
        let bpfland_tag = format!("{}/sked/scx-bpfland:{BPFLAND_VERSION}", registry.host);
        cosign.sign_with_key(&bpfland_tag, &key.key)?;
        lap("images built, pushed and signed", &mut timings);

        cluster.start_cert_manager()?;
        crate::kubelet::create_ready_node(client, "control-1", &[("sked-test-role", "control")]).await?;
        let values = format!(
            "controller:\n  replicas: 1\n  nodeSelector:\n    sked-test-role: control\n\
             agent:\n  image:\n    repository: {registry}/sked/sked-agent\n    tag: dev\n\
             trust:\n  insecureRegistries: [\"{registry}\"]\n  policy: |\n    rules:\n      - repository: {registry}/sked/**\n        publicKey: |\n{key}",
            registry = registry.host,
            key = key.public_pem.lines().map(|l| format!("          {l}\n")).collect::<String>(),
        );
        let values_file = dir.join("values.yaml");
        std::fs::write(&values_file, values)?;
        let controller = crate::controller_pods::ControllerPods::run(
            cluster,
            client.clone(),
            namespace,
            CONTROLLER_PODS,
            &[("sked-webhook", "webhook")],
        );
        let chart = workspace_root().join("charts/sked").to_string_lossy().into_owned();
        let install = {
            let (values, namespace) = (values_file.to_string_lossy().into_owned(), namespace.to_owned());
            tokio::task::spawn_blocking(move || cluster.helm_install(&chart, &namespace, &["-f", &values]))
        };
        let out = install.await??;
        if !out.status.success() {
            bail!(
                "helm install: {}{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                controller.logs()
            );
        }
        let reports_port = crate::fixture::wait_for("the controller's reports server", || async {
            Ok(controller.ports("reports").first().copied())
        })
        .await?;
        lap("cert-manager and helm install --wait", &mut timings);

        // The leader's Service, and the headless Service of every replica (the one controller here).
        let service_names = [
            format!("sked-reports.{namespace}.svc"),
            format!("sked-reports.{namespace}.svc.cluster.local"),
            format!("sked-reports-replicas.{namespace}.svc"),
        ];
        let node = TestNode::start(
            cluster,
            client,
            &artifacts,
            &dir.join("vm"),
            &NodeConfig {
                name: node_name,
                labels: &[("pool", "vm")],
                registry: &registry.host,
                pause_image: &images.pause,
                reports: ([127, 0, 0, 1], reports_port).into(),
                reports_port: REPORTS_SERVICE_PORT,
                service_names: &service_names,
            },
        )
        .await?;
        lap("VM boot -> Node Ready", &mut timings);
        Ok(Self { registry, images, canary_tag, bpfland_tag, controller, node, timings, _cosign: cosign })
    }

    /// A Scheduler `name` for the signed canary on this node (`pool: vm`), as YAML.
    pub fn scheduler_manifest(&self, name: &str) -> String {
        self.manifest(name, &self.canary_tag, "sked_canary", &[])
    }

    /// A Scheduler `name` for the signed scx_bpfland on this node, with `args`, as YAML.
    pub fn bpfland_manifest(&self, name: &str, args: &[&str]) -> String {
        self.manifest(name, &self.bpfland_tag, "bpfland", args)
    }

    /// A Scheduler `name` running `sched` (expected ops `ops`, a prefix) on this node, rolled out
    /// with a short bake (the node is the canary).
    fn manifest(&self, name: &str, sched: &str, ops: &str, args: &[&str]) -> String {
        let args: String = args.iter().map(|a| format!("\n    - \"{a}\"")).collect();
        let args = if args.is_empty() { String::new() } else { format!("\n  args:{args}") };
        format!(
            "apiVersion: sked.schedkit.io/v1\nkind: Scheduler\nmetadata:\n  name: {name}\nspec:\n  sched: {sched}\n  \
             expectedOps: {ops}{args}\n  nodeSelector:\n    pool: vm\n  rollout:\n    bakeSeconds: 10\n    \
             attachTimeoutSeconds: 240\n"
        )
    }
}
