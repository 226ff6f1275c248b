//! Nodes without a kubelet or a sched_ext kernel, played honestly: the rollout suite and
//! `make demo` share this one stand-in. For every pod a Scheduler's DaemonSet places on such a
//! node it starts that pod's own `sked-agent` (a token bound to the pod, the scheduler and
//! expected ops its agent container is given) on a fake sched_ext sysfs tree. The fake kernel
//! then attaches the pod's scheduler a moment after the pod starts, under the ops name its image
//! registers, or never attaches it, or runs another scheduler, or attaches it and ejects it with
//! the kernel's own words, as the play says. A pod is marked Ready exactly when its agent's
//! /readyz says so. Pod deletions are finished by [`crate::finish_pod_deletions`], as a kubelet
//! would.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use sked_controller::Scheduler;
use sked_controller::api::labels::OWNER_LABEL;
use sked_proto::contract::env;

use crate::agents::{AgentProcess, AgentSpec, CpuTime, ReportsEndpoint, bound_token};

/// What a node's kernel does with a pod's scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// It attaches.
    Attaches,
    /// It never attaches.
    Refuses,
    /// Another scheduler (started by hand) owns the kernel.
    Foreign,
    /// It attaches, then the kernel ejects it for a runnable task stall, as its log says.
    AttachesThenEjected,
    /// It attaches and stays attached, and the node's tasks strand while it runs: they queue on
    /// a busy CPU beside an idle one, four times as many waiting and the CPUs less used (the
    /// stand-in kernel's accounting, see [`SLOW`]).
    AttachesSlow,
    /// It attaches and stays attached, and keeps no pod's CPU limit: the node's limited pod
    /// (see [`FakeNodes::limited_pods`]) runs at [`UNLIMITED_CPUS`] against its half a CPU, as
    /// under a scheduler without `ops.cgroup_set_bandwidth` (measured: 1.38 under scx_bpfland).
    AttachesIgnoringLimits,
}

/// What the limited pod's two spinning threads use when nothing keeps its limit.
pub const UNLIMITED_CPUS: f64 = 1.38;
/// What they use when the limit is kept: a little under it, throttled every period.
const LIMITED_CPUS: f64 = 0.49;
/// The limited pod's `cpu.max` (half a CPU at the kubelet's 100 ms period) and `cpu.weight`
/// (a 500m request: shares 512, weight 20).
const LIMITED_CPU_MAX: &str = "50000 100000";
const LIMITED_CPU_WEIGHT: &str = "20";

/// The stand-in kernel's scheduling accounting of one node: the counters its agent samples
/// (/proc/schedstat, /proc/pressure/cpu), moved on as time passes.
struct Accounting {
    at: Instant,
    cpus: [CpuTime; 2],
    pressure_us: u64,
    /// Where its agent reads them, and whether its scheduler slows the node, as last seen.
    proc_root: PathBuf,
    slow: bool,
    /// The node's limited pod (its UID), when it has one, and its counters.
    limited: Option<LimitedPod>,
    limits_ignored: bool,
}

/// A pod that wants two CPUs and is limited to half of one: its cgroup's counters.
struct LimitedPod {
    uid: String,
    usage_us: u64,
    periods: u64,
    throttled: u64,
    throttled_us: u64,
    pressure_us: u64,
}

impl LimitedPod {
    fn new(uid: &str) -> Self {
        Self { uid: uid.to_owned(), usage_us: 0, periods: 0, throttled: 0, throttled_us: 0, pressure_us: 0 }
    }

    /// Moves its counters on by `seconds`, its limit kept or not.
    fn advance(&mut self, seconds: f64, kept: bool) {
        let used = if kept { LIMITED_CPUS } else { UNLIMITED_CPUS };
        self.usage_us += (seconds * used * 1e6) as u64;
        let periods = (seconds * 10.0) as u64;
        self.periods += periods;
        if kept {
            // Throttled every period, for the rest of it.
            self.throttled += periods;
            self.throttled_us += (seconds * 0.5 * 1e6) as u64;
        }
        // One of its two threads always waits.
        self.pressure_us += (seconds * 1e6) as u64;
    }

