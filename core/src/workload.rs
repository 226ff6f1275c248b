//! The desired DaemonSet of a Scheduler: a pure function of the Scheduler's spec, the image to
//! deploy and the controller's settings. Which nodes it runs on is said by a Node label, not by
//! the template, so nodes coming and going never change it.
//!
//! The result is applied with server-side apply, so it names every field sked owns and nothing
//! else; a field sked does not set stays with whoever set it.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy};
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction,
    HostPathVolumeSource, ObjectFieldSelector, PodSpec, PodTemplateSpec, Probe, ProjectedVolumeSource, SecurityContext,
    ServiceAccountTokenProjection, Volume, VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube_core::{Resource, ResourceExt};
use sked_proto::contract::{self, env};

use sked_api::Scheduler;

/// Field manager of every object sked applies.
pub const FIELD_MANAGER: &str = "sked";
pub use sked_api::labels::{
    AGENT_CONTAINER, MANAGED_BY, MANAGED_BY_LABEL, NAME_LABEL, OWNER_LABEL, REVISION_LABEL, SCHEDULER_CONTAINER,
};

/// Controller settings that shape every DaemonSet.
#[derive(Clone, Debug)]
pub struct WorkloadSettings {
    /// Namespace of the DaemonSets.
    pub namespace: String,
    pub agent: AgentSettings,
}

/// How the agent sidecar runs.
#[derive(Clone, Debug)]
pub struct AgentSettings {
    pub image: String,
    pub service_account: String,
    /// Address the agent dials, e.g. `https://sked-reports.sked-system.svc:8443`.
    pub reports_address: String,
    /// A name whose DNS records are every controller replica (the chart's headless Service),
    /// for the agent to hold a stream to each; `None`: the agent dials `reports_address` alone.
    pub reports_replicas: Option<String>,
    /// ConfigMap with `ca.crt` for the reports server.
    pub ca_configmap: String,
}

/// The DaemonSet annotation holding the admission key (`Trust::admission_key`) of the image its
/// template runs: a leader that cannot reach the registry keeps a digest admitted for the same
/// inputs instead of calling the Scheduler degraded. On the DaemonSet, not its pods: writing it
/// restarts nothing.
pub const ADMITTED_ANNOTATION: &str = "sked.schedkit.io/admitted";

/// The DaemonSet annotation holding the digest of the object sked last applied (without this
/// annotation): a new leader, which remembers no apply of its own, leaves a DaemonSet alone when
/// it carries the digest of what it would apply and nobody else has written its spec since
/// ([`applied_unchanged`]). A failover then writes no DaemonSet.
pub const APPLIED_ANNOTATION: &str = "sked.schedkit.io/applied";

/// The digest [`APPLIED_ANNOTATION`] holds for `desired` (16 hex digits of its SHA-256).
pub fn applied_digest(desired: &DaemonSet) -> String {
    crate::hashing::short_sha256_hex(&serde_json::to_vec(desired).unwrap_or_default(), 8)
}

/// Whether the live DaemonSet is what sked would apply (`digest`, from [`applied_digest`]): it
/// carries that digest, and no other field manager has written its object (an entry of another
/// manager that is not for the status subresource: a `kubectl edit`, a `rollout restart`, another
/// tool's apply). Either way round, applying again is what undoes the edit.
pub fn applied_unchanged(live: &DaemonSet, digest: &str) -> bool {
    let carries = live.metadata.annotations.as_ref().and_then(|a| a.get(APPLIED_ANNOTATION)).map(String::as_str);
    let edited = live
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .any(|m| m.manager.as_deref() != Some(FIELD_MANAGER) && m.subresource.as_deref().is_none_or(str::is_empty));
    carries == Some(digest) && !edited
}

/// The revision of a Scheduler's pods: a short hash of what the Scheduler's spec puts into them
/// (image, args, env, resources, expected ops, priority class, pull secrets, tolerations) and
/// of the agent image beside it. A new agent image restarts the node's scheduler (the agent is
/// a container of the same pod), so an upgrade of sked to one is rolled out like any revision:
/// canary, waves, bakes, across Schedulers one canary at a time (`--max-concurrent-canaries`).
/// Placement (the nodeSelector) and sked's other settings (the namespace, the reports address)
/// are not part of it: changing them rolls out nothing, and reaches a node's pod at its next
/// switch.
pub fn revision(scheduler: &Scheduler, image: &str, agent_image: &str) -> String {
    revision_of(scheduler, image, Some(agent_image))
}

/// The name sked gave the revision of `scheduler` running `image` before agent images were part
/// of revisions: its pods, labelled so, are adopted where they run the current agent image
/// (see [`crate::pods::TemplateRevision::earlier_name`]).
pub fn revision_before_agents(scheduler: &Scheduler, image: &str) -> String {
    revision_of(scheduler, image, None)
}

fn revision_of(scheduler: &Scheduler, image: &str, agent_image: Option<&str>) -> String {
    let spec = &scheduler.spec;
    let mut inputs = serde_json::json!({
        "image": image,
        "args": spec.args,
        "env": spec.env,
        "resources": spec.resources,
        "expectedOps": spec.expected_ops,
        "priorityClassName": spec.priority_class_name,
        "imagePullSecrets": spec.image_pull_secrets,
        "tolerations": spec.tolerations,
    });
    if let (Some(agent_image), Some(inputs)) = (agent_image, inputs.as_object_mut()) {
        inputs.insert("agentImage".to_owned(), agent_image.into());
    }
    crate::hashing::short_sha256_hex(inputs.to_string().as_bytes(), 5)
}

/// Builds the DaemonSet for `scheduler`, running `image`: a pure function of the Scheduler's
/// spec, the image and the controller's settings. Its pods go to the nodes that carry the
/// Scheduler's [`OWNER_LABEL`]; the update strategy is `OnDelete`, so the controller itself
/// decides when a pod is replaced (see [`crate::rollout`]).
pub fn desired_daemonset(
    scheduler: &Scheduler,
    image: &str,
    settings: &WorkloadSettings,
) -> Result<DaemonSet, MissingIdentity> {
    let name = scheduler.name_any();
    let owner = owner_reference(scheduler)?;
    let spec = &scheduler.spec;

    let labels =
        BTreeMap::from([(NAME_LABEL.to_owned(), name.clone()), (MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned())]);
    let mut pod_labels = labels.clone();
    pod_labels.insert(REVISION_LABEL.to_owned(), revision(scheduler, image, &settings.agent.image));
    let mut node_selector = spec.node_selector.clone();
    node_selector.insert(OWNER_LABEL.to_owned(), name.clone());

    let scx = Container {
        name: SCHEDULER_CONTAINER.to_owned(),
        image: Some(image.to_owned()),
        args: non_empty(spec.args.clone()),
        env: non_empty(spec.env.clone()),
        resources: spec.resources.clone(),
        security_context: Some(SecurityContext { privileged: Some(true), ..SecurityContext::default() }),
        volume_mounts: Some(scheduler_mounts()),
        // A scheduler that cannot start says why in its last log lines: the kubelet keeps them
        // as the container's termination message, which the rollout quotes.
        termination_message_policy: Some(FALLBACK_TO_LOGS.to_owned()),
        ..Container::default()
    };

    let pod = PodSpec {
        containers: vec![scx, agent_container(&name, spec.expected_ops.as_deref(), &settings.agent)],
        volumes: Some(pod_volumes(&settings.agent)),
        service_account_name: Some(settings.agent.service_account.clone()),
        node_selector: Some(node_selector),
        tolerations: non_empty(spec.tolerations.clone()),
        image_pull_secrets: non_empty(spec.image_pull_secrets.clone()),
        priority_class_name: spec.priority_class_name.clone(),
        // The agent finds the scheduler process through the shared process namespace.
        share_process_namespace: Some(true),
        // Nothing in the pod talks to the API server; the agent's token is projected for the
        // reports audience only.
        automount_service_account_token: Some(false),
        ..PodSpec::default()
    };

    Ok(DaemonSet {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(settings.namespace.clone()),
            labels: Some(labels),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(BTreeMap::from([(NAME_LABEL.to_owned(), name)])),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: Some(pod_labels), ..ObjectMeta::default() }),
                spec: Some(pod),
            },
            // sked replaces pods itself, paced by what the kernel reports.
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: Some("OnDelete".to_owned()),
                ..DaemonSetUpdateStrategy::default()
            }),
            ..DaemonSetSpec::default()
        },
        status: None,
    })
}