    /// Writes its cgroup as the systemd driver names it, under `cgroup_root`.
    fn write(&self, cgroup_root: &Path) -> Result<()> {
        let dir = cgroup_root
            .join("kubepods.slice/kubepods-burstable.slice")
            .join(format!("kubepods-burstable-pod{}.slice", self.uid.replace('-', "_")));
        std::fs::create_dir_all(&dir)?;
        let put = |name: &str, body: String| -> Result<()> {
            let tmp = dir.join(format!("{name}.tmp"));
            std::fs::write(&tmp, body)?;
            std::fs::rename(&tmp, dir.join(name))?;
            Ok(())
        };
        put("cpu.max", format!("{LIMITED_CPU_MAX}\n"))?;
        put("cpu.weight", format!("{LIMITED_CPU_WEIGHT}\n"))?;
        put(
            "cpu.stat",
            format!(
                "usage_usec {}\nuser_usec {}\nsystem_usec 0\nnr_periods {}\nnr_throttled {}\nthrottled_usec {}\nnr_bursts 0\nburst_usec 0\n",
                self.usage_us, self.usage_us, self.periods, self.throttled, self.throttled_us
            ),
        )?;
        put(
            "cpu.pressure",
            format!(
                "some avg10=0.00 avg60=0.00 avg300=0.00 total={}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
                self.pressure_us
            ),
        )
    }
}

/// How often every node's accounting moves on, whatever the harness is doing: a real kernel's
/// counters move all the time, and an agent sampling every second must not see them stand
/// still between two moves of a busy harness (its signals would swing with the harness's pace).
const ACCOUNTING_TICK: Duration = Duration::from_millis(100);

/// The accounting of every node of a [`FakeNodes`], moved on every [`ACCOUNTING_TICK`] by a
/// thread of its own that ends once the `FakeNodes` is dropped.
type Accounts = std::sync::Arc<std::sync::Mutex<BTreeMap<String, Accounting>>>;

fn keep_accounting(accounts: &Accounts) {
    let weak = std::sync::Arc::downgrade(accounts);
    std::thread::spawn(move || {
        while let Some(accounts) = weak.upgrade() {
            if let Ok(mut accounts) = accounts.lock() {
                for a in accounts.values_mut() {
                    // A write that fails (the agent's directory gone with its pod) is the next
                    // tick's to retry.
                    let _ = a.advance();
                }
            }
            drop(accounts);
            std::thread::sleep(ACCOUNTING_TICK);
        }
    });
}

/// What one CPU of a stand-in node does, on average.
struct CpuLoad {
    /// Share of the time it runs tasks.
    utilisation: f64,
    /// Tasks waiting on its run queue (its run delay per second of wall time).
    waiting: f64,
    /// Timeslices it runs per second.
    switches: f64,
}

/// A node's two CPUs alike, each running about 60 % of the time with 0.3 tasks waiting and a
/// thousand timeslices a second: 300 µs of run delay per timeslice, and an idle-while-waiting
/// of 0.3 as the agent reads it (the smaller of 0.4 idle and 0.3 waiting per CPU).
const NORMAL: [CpuLoad; 2] = [
    CpuLoad { utilisation: 0.6, waiting: 0.3, switches: 1000.0 },
    CpuLoad { utilisation: 0.6, waiting: 0.3, switches: 1000.0 },
];
/// Under a slow scheduler tasks strand: they queue on CPU 0 while CPU 1 mostly idles. 45 % used
/// on average, 1.2 tasks waiting per CPU (four times as many), as many timeslices as before (no
/// slice length explains it); the agent's idle-while-waiting rises with it (0.3 to 0.55).
const SLOW: [CpuLoad; 2] = [
    CpuLoad { utilisation: 0.8, waiting: 2.2, switches: 1000.0 },
    CpuLoad { utilisation: 0.1, waiting: 0.2, switches: 1000.0 },
];
/// CPU pressure: some task waits 10 % of the time (microseconds per second).
const PRESSURE_US_PER_SECOND: f64 = 100_000.0;

/// Three factors within ±4 % (utilisation, waiting, switches), from the clock's nanoseconds.
fn jitters() -> [f64; 3] {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    [nanos % 80, nanos / 80 % 80, nanos / 6400 % 80].map(|n| 1.0 + f64::from(n) / 1000.0 - 0.04)
}

impl Accounting {
    fn new(proc_root: &Path, slow: bool) -> Self {
        Self {
            at: Instant::now(),
            cpus: [CpuTime::default(); 2],
            pressure_us: 0,
            proc_root: proc_root.to_owned(),
            slow,
            limited: None,
            limits_ignored: false,
        }
    }