/// The revision label of `ds`'s pod template.
pub fn template_revision(ds: &DaemonSet) -> Option<&str> {
    ds.spec.template.metadata.as_ref()?.labels.as_ref()?.get(REVISION_LABEL).map(String::as_str)
}

/// Sets the revision label of `ds`'s pod template to `revision`.
pub fn set_template_revision(ds: &mut DaemonSet, revision: &str) {
    let metadata = ds.spec.template.metadata.get_or_insert_with(Default::default);
    let labels = metadata.labels.get_or_insert_with(Default::default);
    labels.insert(REVISION_LABEL.to_owned(), revision.to_owned());
}

/// Puts back, into a DaemonSet built from the current spec and settings, what makes up the
/// revision of `template` (a pod template from the DaemonSet's history): the scheduler container,
/// the revision label, the agent's image and the expected ops it checks, tolerations, pull
/// secrets and priority class. Placement (the nodeSelector with the owner label) and sked's other
/// settings (the agent's flags, its volumes) stay current, so a rollback never sends pods to
/// nodes the Scheduler no longer owns; a revision that failed with a new agent goes back to the
/// agent it ran with (within the skew policy, that agent still reports to this controller).
pub fn restore_revision(desired: &mut DaemonSet, template: &PodTemplateSpec) {
    let (Some(pod), Some(old)) = (desired.spec.template.spec.as_mut(), template.spec.as_ref()) else { return };
    let old_container = |name: &str| old.containers.iter().find(|c| c.name == name);
    if let (Some(scx), Some(old_scx)) =
        (pod.containers.iter_mut().find(|c| c.name == SCHEDULER_CONTAINER), old_container(SCHEDULER_CONTAINER))
    {
        // The revision's container, with sked's own mounts and termination message policy.
        let (mounts, policy) = (scx.volume_mounts.take(), scx.termination_message_policy.take());
        *scx = old_scx.clone();
        (scx.volume_mounts, scx.termination_message_policy) = (mounts, policy);
    }
    let old_ops = old_container(AGENT_CONTAINER)
        .and_then(|c| c.env.as_ref())
        .and_then(|env| env.iter().find(|e| e.name == env::EXPECTED_OPS).cloned());
    let old_agent_image = old_container(AGENT_CONTAINER).and_then(|c| c.image.clone());
    if let Some(agent) = pod.containers.iter_mut().find(|c| c.name == AGENT_CONTAINER) {
        if old_agent_image.is_some() {
            agent.image = old_agent_image;
        }
        let vars = agent.env.get_or_insert_with(Vec::new);
        vars.retain(|e| e.name != env::EXPECTED_OPS);
        vars.extend(old_ops);
    }
    pod.tolerations = old.tolerations.clone();
    pod.image_pull_secrets = old.image_pull_secrets.clone();
    pod.priority_class_name = old.priority_class_name.clone();
    let old_revision = template.metadata.as_ref().and_then(|m| m.labels.as_ref()).and_then(|l| l.get(REVISION_LABEL));
    if let (Some(labels), Some(revision)) =
        (desired.spec.template.metadata.as_mut().and_then(|m| m.labels.as_mut()), old_revision)
    {
        labels.insert(REVISION_LABEL.to_owned(), revision.clone());
    }
}