    /// Moves the counters on to now and writes them under the agent's proc root.
    fn advance(&mut self) -> Result<()> {
        let (proc_root, slow) = (self.proc_root.clone(), self.slow);
        let seconds = self.at.elapsed().as_secs_f64();
        self.at = Instant::now();
        let [running, waiting, switches] = jitters();
        let loads = if slow { &SLOW } else { &NORMAL };
        for (cpu, load) in self.cpus.iter_mut().zip(loads) {
            cpu.running_ns += (seconds * load.utilisation * running * 1e9) as u64;
            cpu.run_delay_ns += (seconds * load.waiting * waiting * 1e9) as u64;
            cpu.timeslices += (seconds * load.switches * switches) as u64;
        }
        self.pressure_us += (seconds * PRESSURE_US_PER_SECOND) as u64;
        if let Some(pod) = &mut self.limited {
            pod.advance(seconds, !self.limits_ignored);
            // The agent's cgroup root sits beside its proc root (`crate::agents`).
            let cgroup_root = proc_root.parent().map(|d| d.join("cgroup")).unwrap_or_default();
            pod.write(&cgroup_root)?;
        }
        crate::agents::write_health(&proc_root, &self.cpus, self.pressure_us)
    }
}

/// How each node's kernel treats a pod's scheduler, by node and pod.
pub type KernelPlay = Box<dyn Fn(&str, &Pod) -> Kernel + Send + Sync>;

/// The ops name a scheduler image registers in the kernel, as scx schedulers name themselves:
/// the repository's last part without its `scx_` prefix, with version and target appended
/// (`ghcr.io/schedkit/scx_rusty:v1` -> `rusty_1.0.0_x86_64_unknown_linux_gnu`).
pub fn ops_of_image(image: &str) -> String {
    let repository = image.split('@').next().unwrap_or(image);
    let last = repository.rsplit('/').next().unwrap_or(repository);
    let name = last.split(':').next().unwrap_or(last);
    let name = name.strip_prefix("scx_").or_else(|| name.strip_prefix("scx-")).unwrap_or(name);
    format!("{name}_1.0.0_x86_64_unknown_linux_gnu")
}

/// The image of the pod's first container (the scheduler's).
fn image_of(pod: &Pod) -> String {
    pod.spec.as_ref().and_then(|s| s.containers.first()).and_then(|c| c.image.clone()).unwrap_or_default()
}

/// The kernel's `enable_seq`, as the stand-in kernels count it: each attach takes the next
/// one (a real kernel counts every enable), so a scheduler attached anew is never taken for
/// the one before it.
static ENABLES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_enable_seq() -> u64 {
    ENABLES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The ops name of the scheduler started by hand on a [`Kernel::Foreign`] node.
pub const FOREIGN_OPS: &str = "lavd_1.0.0";

/// How far one pod's scheduler has come.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Its agent runs; the kernel has not attached it (yet).
    Started,
    /// Attached since then.
    Attached(Instant),
    /// Nothing more will happen to it.
    Settled,
}

struct Played {
    pod: String,
    /// The pod as it was when its agent started (a restarted agent is started for it again).
    object: Pod,
    agent: AgentProcess,
    play: Kernel,
    ops: String,
    started: Instant,
    stage: Stage,
    /// The kernel's `enable_seq` as its last attach left it.
    enable_seq: u64,
    /// Readiness probes failed in a row (a kubelet marks a pod unready after three).
    probe_failures: u32,
}

impl Played {
    /// Whether its scheduler runs attached and slows the node down.
    fn slowing(&self) -> bool {
        self.play == Kernel::AttachesSlow && self.stage != Stage::Started
    }

    /// Whether its scheduler runs attached and keeps no pod's CPU limit.
    fn ignoring_limits(&self) -> bool {
        self.play == Kernel::AttachesIgnoringLimits && self.stage != Stage::Started
    }
}