/// The agent sidecar: reads the node's sched_ext state, serves /readyz (Ready only when this
/// pod's scheduler is attached) and streams reports to the controller.
fn agent_container(scheduler: &str, expected_ops: Option<&str>, agent: &AgentSettings) -> Container {
    let field = |path: &str| EnvVarSource {
        field_ref: Some(ObjectFieldSelector { field_path: path.to_owned(), ..ObjectFieldSelector::default() }),
        ..EnvVarSource::default()
    };
    let mut env = vec![
        EnvVar { name: env::NODE_NAME.into(), value_from: Some(field("spec.nodeName")), ..EnvVar::default() },
        EnvVar { name: env::POD_NAME.into(), value_from: Some(field("metadata.name")), ..EnvVar::default() },
        EnvVar { name: env::SCHEDULER.into(), value: Some(scheduler.to_owned()), ..EnvVar::default() },
        EnvVar { name: env::CGROUP_ROOT.into(), value: Some(contract::HOST_CGROUP.into()), ..EnvVar::default() },
        EnvVar {
            name: env::CONTROLLER_ADDRESS.into(),
            value: Some(agent.reports_address.clone()),
            ..EnvVar::default()
        },
    ];
    if let Some(replicas) = &agent.reports_replicas {
        env.push(EnvVar { name: env::CONTROLLER_REPLICAS.into(), value: Some(replicas.clone()), ..EnvVar::default() });
    }
    if let Some(ops) = expected_ops {
        env.push(EnvVar { name: env::EXPECTED_OPS.into(), value: Some(ops.to_owned()), ..EnvVar::default() });
    }
    Container {
        name: AGENT_CONTAINER.to_owned(),
        image: Some(agent.image.clone()),
        env: Some(env),
        ports: Some(vec![ContainerPort {
            name: Some("agent".into()),
            container_port: i32::from(contract::AGENT_PORT),
            ..ContainerPort::default()
        }]),
        readiness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some(contract::READYZ_PATH.into()),
                port: IntOrString::Int(i32::from(contract::AGENT_PORT)),
                ..HTTPGetAction::default()
            }),
            period_seconds: Some(2),
            failure_threshold: Some(1),
            ..Probe::default()
        }),
        volume_mounts: Some(vec![
            VolumeMount {
                name: "reports-token".into(),
                mount_path: contract::TOKEN_DIR.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
            VolumeMount {
                name: "reports-ca".into(),
                mount_path: contract::CA_DIR.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
            // The scheduler's stats socket (connecting needs no write access to the mount).
            VolumeMount {
                name: STATS_VOLUME.into(),
                mount_path: contract::STATS_DIR.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
            // The pods' CPU limits and usage, read only.
            VolumeMount {
                name: HOST_CGROUP_VOLUME.into(),
                mount_path: contract::HOST_CGROUP.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
        ]),
        // Privileged for one thing: opening /dev/kmsg, which a container's device cgroup allows
        // only to privileged containers. At start the agent drops every capability but the three
        // it uses (CAP_SYS_ADMIN to list BPF objects, CAP_SYS_PTRACE for the scheduler's
        // /proc/<pid>/fdinfo, CAP_SYSLOG for the kernel log), before it starts any thread.
        security_context: Some(SecurityContext {
            privileged: Some(true),
            run_as_user: Some(0),
            read_only_root_filesystem: Some(true),
            ..SecurityContext::default()
        }),
        ..Container::default()
    }
}

/// The host's cgroup2 tree (the pods' CPU limits and usage, read by the agent).
const HOST_CGROUP_VOLUME: &str = "host-cgroup";
/// The volume the scheduler and the agent share for the scheduler's stats socket.
const STATS_VOLUME: &str = "scx-stats";
/// The host's /boot (the kernel config libbpf reads).
const HOST_BOOT_VOLUME: &str = "host-boot";
const FALLBACK_TO_LOGS: &str = "FallbackToLogsOnError";

/// What the scheduler container mounts: the shared stats directory (scx_utils schedulers create
/// their socket there, and stop if they cannot), and the host's /boot read-only.
fn scheduler_mounts() -> Vec<VolumeMount> {
    vec![
        VolumeMount { name: STATS_VOLUME.into(), mount_path: contract::STATS_DIR.into(), ..VolumeMount::default() },
        VolumeMount {
            name: HOST_BOOT_VOLUME.into(),
            mount_path: contract::HOST_BOOT.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        },
    ]
}

/// The pod's volumes: the agent's token and CA, the shared stats directory, the host's /boot and
/// its cgroup2 tree.
fn pod_volumes(agent: &AgentSettings) -> Vec<Volume> {
    vec![
        Volume {
            name: "reports-token".into(),
            projected: Some(ProjectedVolumeSource {
                sources: Some(vec![VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        audience: Some(contract::REPORTS_AUDIENCE.into()),
                        expiration_seconds: Some(3600),
                        path: contract::TOKEN_FILE_NAME.into(),
                        ..ServiceAccountTokenProjection::default()
                    }),
                    ..VolumeProjection::default()
                }]),
                ..ProjectedVolumeSource::default()
            }),
            ..Volume::default()
        },
        Volume {
            name: "reports-ca".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: agent.ca_configmap.clone(),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        },
        Volume { name: STATS_VOLUME.into(), empty_dir: Some(EmptyDirVolumeSource::default()), ..Volume::default() },
        Volume {
            name: HOST_BOOT_VOLUME.into(),
            host_path: Some(HostPathVolumeSource { path: contract::HOST_BOOT.into(), type_: None }),
            ..Volume::default()
        },
        Volume {
            name: HOST_CGROUP_VOLUME.into(),
            host_path: Some(HostPathVolumeSource { path: contract::HOST_CGROUP_SOURCE.into(), type_: None }),
            ..Volume::default()
        },
    ]
}

/// The Scheduler lacks the uid or name an owner reference needs (it was never stored).
#[derive(Debug, thiserror::Error)]
#[error("Scheduler {0:?} has no uid yet: it must be read from the API server before it can own a DaemonSet")]
pub struct MissingIdentity(pub String);

fn owner_reference(scheduler: &Scheduler) -> Result<OwnerReference, MissingIdentity> {
    scheduler.controller_owner_ref(&()).ok_or_else(|| MissingIdentity(scheduler.name_any()))
}

fn non_empty<T>(items: Vec<T>) -> Option<Vec<T>> {
    (!items.is_empty()).then_some(items)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EnvVar, Toleration};
    use sked_api::SchedulerSpec;

    fn scheduler(spec: SchedulerSpec) -> Scheduler {
        let mut s = Scheduler::new("rusty", spec);
        s.metadata.uid = Some("uid-1".into());
        s
    }

    fn settings() -> WorkloadSettings {
        WorkloadSettings {
            namespace: "sked-system".into(),
            agent: AgentSettings {
                image: "ghcr.io/schedkit/sked-agent:v0.1.0".into(),
                service_account: "sked-agent".into(),
                reports_address: "https://sked-reports.sked-system.svc:8443".into(),
                reports_replicas: Some("sked-reports-replicas.sked-system.svc".into()),
                ca_configmap: "sked-reports-ca".into(),
            },
        }
    }

    fn pod(ds: &DaemonSet) -> &PodSpec {
        ds.spec.template.spec.as_ref().unwrap()
    }

    #[test]
    fn daemonset_is_owned_labelled_and_runs_the_image() {
        let s = scheduler(SchedulerSpec {
            sched: "ghcr.io/schedkit/scx_rusty:v1".into(),
            args: vec!["--slice-us".into(), "5000".into()],
            env: vec![EnvVar { name: "RUST_LOG".into(), value: Some("info".into()), ..Default::default() }],
            ..Default::default()
        });
        let ds = desired_daemonset(&s, "ghcr.io/schedkit/scx_rusty:v1", &settings()).unwrap();

        assert_eq!(ds.metadata.name.as_deref(), Some("rusty"));
        assert_eq!(ds.metadata.namespace.as_deref(), Some("sked-system"));
        let owner = &ds.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()), ("Scheduler", "rusty", "uid-1"));
        assert_eq!(owner.controller, Some(true));
        assert_eq!(owner.api_version, "sked.schedkit.io/v1");

        let spec = &ds.spec;
        assert_eq!(spec.selector.match_labels.as_ref().unwrap()["name"], "rusty");
        let template_labels = spec.template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
        assert_eq!(template_labels["name"], "rusty");

        let pod = pod(&ds);
        assert_eq!(pod.share_process_namespace, Some(true));
        let scx = &pod.containers[0];
        assert_eq!(scx.name, "scx");
        assert_eq!(scx.image.as_deref(), Some("ghcr.io/schedkit/scx_rusty:v1"));
        assert_eq!(scx.args.as_deref(), Some(&["--slice-us".to_string(), "5000".to_string()][..]));
        assert_eq!(scx.env.as_ref().unwrap()[0].name, "RUST_LOG");
        assert_eq!(scx.security_context.as_ref().unwrap().privileged, Some(true));
        assert!(pod.affinity.is_none(), "placement is the owner label's, not the template's");
        assert_eq!(pod.node_selector.as_ref().unwrap()["sked.schedkit.io/scheduler"], "rusty");
        assert_eq!(
            template_labels["sked.schedkit.io/revision"],
            revision(&s, "ghcr.io/schedkit/scx_rusty:v1", "ghcr.io/schedkit/sked-agent:v0.1.0")
        );
        assert_eq!(spec.update_strategy.as_ref().unwrap().type_.as_deref(), Some("OnDelete"));

        // The agent sidecar: identity from the downward API, readiness on /readyz, a token for
        // the reports audience only.
        let agent = &pod.containers[1];
        assert_eq!(agent.name, "agent");
        let env: Vec<&str> = agent.env.as_ref().unwrap().iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            env,
            [
                "NODE_NAME",
                "POD_NAME",
                "SKED_SCHEDULER",
                "SKED_CGROUP_ROOT",
                "SKED_CONTROLLER_ADDRESS",
                "SKED_CONTROLLER_REPLICAS"
            ]
        );
        let cgroup_root = agent.env.iter().flatten().find(|e| e.name == "SKED_CGROUP_ROOT");
        assert_eq!(cgroup_root.and_then(|e| e.value.as_deref()), Some("/host/cgroup"));
        let probe = agent.readiness_probe.as_ref().unwrap().http_get.as_ref().unwrap();
        assert_eq!(probe.path.as_deref(), Some("/readyz"));
        assert_eq!(pod.service_account_name.as_deref(), Some("sked-agent"));
        assert_eq!(pod.automount_service_account_token, Some(false));
        let token = pod.volumes.as_ref().unwrap()[0].projected.as_ref().unwrap().sources.as_ref().unwrap()[0]
            .service_account_token
            .as_ref()
            .unwrap();
        assert_eq!(token.audience.as_deref(), Some("sked-reports"));
    }

    #[test]
    fn expected_ops_reach_the_agent() {
        let s =
            scheduler(SchedulerSpec { sched: "x/y".into(), expected_ops: Some("rusty".into()), ..Default::default() });
        let ds = desired_daemonset(&s, "x/y", &settings()).unwrap();
        let env = pod(&ds).containers[1].env.clone().unwrap();
        assert!(env.iter().any(|e| e.name == "SKED_EXPECTED_OPS" && e.value.as_deref() == Some("rusty")));
    }

    #[test]
    fn selector_and_tolerations_shape_placement_next_to_the_owner_label() {
        let s = scheduler(SchedulerSpec {
            sched: "x/y:z".into(),
            node_selector: BTreeMap::from([("schedkit.io/pool".into(), "batch".into())]),
            tolerations: vec![Toleration {
                key: Some("dedicated".into()),
                operator: Some("Equal".into()),
                value: Some("batch".into()),
                effect: Some("NoSchedule".into()),
                ..Default::default()
            }],
            ..Default::default()
        });
        let ds = desired_daemonset(&s, "x/y:z", &settings()).unwrap();
        let pod = pod(&ds);
        let selector = pod.node_selector.as_ref().unwrap();
        assert_eq!(selector.len(), 2);
        assert_eq!(selector["schedkit.io/pool"], "batch");
        assert_eq!(selector["sked.schedkit.io/scheduler"], "rusty");
        assert_eq!(pod.tolerations.as_ref().unwrap()[0].key.as_deref(), Some("dedicated"));
    }

    #[test]
    fn the_revision_follows_what_runs_and_its_agent_not_where() {
        const AGENT: &str = "ghcr.io/schedkit/sked-agent:v0.1.0";
        let base = scheduler(SchedulerSpec { sched: "x/y".into(), ..Default::default() });
        let r = revision(&base, "x/y@sha256:1", AGENT);
        assert_eq!(r.len(), 10);
        assert_ne!(r, revision(&base, "x/y@sha256:2", AGENT), "a new digest is a new revision");
        let args = scheduler(SchedulerSpec { args: vec!["--fast".into()], ..base.spec.clone() });
        assert_ne!(r, revision(&args, "x/y@sha256:1", AGENT), "new args are a new revision");
        let moved = scheduler(SchedulerSpec {
            node_selector: BTreeMap::from([("pool".into(), "b".into())]),
            rollout: Some(sked_api::RolloutSpec { paused: true, ..Default::default() }),
            ..base.spec.clone()
        });
        assert_eq!(r, revision(&moved, "x/y@sha256:1", AGENT), "placement and pacing are not revisions");
        // A new agent image restarts the node's scheduler: a new revision, rolled out in waves.
        let mut other = settings();
        other.agent.image = "ghcr.io/schedkit/sked-agent:v9".into();
        let a = desired_daemonset(&base, "x/y@sha256:1", &settings()).unwrap();
        let b = desired_daemonset(&base, "x/y@sha256:1", &other).unwrap();
        let label = |ds: &DaemonSet| {
            ds.spec.template.metadata.as_ref().unwrap().labels.as_ref().unwrap()[REVISION_LABEL].clone()
        };
        assert_eq!(label(&a), r);
        assert_ne!(label(&a), label(&b), "a new agent image is a new revision");
        // sked's other settings change the template, not the revision.
        let mut moved_reports = settings();
        moved_reports.agent.reports_address = "https://elsewhere:8443".into();
        let c = desired_daemonset(&base, "x/y@sha256:1", &moved_reports).unwrap();
        assert_ne!(a, c);
        assert_eq!(label(&a), label(&c));
    }

    #[test]
    fn the_earlier_name_of_a_revision_is_what_sked_wrote_before_agents_counted() {
        // The formula of the releases before: the spec's fields alone.
        let s = scheduler(SchedulerSpec { sched: "x/y".into(), args: vec!["--a".into()], ..Default::default() });
        let spec = &s.spec;
        let before = serde_json::json!({
            "image": "x/y@sha256:1",
            "args": spec.args,
            "env": spec.env,
            "resources": spec.resources,
            "expectedOps": spec.expected_ops,
            "priorityClassName": spec.priority_class_name,
            "imagePullSecrets": spec.image_pull_secrets,
            "tolerations": spec.tolerations,
        });
        let earlier = crate::hashing::short_sha256_hex(before.to_string().as_bytes(), 5);
        assert_eq!(revision_before_agents(&s, "x/y@sha256:1"), earlier);
        assert_ne!(revision(&s, "x/y@sha256:1", "a:1"), earlier);
    }

    #[test]
    fn a_restored_revision_keeps_current_placement_and_settings() {
        let old_spec = SchedulerSpec {
            sched: "x/y".into(),
            args: vec!["--old".into()],
            expected_ops: Some("old_ops".into()),
            node_selector: BTreeMap::from([("pool".into(), "a".into())]),
            ..Default::default()
        };
        let old = desired_daemonset(&scheduler(old_spec), "x/y@sha256:1", &settings()).unwrap();
        // Since then: new args and ops, another pool, another agent image.
        let new_spec = SchedulerSpec {
            sched: "x/y".into(),
            args: vec!["--new".into()],
            expected_ops: Some("new_ops".into()),
            node_selector: BTreeMap::from([("pool".into(), "b".into())]),
            ..Default::default()
        };
        let mut other = settings();
        other.agent.image = "ghcr.io/schedkit/sked-agent:v9".into();
        let mut restored = desired_daemonset(&scheduler(new_spec), "x/y@sha256:1", &other).unwrap();
        restore_revision(&mut restored, &old.spec.template);

        let pod = pod(&restored);
        assert_eq!(pod.containers[0].args.as_deref(), Some(&["--old".to_string()][..]), "the old scheduler");
        let labels = restored.spec.template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
        let old_labels = old.spec.template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
        assert_eq!(labels[REVISION_LABEL], old_labels[REVISION_LABEL]);
        let agent = &pod.containers[1];
        assert_eq!(agent.image.as_deref(), Some("ghcr.io/schedkit/sked-agent:v0.1.0"), "the revision's agent");
        let ops: Vec<&str> = agent
            .env
            .as_ref()
            .unwrap()
            .iter()
            .filter(|e| e.name == "SKED_EXPECTED_OPS")
            .filter_map(|e| e.value.as_deref())
            .collect();
        assert_eq!(ops, ["old_ops"]);
        assert_eq!(pod.node_selector.as_ref().unwrap()["pool"], "b", "current placement");
    }

    #[test]
    fn the_scheduler_and_the_agent_share_the_stats_directory_and_the_scheduler_reads_the_host_s_boot() {
        let s = scheduler(SchedulerSpec { sched: "x/y".into(), ..Default::default() });
        let ds = desired_daemonset(&s, "x/y", &settings()).unwrap();
        let spec = pod(&ds);
        let mounts = |c: &Container| -> Vec<(String, String, bool)> {
            let mounts = c.volume_mounts.iter().flatten();
            mounts.map(|m| (m.name.clone(), m.mount_path.clone(), m.read_only.unwrap_or(false))).collect()
        };
        let stats = ("scx-stats".to_string(), "/var/run/scx".to_string(), false);
        let boot = ("host-boot".to_string(), "/boot".to_string(), true);
        assert_eq!(mounts(&spec.containers[0]), vec![stats.clone(), boot]);
        assert!(mounts(&spec.containers[1]).contains(&(stats.0, stats.1, true)), "the agent only connects");
        let cgroup = ("host-cgroup".to_string(), "/host/cgroup".to_string(), true);
        assert!(mounts(&spec.containers[1]).contains(&cgroup), "the agent reads the host's cgroups, read only");
        assert!(!mounts(&spec.containers[0]).contains(&cgroup), "the scheduler does not");
        assert_eq!(spec.containers[0].termination_message_policy.as_deref(), Some("FallbackToLogsOnError"));
        let volumes = spec.volumes.as_ref().unwrap();
        let boot = volumes.iter().find(|v| v.name == "host-boot").and_then(|v| v.host_path.as_ref()).unwrap();
        assert_eq!(boot.path, "/boot");
        let cgroup = volumes.iter().find(|v| v.name == "host-cgroup").and_then(|v| v.host_path.as_ref()).unwrap();
        assert_eq!(cgroup.path, "/sys/fs/cgroup");
        assert!(volumes.iter().any(|v| v.name == "scx-stats" && v.empty_dir.is_some()));

        // A revision restored from a DaemonSet sked made before these mounts gets them too.
        let mut old = ds.clone();
        if let Some(scx) = old.spec.template.spec.as_mut().map(|p| &mut p.containers[0]) {
            (scx.volume_mounts, scx.termination_message_policy) = (None, None);
        }
        let mut restored = ds.clone();
        restore_revision(&mut restored, &old.spec.template);
        assert_eq!(pod(&restored).containers[0], spec.containers[0]);
    }

    #[test]
    fn unset_optionals_stay_unset_so_apply_owns_nothing_extra() {
        let s = scheduler(SchedulerSpec { sched: "x/y".into(), ..Default::default() });
        let ds = desired_daemonset(&s, "x/y", &settings()).unwrap();
        let pod = pod(&ds);
        assert_eq!(pod.node_selector.as_ref().unwrap().len(), 1, "the owner label only");
        assert!(pod.tolerations.is_none());
        assert!(pod.image_pull_secrets.is_none());
        assert!(pod.priority_class_name.is_none());
        let scx = &pod.containers[0];
        assert!(scx.args.is_none() && scx.env.is_none() && scx.resources.is_none());
    }

    #[test]
    fn a_scheduler_without_uid_cannot_own_a_daemonset() {
        let s = Scheduler::new("rusty", SchedulerSpec { sched: "x/y".into(), ..Default::default() });
        let err = desired_daemonset(&s, "x/y", &settings()).unwrap_err();
        assert!(err.to_string().contains("rusty"));
    }

    #[test]
    fn equal_inputs_give_equal_objects() {
        let s = scheduler(SchedulerSpec { sched: "x/y".into(), ..Default::default() });
        let a = desired_daemonset(&s, "x/y", &settings()).unwrap();
        let b = desired_daemonset(&s, "x/y", &settings()).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn a_daemonset_carrying_its_digest_and_written_by_no_one_else_is_left_alone() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
        let s = scheduler(SchedulerSpec { sched: "x/y".into(), ..Default::default() });
        let desired = desired_daemonset(&s, "x/y", &settings()).unwrap();
        let digest = applied_digest(&desired);
        assert_eq!(digest.len(), 16);
        let entry = |manager: &str, subresource: Option<&str>| ManagedFieldsEntry {
            manager: Some(manager.into()),
            subresource: subresource.map(Into::into),
            ..Default::default()
        };
        let mut live = desired.clone();
        live.annotations_mut().insert(APPLIED_ANNOTATION.into(), digest.clone());
        live.metadata.managed_fields =
            Some(vec![entry(FIELD_MANAGER, None), entry("kube-controller-manager", Some("status"))]);
        assert!(applied_unchanged(&live, &digest), "sked's own apply and the DaemonSet controller's status");
        assert!(!applied_unchanged(&live, "0123456789abcdef"), "another digest: the spec changed");
        let mut edited = live.clone();
        edited.metadata.managed_fields.get_or_insert_default().push(entry("kubectl-edit", None));
        assert!(!applied_unchanged(&edited, &digest), "edited by hand: applied again to undo it");
        let mut legacy = live.clone();
        legacy.annotations_mut().remove(APPLIED_ANNOTATION);
        assert!(!applied_unchanged(&legacy, &digest), "made by an older sked");
    }
}