/// The nodes of one test or demo, played one move at a time by [`FakeNodes::drive`].
pub struct FakeNodes {
    client: Client,
    namespace: String,
    /// The pods played (a label selector).
    pods: String,
    /// The nodes counted for [`FakeNodes::most_down`] (a label selector).
    nodes: String,
    dir: PathBuf,
    reports_address: String,
    reports_ca: PathBuf,
    /// The name the agents check the reports server's certificate for (`None`: the address's).
    reports_server_name: Option<String>,
    /// Every replica's reports address, for agents that hold a stream to each.
    reports_replicas: Option<String>,
    /// How long after its pod starts the kernel attaches a scheduler (zero: at once, before
    /// the agent's first read).
    pub attach_after: Duration,
    /// How long an attached [`Kernel::AttachesThenEjected`] scheduler runs before its ejection.
    pub eject_after: Duration,
    pub kernel: KernelPlay,
    agents: BTreeMap<String, Played>,
    /// Every pod uid seen per node, in order.
    pub history: BTreeMap<String, Vec<String>>,
    /// The revision (its `sked.schedkit.io/revision` label) of each pod in `history`.
    pub revisions: BTreeMap<String, Vec<String>>,
    /// The most nodes seen at once that entered a Scheduler and have no Ready pod whose
    /// scheduler is attached.
    pub most_down: usize,
    /// Which nodes were down at that moment, and why.
    pub most_down_at: Vec<String>,
    /// Nodes with no kubelet running: their pods stay Pending, untouched.
    pub absent: std::collections::BTreeSet<String>,
    /// Per node, when its first pod was first marked Ready: read just before the request, so
    /// nothing that saw the pod Ready can have happened earlier (sub-second, unlike the
    /// condition's own time).
    pub first_ready: BTreeMap<String, jiff::Timestamp>,
    /// Each node's stand-in scheduling accounting.
    accounting: Accounts,
    /// Per node, the UID of a pod limited to half a CPU that wants two, whose cgroup its
    /// agent reads: the kernel keeps its limit unless the node's scheduler is
    /// [`Kernel::AttachesIgnoringLimits`].
    pub limited_pods: BTreeMap<String, String>,
}

impl FakeNodes {
    /// Plays the pods matching `pods` in `namespace`; `nodes` selects the nodes that should
    /// each run one; agents report to the reports server at `reports` (files under `dir`).
    pub fn new(
        client: &Client,
        namespace: &str,
        pods: &str,
        nodes: &str,
        dir: &Path,
        reports: &ReportsEndpoint<'_>,
    ) -> Self {
        Self {
            client: client.clone(),
            namespace: namespace.to_owned(),
            pods: pods.to_owned(),
            nodes: nodes.to_owned(),
            dir: dir.to_owned(),
            reports_address: reports.address.to_owned(),
            reports_ca: reports.ca.to_owned(),
            reports_server_name: reports.server_name.map(str::to_owned),
            reports_replicas: reports.replicas.map(str::to_owned),
            attach_after: Duration::ZERO,
            eject_after: Duration::from_secs(3),
            kernel: Box::new(|_, _| Kernel::Attaches),
            agents: BTreeMap::new(),
            history: BTreeMap::new(),
            revisions: BTreeMap::new(),
            most_down: 0,
            most_down_at: Vec::new(),
            absent: std::collections::BTreeSet::new(),
            first_ready: BTreeMap::new(),
            accounting: {
                let accounts = Accounts::default();
                keep_accounting(&accounts);
                accounts
            },
            limited_pods: BTreeMap::new(),
        }
    }

    /// The agent running for `node`'s pod, if any.
    pub fn agent(&self, node: &str) -> Option<&AgentProcess> {
        self.agents.get(node).map(|p| &p.agent)
    }

    /// Stops the agent of `node`'s pod, as if it hung or its node lost the network: the pod
    /// stays, and no further agent is started for it.
    pub fn stop_agent(&mut self, node: &str) {
        if let Some(p) = self.agents.get_mut(node) {
            p.agent.stop();
            p.stage = Stage::Settled;
        }
    }

    /// Kills the agent of `node`'s pod and starts it again, as a crash and a restart of its
    /// container would: the kernel stays as it was, and the new agent reads it afresh.
    pub async fn restart_agent(&mut self, node: &str) -> Result<()> {
        let Some(p) = self.agents.get_mut(node) else { bail!("no agent runs for node {node}") };
        p.agent.stop();
        let object = p.object.clone();
        let agent = self.spawn_agent(node, &object).await?;
        if let Some(p) = self.agents.get_mut(node) {
            p.agent = agent;
        }
        Ok(())
    }

    /// Drives the nodes, a move every 300 ms as a kubelet's probes would, until the Scheduler
    /// `name` satisfies `pred` (at most 90 s); `seen` gets every copy read on the way. A pod
    /// deleted between the list and the kubelet's move is left to the next move.
    pub async fn drive_until(
        &mut self,
        name: &str,
        what: &str,
        mut seen: impl FnMut(&Scheduler),
        pred: impl Fn(&Scheduler) -> bool,
    ) -> Result<Scheduler> {
        let schedulers: Api<Scheduler> = Api::all(self.client.clone());
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            match self.drive().await {
                Ok(()) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(e),
            }
            let s = schedulers.get(name).await?;
            seen(&s);
            if pred(&s) {
                return Ok(s);
            }
            if Instant::now() > deadline {
                let status = serde_json::to_string_pretty(&s.status)?;
                bail!("Scheduler {name}: timed out waiting for {what}; last status: {status}");
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// The kernel of `node` ejects its pod's scheduler now (a runnable task stall).
    pub fn eject(&mut self, node: &str) -> Result<()> {
        match self.agents.get_mut(node) {
            Some(p) => eject(p),
            None => Err(anyhow!("no agent runs for node {node}")),
        }
    }

    /// The kernel of `node` asks its pod's scheduler to restart now, as it does when a CPU goes
    /// on or off line under a scheduler without `cpu_online`/`cpu_offline`: the scheduler leaves
    /// ("unregistered from the main kernel", logged at info level, no detail line) and stays
    /// away until [`FakeNodes::attach_again`].
    pub fn ask_restart(&mut self, node: &str) -> Result<()> {
        let p = self.agents.get_mut(node).ok_or_else(|| anyhow!("no agent runs for node {node}"))?;
        let (name, usec) = (&p.ops, uptime_usec()?);
        let exit =
            format!("6,103,{usec},-;sched_ext: BPF scheduler \"{name}\" disabled (unregistered from the main kernel)");
        p.agent.kernel_logs(&exit)?;
        p.agent.set_kernel("disabled", None, p.enable_seq)?;
        p.stage = Stage::Settled;
        Ok(())
    }

    /// The scheduler of `node`'s pod registers again after a restart (a new enable).
    pub fn attach_again(&mut self, node: &str) -> Result<()> {
        let p = self.agents.get_mut(node).ok_or_else(|| anyhow!("no agent runs for node {node}"))?;
        p.enable_seq = next_enable_seq();
        p.agent.set_kernel("enabled", Some(&p.ops), p.enable_seq)?;
        p.stage = Stage::Attached(Instant::now());
        Ok(())
    }

    /// The agents of every node, by node.
    pub fn agents(&self) -> impl Iterator<Item = (&String, &AgentProcess)> {
        self.agents.iter().map(|(n, p)| (n, &p.agent))
    }

    /// How often each node's pod was replaced since it was first seen.
    pub fn replacements(&self) -> BTreeMap<String, usize> {
        self.history.iter().map(|(n, uids)| (n.clone(), uids.len() - 1)).collect()
    }

    /// One move of every node's kubelet and kernel: an agent for each new pod, its kernel
    /// moved on as the play says, pods Ready as their agents say. A pod deleted between the
    /// list and this move is left to the next one.
    pub async fn drive(&mut self) -> Result<()> {
        // A node without a pod is down only once it entered a Scheduler (its owner label is
        // set): before that it runs revision zero, the kernel's default scheduler. The Nodes are
        // read before the pods: a label the controller wrote before this read, it wrote on what
        // the pods showed then, so both reads see one moment of the rollout.
        let nodes: Api<Node> = Api::all(self.client.clone());
        let entered = format!("{},{OWNER_LABEL}", self.nodes);
        let nodes = nodes.list(&ListParams::default().labels(&entered)).await?;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let list = pods.list(&ListParams::default().labels(&self.pods)).await?;
        let live: BTreeMap<String, Pod> = list
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| Some((p.spec.as_ref()?.node_name.clone()?, p)))
            .filter(|(node, _)| !self.absent.contains(node))
            .collect();
        // Agents of pods that are gone stop with them (their node now runs no scheduler).
        let gone: Vec<String> = self.agents.keys().filter(|n| !live.contains_key(*n)).cloned().collect();
        for node in gone {
            if let Some(mut played) = self.agents.remove(&node) {
                played.agent.stop();
                AgentProcess::preset_kernel(&self.dir, &node, "disabled", None, played.enable_seq)?;
            }
        }
        let mut down = Vec::new();
        for (node, pod) in &live {
            let uid = pod.uid().unwrap_or_default();
            let seen = self.history.entry(node.clone()).or_default();
            if seen.last() != Some(&uid) {
                seen.push(uid);
                let revision = pod.labels().get(sked_controller::api::labels::REVISION_LABEL).cloned();
                self.revisions.entry(node.clone()).or_default().push(revision.unwrap_or_default());
            }
            if self.agents.get(node).is_none_or(|p| p.pod != pod.name_any()) {
                self.start_agent(node, pod).await?;
            }
            self.move_kernel(node)?;
            self.account(node)?;
            let status = pod.status.as_ref();
            let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
            let was_ready = status
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            let ready = self.probe(node, was_ready);
            // Its containers run once its agent does: Running, and Ready as the agent says.
            if ready != was_ready || !running {
                if ready {
                    self.first_ready.entry(node.clone()).or_insert_with(jiff::Timestamp::now);
                }
                match crate::kubelet::set_pod_ready(&pods, &pod.name_any(), ready).await {
                    Err(e) if is_not_found(&e) => {}
                    other => other?,
                }
            }
            // Down until the API server shows the pod Ready (what the controller sees), not
            // only until its agent is: two pods replaced between moves both count.
            if !(ready && was_ready) {
                down.push(format!("{node} (pod {} not Ready)", pod.name_any()));
            }
        }
        down.extend(
            nodes
                .items
                .iter()
                .filter(|n| !live.contains_key(&n.name_any()))
                .map(|n| format!("{} (no pod)", n.name_any())),
        );
        if down.len() > self.most_down {
            self.most_down = down.len();
            down.push(format!("at {}", jiff::Timestamp::now()));
            self.most_down_at = down;
        }
        Ok(())
    }

    /// The readiness of `node`'s pod as a kubelet's probe of its agent's /readyz decides it:
    /// Ready at the first success, unready after three failures in a row (a probe that fails
    /// once, under load, changes nothing).
    fn probe(&mut self, node: &str, was_ready: bool) -> bool {
        const FAILURE_THRESHOLD: u32 = 3;
        let Some(p) = self.agents.get_mut(node) else { return false };
        if p.agent.get("/readyz").is_ok_and(|(code, _)| code == 200) {
            p.probe_failures = 0;
            return true;
        }
        p.probe_failures += 1;
        was_ready && p.probe_failures < FAILURE_THRESHOLD
    }

    /// Starts the agent of `pod` on `node` (stopping its predecessor's), with the kernel set
    /// as the pod's scheduler finds it.
    async fn start_agent(&mut self, node: &str, pod: &Pod) -> Result<()> {
        if let Some(mut old) = self.agents.remove(node) {
            old.agent.stop();
        }
        let play = (self.kernel)(node, pod);
        let ops = ops_of_image(&image_of(pod));
        let at_once = self.attach_after.is_zero()
            && matches!(
                play,
                Kernel::Attaches | Kernel::AttachesThenEjected | Kernel::AttachesSlow | Kernel::AttachesIgnoringLimits
            );
        // The pod's kernel first: its agent's first report is about this pod's scheduler.
        let enable_seq = next_enable_seq();
        match play {
            Kernel::Foreign => AgentProcess::preset_kernel(&self.dir, node, "enabled", Some(FOREIGN_OPS), enable_seq)?,
            _ if at_once => AgentProcess::preset_kernel(&self.dir, node, "enabled", Some(&ops), enable_seq)?,
            _ => AgentProcess::preset_kernel(&self.dir, node, "disabled", None, enable_seq)?,
        }
        let agent = self.spawn_agent(node, pod).await?;
        let stage = if at_once { Stage::Attached(Instant::now()) } else { Stage::Started };
        let played = Played {
            pod: pod.name_any(),
            object: pod.clone(),
            agent,
            play,
            ops,
            started: Instant::now(),
            stage,
            enable_seq,
            probe_failures: 0,
        };
        self.agents.insert(node.to_owned(), played);
        Ok(())
    }

    /// Starts the agent of `pod` on `node` (its token bound to the pod, the scheduler and expected
    /// ops its agent container is given), on the kernel as it is.
    async fn spawn_agent(&self, node: &str, pod: &Pod) -> Result<AgentProcess> {
        let agent_env = |name: &str| {
            pod.spec
                .as_ref()
                .and_then(|s| s.containers.iter().find(|c| c.name == "agent"))
                .and_then(|c| c.env.as_ref())
                .and_then(|vars| vars.iter().find(|v| v.name == name))
                .and_then(|v| v.value.clone())
        };
        let scheduler = agent_env(env::SCHEDULER)
            .or_else(|| pod.labels().get("name").cloned())
            .ok_or_else(|| anyhow!("pod {} names no scheduler", pod.name_any()))?;
        let expected_ops = agent_env(env::EXPECTED_OPS).unwrap_or_else(|| ops_of_image(&image_of(pod)));
        let token = bound_token(&self.client, &self.namespace, "sked-agent", Some(pod)).await?;
        AgentProcess::start(&AgentSpec {
            dir: &self.dir,
            node,
            pod: &pod.name_any(),
            scheduler: &scheduler,
            expected_ops: Some(&expected_ops),
            controller: &self.reports_address,
            ca: &self.reports_ca,
            server_name: self.reports_server_name.as_deref(),
            replicas: self.reports_replicas.as_deref(),
            token: &token,
        })
    }

    /// Moves `node`'s scheduling accounting on to now, for its agent to sample, with its
    /// agent's proc root and whether its scheduler slows it as they are now (the accounting's
    /// thread moves it on between two calls).
    fn account(&mut self, node: &str) -> Result<()> {
        let Some(p) = self.agents.get(node) else { return Ok(()) };
        let (proc_root, slow) = (p.agent.proc_root(), p.slowing());
        let mut accounts = self.accounting.lock().map_err(|_| anyhow!("the accounting thread panicked"))?;
        let accounting = accounts.entry(node.to_owned()).or_insert_with(|| Accounting::new(proc_root, slow));
        accounting.proc_root = proc_root.to_owned();
        accounting.slow = slow;
        accounting.limits_ignored = p.ignoring_limits();
        match (self.limited_pods.get(node), &accounting.limited) {
            (Some(uid), Some(pod)) if *uid == pod.uid => {}
            (uid, _) => accounting.limited = uid.map(|uid| LimitedPod::new(uid)),
        }
        accounting.advance()
    }

    /// Moves `node`'s fake kernel on: attaches the scheduler once its time came, ejects it
    /// once it ran for [`FakeNodes::eject_after`] when the play says so.
    fn move_kernel(&mut self, node: &str) -> Result<()> {
        let (attach_after, eject_after) = (self.attach_after, self.eject_after);
        let Some(p) = self.agents.get_mut(node) else { return Ok(()) };
        match (p.play, p.stage) {
            (
                Kernel::Attaches | Kernel::AttachesThenEjected | Kernel::AttachesSlow | Kernel::AttachesIgnoringLimits,
                Stage::Started,
            ) if p.started.elapsed() >= attach_after => {
                p.enable_seq = next_enable_seq();
                p.agent.set_kernel("enabled", Some(&p.ops), p.enable_seq)?;
                p.stage = Stage::Attached(Instant::now());
            }
            (Kernel::AttachesThenEjected, Stage::Attached(since)) if since.elapsed() >= eject_after => eject(p)?,
            (Kernel::Attaches, Stage::Attached(_)) | (Kernel::Refuses | Kernel::Foreign, _) => p.stage = Stage::Settled,
            (Kernel::AttachesSlow | Kernel::AttachesIgnoringLimits, _) => {}
            _ => {}
        }
        Ok(())
    }
}

/// The kernel ejects `p`'s scheduler for a runnable task stall, as its log says.
fn eject(p: &mut Played) -> Result<()> {
    let (name, usec) = (&p.ops, uptime_usec()?);
    let exit = format!("3,101,{usec},-;sched_ext: BPF scheduler \"{name}\" disabled (runnable task stall)");
    p.agent.kernel_logs(&exit)?;
    let detail = format!("3,102,{},-;sched_ext: {name}: kworker/1:2[91] failed to run for 31.004s", usec + 2000);
    p.agent.kernel_logs(&detail)?;
    // The backtrace the kernel prints after an error exit, indented.
    for (i, frame) in ["scx_watchdog_workfn+0x15b/0x1f0", "process_one_work+0x176/0x330"].iter().enumerate() {
        p.agent.kernel_logs(&format!("4,{},{},-;  {frame}", 103 + i, usec + 2100))?;
    }
    p.agent.set_kernel("disabled", None, p.enable_seq)?;
    p.stage = Stage::Settled;
    Ok(())
}

/// Microseconds since boot, as a `/dev/kmsg` record stamps it (the agent turns it into a time
/// of day from the boot time).
fn uptime_usec() -> Result<u64> {
    let uptime = std::fs::read_to_string("/proc/uptime")?;
    let seconds: f64 = uptime.split_whitespace().next().unwrap_or_default().parse()?;
    Ok((seconds * 1e6) as u64)
}

/// Whether `e` is the API server's 404.
pub fn is_not_found(e: &anyhow::Error) -> bool {
    e.downcast_ref::<kube::Error>().is_some_and(|e| matches!(e, kube::Error::Api(s) if s.code == 404))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_names_come_from_the_image_as_scx_schedulers_register_them() {
        assert_eq!(ops_of_image("ghcr.io/schedkit/scx_rusty:v1"), "rusty_1.0.0_x86_64_unknown_linux_gnu");
        assert_eq!(ops_of_image("ghcr.io/schedkit/scx_lavd@sha256:abcd"), "lavd_1.0.0_x86_64_unknown_linux_gnu");
        assert_eq!(ops_of_image("localhost:5000/canary"), "canary_1.0.0_x86_64_unknown_linux_gnu");
    }

    /// What the agent reads of the stand-in limited pod over ten seconds: its limit kept (a
    /// little under half a CPU, throttled) or not (1.38 CPU, over it, never throttled).
    #[test]
    fn the_stand_in_limited_pod_reads_as_modelled() {
        use sked_agent::pod_cgroups;
        let dir = tempfile::tempdir().unwrap();
        let uid = "0b7c2f3e-1d2a-4c5b-9e8f-123456789abc";
        let cgroup_root = dir.path().join("cgroup");
        for (kept, used) in [(true, LIMITED_CPUS), (false, UNLIMITED_CPUS)] {
            let mut pod = LimitedPod::new(uid);
            pod.write(&cgroup_root).unwrap();
            let list = pod_cgroups::find_pods(&cgroup_root, 8);
            assert_eq!(list.pods.len(), 1, "{list:?}");
            let before = pod_cgroups::read_pod(&list.pods[0].dir).unwrap();
            pod.advance(10.0, kept);
            pod.write(&cgroup_root).unwrap();
            let after = pod_cgroups::read_pod(&list.pods[0].dir).unwrap();
            let window = pod_cgroups::judge(&before, &after, Duration::from_secs(10)).unwrap();
            assert!((window.used_cpus - used).abs() < 0.01 && window.limit_cpus == Some(0.5), "{window:?}");
            assert_eq!((window.over_limit, window.throttled, window.exercised), (!kept, kept, true), "{window:?}");
        }
    }

    /// What the agent reads from ten seconds of the stand-in kernel's accounting (within the
    /// model's ±4 % jitter, ±9 % for run delay per timeslice, a ratio of two jittered rates): a
    /// normal node, and a slow one whose tasks strand.
    #[test]
    fn the_stand_in_load_reads_as_modelled() {
        use sked_agent::schedstat::{self, CpuCounters};
        let dir = tempfile::tempdir().unwrap();
        let within =
            |value: Option<f64>, expected: f64, share: f64| value.is_some_and(|v| (v / expected - 1.0).abs() <= share);
        let near = |value: Option<f64>, expected: f64| within(value, expected, 0.05);
        for (slow, utilisation, waiting, idle_while_waiting, run_delay_us) in
            [(false, 0.6, 0.3, 0.3, 300.0), (true, 0.45, 1.2, 0.55, 1200.0)]
        {
            let ten_seconds_ago = Instant::now().checked_sub(Duration::from_secs(10)).unwrap();
            let mut accounting = Accounting { at: ten_seconds_ago, ..Accounting::new(dir.path(), slow) };
            accounting.advance().unwrap();
            let cpus = schedstat::parse(&std::fs::read_to_string(dir.path().join("schedstat")).unwrap()).unwrap();
            let boot: Vec<CpuCounters> =
                cpus.iter().map(|c| CpuCounters { cpu: c.cpu, ..CpuCounters::default() }).collect();
            let s = schedstat::signals(&boot, &cpus, Duration::from_secs(10));
            assert_eq!(cpus.len(), 2);
            assert!(near(s.utilisation, utilisation) && near(s.waiting_per_cpu, waiting), "slow {slow}: {s:?}");
            assert!(near(s.switches_per_cpu_second, 1000.0), "slow {slow}: {s:?}");
            assert!(within(s.run_delay_us, run_delay_us, 0.09), "slow {slow}: {s:?}");
            assert!(near(s.idle_while_waiting, idle_while_waiting), "slow {slow}: {s:?}");
        }
    }
}
