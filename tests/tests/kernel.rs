//! Kernel truth end to end against the real API server: agent processes on fake sysfs roots
//! report over TLS with tokens bound to the DaemonSet's pods; the controller folds their
//! verdicts into KERNEL-ATTACHED and the KernelAttached condition.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use sked_controller::config::ControllerFlags;
use sked_controller::{Scheduler, SchedulerSpec};
use sked_tests::agents::{AgentProcess, AgentSpec, ReportsEndpoint, ReportsTls, bound_token, ensure_running};
use sked_tests::cluster::free_port;
use sked_tests::{Fixture, condition, has_condition, spec_on, wait_for};

const IMAGE: &str = "ghcr.io/schedkit/scx_rusty:v1";
const STALE_AFTER: Duration = Duration::from_secs(3);

struct Setup {
    fx: Fixture,
    name: String,
    tls: ReportsTls,
    controller: String,
    dir: tempfile::TempDir,
    /// Pod of the Scheduler's DaemonSet on each node.
    pods: BTreeMap<String, Pod>,
}

/// A controller with its reports server, two Nodes, a Scheduler with `expectedOps: rusty`,
/// and its DaemonSet's pods bound to the nodes.
async fn setup(name: &str) -> Result<Setup> {
    let dir = tempfile::tempdir()?;
    let tls = ReportsTls::generate(dir.path())?;
    let (flags, controller) = tls.serving_flags()?;
    let flags = ControllerFlags { report_stale_after: STALE_AFTER, ..flags };
    let fx = Fixture::start_with(flags).await?;
    for n in ["k-1", "k-2"] {
        fx.create_node(n, &[("pool", "k")]).await?;
    }
    let spec = SchedulerSpec { expected_ops: Some("rusty".into()), ..spec_on(IMAGE, &[("pool", "k")]) };
    fx.create_scheduler(name, spec).await?;
    let pods = sked_tests::wait_bound_pods(&fx.client, &fx.namespace, name, 2).await?;
    Ok(Setup { fx, name: name.to_owned(), tls, controller, dir, pods })
}

impl Setup {
    /// Both nodes' agents, with rusty attached in both kernels (KernelAttached 2/2); returns
    /// the condition's Scheduler too.
    async fn both_attached(&self) -> Result<(AgentProcess, AgentProcess, Scheduler)> {
        let a1 = self.agent("k-1").await?;
        let a2 = self.agent("k-2").await?;
        a1.set_kernel("enabled", Some("rusty_1.0.0"), 1)?;
        a2.set_kernel("enabled", Some("rusty_1.0.0"), 1)?;
        let sched = self.wait_kernel("both attached", 2, "KernelAttached").await?;
        self.ran_everywhere().await?;
        Ok((a1, a2, sched))
    }

    /// Plays the kubelet marking both pods Ready, and waits until the revision ran everywhere:
    /// a kernel change after this is news to report, not a first revision failing (which would
    /// go back to the kernel's default scheduler).
    async fn ran_everywhere(&self) -> Result<()> {
        self.fx.mark_pods_ready(&self.name).await?;
        self.fx
            .wait_scheduler(&self.name, "the first deployment complete", |s| {
                s.status.as_ref().and_then(|st| st.rollout.as_ref()).is_some_and(|r| r.current_revision.is_some())
            })
            .await?;
        Ok(())
    }

    async fn agent(&self, node: &str) -> Result<AgentProcess> {
        let reports =
            ReportsEndpoint { address: &self.controller, ca: &self.tls.ca, server_name: None, replicas: None };
        AgentProcess::for_pod(
            &self.fx.client,
            &self.fx.namespace,
            self.dir.path(),
            &self.pods[node],
            &self.name,
            &reports,
        )
        .await
    }

    async fn wait_kernel(&self, what: &str, attached: i32, reason: &str) -> Result<Scheduler> {
        self.fx
            .wait_scheduler(&self.name, what, |s| {
                // Both nodes scheduled: the DaemonSet controller has reported.
                s.status.as_ref().is_some_and(|st| st.kernel_attached == attached && st.desired_number_scheduled == 2)
                    && condition(s, "KernelAttached").is_some_and(|c| c.reason == reason)
            })
            .await
    }
}

#[tokio::test]
async fn kernel_state_flips_drive_the_count_and_the_condition() -> Result<()> {
    let s = setup("flips").await?;
    let mut a1 = s.agent("k-1").await?;
    let mut a2 = s.agent("k-2").await?;

    let sched = s.wait_kernel("nothing attached", 0, "NotAttached").await?;
    assert_eq!(sched.status.as_ref().and_then(|st| st.kernel_attached_summary.clone()).as_deref(), Some("0/2"));
    ensure_running(&mut a1)?;
    ensure_running(&mut a2)?;

    // k-1 attaches: 1/2. Measure how long the status takes (polling agents, for the note).
    let flipped = Instant::now();
    a1.set_kernel("enabled", Some("rusty_1.0.0_x86_64_unknown_linux_gnu"), 1)?;
    let sched = s.wait_kernel("k-1 attached", 1, "NotAttached").await?;
    eprintln!("measured: state change -> status update (polling 200ms): {:?}", flipped.elapsed());
    let msg = &condition(&sched, "KernelAttached").context("condition")?.message;
    assert!(msg.starts_with("1 of 2") && msg.contains("k-2"), "{msg}");
    assert_eq!(sched.status.as_ref().and_then(|st| st.kernel_attached_summary.clone()).as_deref(), Some("1/2"));

    // Both attached: KernelAttached=True, 2/2.
    a2.set_kernel("enabled", Some("rusty_1.0.0_x86_64_unknown_linux_gnu"), 1)?;
    let sched = s.wait_kernel("both attached", 2, "KernelAttached").await?;
    assert!(has_condition(&sched, "KernelAttached", "True", "KernelAttached"));
    s.ran_everywhere().await?;

    // The agents say so on /readyz and /metrics, with the node's scheduling health once its
    // counters move.
    let (code, body) = a1.get("/readyz")?;
    assert_eq!(code, 200, "{body}");
    let mut moved = 0;
    wait_for("a1's scheduling health on /metrics", || {
        moved += 1;
        let cpu = sked_tests::agents::CpuTime {
            running_ns: moved * 500_000_000,
            run_delay_ns: moved * 1_000_000,
            timeslices: moved * 1000,
        };
        let written = sked_tests::agents::write_health(a1.proc_root(), &[cpu, cpu], moved * 100_000);
        let seen = a1.get("/metrics").map(|(_, m)| m.contains("\nsked_agent_run_delay_"));
        async move { Ok((written.is_ok() && seen.unwrap_or(false)).then_some(())) }
    })
    .await?;
    let (code, metrics) = a1.get("/metrics")?;
    assert_eq!(code, 200);
    for line in [
        "sked_agent_attached 1",
        "sked_agent_sched_ext_state{state=\"enabled\"} 1",
        "sked_agent_verdict{verdict=\"Attached\"} 1",
        "sked_agent_sched_ext_enable_seq 1",
        "sked_agent_sched_ext_events_total{event=\"REFILL_SLICE_DFL\",ops=\"rusty_1.0.0_x86_64_unknown_linux_gnu\"} 42",
        "sked_agent_report_stream_connected 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "missing {line:?} in\n{metrics}");
    }
    assert!(metrics.contains("sked_agent_reports_sent_total"), "{metrics}");
    // Both expositions follow Prometheus conventions (names, types, units, help).
    sked_tests::promtool_check_metrics(&metrics)?;
    sked_tests::promtool_check_metrics(&s.fx.scrape_metrics().await?)?;

    // k-2 detaches: back to 1/2 NotAttached, and its /readyz fails.
    a2.set_kernel("disabled", None, 1)?;
    let sched = s.wait_kernel("k-2 detached", 1, "NotAttached").await?;
    let msg = &condition(&sched, "KernelAttached").context("condition")?.message;
    assert!(msg.contains("k-2: no sched_ext scheduler is enabled"), "{msg}");
    let (code, body) = a2.get("/readyz")?;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("NotAttached"), "{body}");

    // Events: one per kernel state change.
    s.fx.wait_event("flips", "Normal", "KernelAttached", 1).await?;
    s.fx.wait_event("flips", "Normal", "NotAttached", 1).await?;
    Ok(())
}

#[tokio::test]
async fn a_new_leader_keeps_kernel_conditions_until_agents_report() -> Result<()> {
    let mut s = setup("failover").await?;
    let (_a1, _a2, before) = s.both_attached().await?;
    s.fx.wait_event(&s.name, "Normal", "KernelAttached", 1).await?;
    // The first deployment's completion is recorded after its status: every event of the old
    // leader is in before the count is taken.
    s.fx.wait_event(&s.name, "Normal", "DaemonSetReady", 1).await?;
    let events = s.fx.scheduler_events(&s.name).await?;

    // The leader goes; the next one has heard no agent (these reach the leader alone), and they cannot
    // reach it yet (another port): within a heartbeat it judges nothing.
    s.fx.stop_controller().await?;
    let flags = ControllerFlags {
        reports_bind_address: ([127, 0, 0, 1], free_port()?).into(),
        reports_cert_file: Some(s.tls.cert.clone()),
        reports_key_file: Some(s.tls.key.clone()),
        report_stale_after: STALE_AFTER,
        agent_heartbeat_interval: Duration::from_secs(120),
        ..ControllerFlags::default()
    };
    s.fx.start_controller(flags)?;
    wait_for("the new leader's first reconcile", || async {
        let metrics = s.fx.scrape_metrics().await?;
        let done =
            metrics.lines().any(|l| l.starts_with("sked_reconciles_total{result=\"success\"}") && !l.ends_with(" 0"));
        Ok(done.then_some(()))
    })
    .await?;
    let after = s.fx.schedulers().get(&s.name).await?;
    assert_eq!(condition(&after, "KernelAttached"), condition(&before, "KernelAttached"), "no condition change");
    assert_eq!(after.status.as_ref().map(|st| st.kernel_attached), Some(2));
    assert_eq!(s.fx.scheduler_events(&s.name).await?, events, "no event");
    Ok(())
}

#[tokio::test]
async fn a_foreign_scheduler_and_a_silent_agent_are_reported() -> Result<()> {
    let s = setup("foreign").await?;
    let (a1, mut a2, _) = s.both_attached().await?;

    // Someone starts another scheduler by hand on k-2.
    a2.set_kernel("enabled", Some("lavd_1.0.0"), 2)?;
    let sched = s.wait_kernel("foreign on k-2", 1, "ForeignScheduler").await?;
    let msg = &condition(&sched, "KernelAttached").context("condition")?.message;
    assert!(msg.contains("k-2") && msg.contains("lavd_1.0.0"), "{msg}");
    s.fx.wait_event("foreign", "Warning", "ForeignScheduler", 1).await?;

    // k-2's agent stops: after the stale limit its node is ReportStale.
    a2.set_kernel("enabled", Some("rusty_1.0.0"), 3)?;
    s.wait_kernel("k-2 attached again", 2, "KernelAttached").await?;
    a2.stop();
    let sched = s.wait_kernel("k-2 stale", 1, "ReportStale").await?;
    let msg = &condition(&sched, "KernelAttached").context("condition")?.message;
    assert!(msg.contains("k-2: no report for"), "{msg}");

    // It comes back: the first heartbeat clears the staleness.
    let _a2 = s.agent("k-2").await?;
    s.wait_kernel("k-2 back", 2, "KernelAttached").await?;
    drop(a1);
    Ok(())
}

#[tokio::test]
async fn the_agent_keeps_only_the_capabilities_it_uses() -> Result<()> {
    let s = setup("lean").await?;
    let a1 = s.agent("k-1").await?;
    a1.set_kernel("enabled", Some("rusty_1.0.0"), 1)?;
    s.fx.wait_scheduler(&s.name, "k-1 reported", |s| s.status.as_ref().is_some_and(|st| st.kernel_attached == 1))
        .await?;
    // CAP_SYS_PTRACE (19), CAP_SYS_ADMIN (21) and CAP_SYSLOG (34), on every thread, nothing to
    // hand on.
    let used = format!("{:016x}", (1u64 << 19) | (1u64 << 21) | (1u64 << 34));
    let tasks = std::fs::read_dir(format!("/proc/{}/task", a1.pid()))?;
    let mut threads = 0;
    for task in tasks {
        let status = std::fs::read_to_string(task?.path().join("status"))?;
        let field = |name: &str| {
            status.lines().find_map(|l| l.strip_prefix(name)).map(str::trim).unwrap_or_default().to_owned()
        };
        assert_eq!(field("CapEff:"), used, "{status}");
        assert_eq!(field("CapPrm:"), used, "{status}");
        assert_eq!(field("CapInh:"), "0000000000000000", "{status}");
        assert_eq!(field("CapAmb:"), "0000000000000000", "{status}");
        threads += 1;
    }
    assert!(threads > 1, "the runtime's threads were checked too");
    Ok(())
}

#[tokio::test]
async fn garbage_in_a_node_s_sysfs_reaches_the_status_escaped() -> Result<()> {
    let s = setup("garbled").await?;
    let a1 = s.agent("k-1").await?;
    let state = a1.sysfs.join("kernel/sched_ext/state");
    std::fs::write(&state, b"en\0abled\xff\x1b[2J")?;
    let sched =
        s.fx.wait_scheduler(&s.name, "the garbled state reported", |s| {
            condition(s, "KernelAttached").is_some_and(|c| c.message.contains("unknown sched_ext state"))
        })
        .await?;
    let msg = &condition(&sched, "KernelAttached").context("condition")?.message;
    assert!(msg.contains(r#"k-1: unknown sched_ext state "en\u{0}abled\u{fffd}\u{1b}[2J""#), "{msg}");
    assert!(!msg.chars().any(char::is_control), "{msg:?}");
    Ok(())
}

#[tokio::test]
async fn the_kernel_message_counts_and_names_only_nodes_that_run_a_pod() -> Result<()> {
    let s = setup("counted-kernel").await?;
    // Three more nodes match the selector but are tainted against the Scheduler's pods: the
    // Scheduler owns them, the DaemonSet wants no pod there.
    // (Tainted before they match, so no pod lands there first.)
    for n in ["tainted-1", "tainted-2", "tainted-3"] {
        s.fx.create_node(n, &[]).await?;
        let taint =
            serde_json::json!({"spec": {"taints": [{"key": "dedicated", "value": "other", "effect": "NoSchedule"}]}});
        s.fx.nodes().patch(n, &Default::default(), &kube::api::Patch::Merge(&taint)).await?;
        s.fx.relabel_node(n, &[("pool", "k")]).await?;
    }
    let a1 = s.agent("k-1").await?;
    a1.set_kernel("enabled", Some("rusty_1.0.0"), 1)?;
    let sched = s.wait_kernel("k-1 attached, k-2 not reporting", 1, "NotAttached").await?;
    let msg = &condition(&sched, "KernelAttached").context("condition")?.message;
    assert_eq!(
        msg,
        "1 of 2 scheduled nodes run this scheduler in the kernel; k-2: no report yet; 3 node(s) skipped (3 TaintNotTolerated): see status.rollout.skippedNodes",
        "the tainted nodes counted apart"
    );
    Ok(())
}

/// A token of `service_account` for `audience`, bound to the object `kind`/`name`/`uid`.
async fn token_for(
    fx: &Fixture,
    service_account: &str,
    audience: &str,
    bound: Option<(&str, String, Option<String>)>,
) -> Result<String> {
    use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let api: kube::Api<ServiceAccount> = kube::Api::namespaced(fx.client.clone(), &fx.namespace);
    let request = TokenRequest {
        metadata: Default::default(),
        spec: Some(TokenRequestSpec {
            audiences: Some(vec![audience.into()]),
            bound_object_ref: bound.map(|(kind, name, uid)| BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some(kind.into()),
                name: Some(name),
                uid,
            }),
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        status: None,
    };
    let issued = api.create_token_request(service_account, &Default::default(), &request).await?;
    issued.status.and_then(|s| s.token).context("TokenRequest returned no token")
}

#[tokio::test]
async fn streams_with_the_wrong_identity_are_refused_and_counted() -> Result<()> {
    use sked_proto::v1::reports_client::ReportsClient;
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

    let s = setup("guarded-reports").await?;
    let ca = std::fs::read(&s.tls.ca)?;
    let k1_pod = s.pods["k-1"].name_any();
    // One stream with one report (node, pod, Scheduler), with `token`.
    let stream = |token: String, node: &str, pod: &str, scheduler: &str| {
        let ca = ca.clone();
        let address = s.controller.clone();
        let report = sked_proto::Report {
            node: node.to_owned(),
            pod: pod.to_owned(),
            scheduler: scheduler.to_owned(),
            sequence: 1,
            ..Default::default()
        };
        async move {
            let channel = Endpoint::from_shared(address)?
                .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)))?
                .connect()
                .await?;
            let mut req = tonic::Request::new(futures::stream::iter(vec![report]));
            req.metadata_mut().insert("authorization", format!("Bearer {token}").parse()?);
            let result: Result<Option<sked_proto::Ack>, tonic::Status> = async {
                let mut acks = ReportsClient::new(channel).stream(req).await?.into_inner();
                acks.message().await
            }
            .await;
            anyhow::Ok(result)
        }
    };
    let refused = |result: Result<Option<sked_proto::Ack>, tonic::Status>, code: tonic::Code, reason: &str| {
        let err = result.expect_err("refused");
        assert_eq!(err.code(), code, "{err}");
        assert!(err.message().starts_with(reason), "the agent is told why ({reason}): {err}");
        err
    };

    // The right token, for its own node, pod and Scheduler: accepted.
    let good = bound_token(&s.fx.client, &s.fx.namespace, "sked-agent", Some(&s.pods["k-1"])).await?;
    let ack =
        stream(good.clone(), "k-1", &k1_pod, "guarded-reports").await?.map_err(|e| anyhow::anyhow!("refused: {e}"))?;
    assert_eq!(ack.map(|a| a.sequence), Some(1));

    // The right token, reporting for another node: refused.
    let err = refused(
        stream(good.clone(), "k-2", &k1_pod, "guarded-reports").await?,
        tonic::Code::PermissionDenied,
        "wrong_node",
    );
    assert!(err.message().contains("cannot report for node \"k-2\""), "{err}");

    // A pod of one Scheduler reporting for another Scheduler: refused.
    let err =
        refused(stream(good, "k-1", &k1_pod, "someone-else").await?, tonic::Code::PermissionDenied, "wrong_scheduler");
    assert!(err.message().contains("someone-else"), "{err}");

    // A token of another service account (for the right audience): refused.
    sked_tests::ensure_service_account(&s.fx.client, &s.fx.namespace, "intruder").await?;
    let other = bound_token(&s.fx.client, &s.fx.namespace, "intruder", None).await?;
    refused(stream(other, "k-1", &k1_pod, "guarded-reports").await?, tonic::Code::PermissionDenied, "not_agent");

    // The agent's own service account, but not bound to a pod: refused.
    let unbound = bound_token(&s.fx.client, &s.fx.namespace, "sked-agent", None).await?;
    refused(stream(unbound, "k-1", &k1_pod, "guarded-reports").await?, tonic::Code::PermissionDenied, "not_pod_bound");

    // Bound to the Node, not to a pod: refused.
    let node = s.fx.nodes().get("k-1").await?;
    let node_bound = token_for(&s.fx, "sked-agent", "sked-reports", Some(("Node", "k-1".into(), node.uid()))).await?;
    refused(
        stream(node_bound, "k-1", &k1_pod, "guarded-reports").await?,
        tonic::Code::PermissionDenied,
        "not_pod_bound",
    );

    // Issued for another audience: refused.
    let pod = &s.pods["k-1"];
    let elsewhere = token_for(&s.fx, "sked-agent", "elsewhere", Some(("Pod", pod.name_any(), pod.uid()))).await?;
    refused(
        stream(elsewhere, "k-1", &k1_pod, "guarded-reports").await?,
        tonic::Code::Unauthenticated,
        "token_rejected",
    );

    // Another pod that runs as the agent service account on k-1, not a scheduler pod: refused.
    let pods: kube::Api<Pod> = kube::Api::namespaced(s.fx.client.clone(), &s.fx.namespace);
    let stray: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "stray", "labels": {"app": "stray"}},
        "spec": {"nodeName": "k-1", "serviceAccountName": "sked-agent",
                 "containers": [{"name": "c", "image": "example.invalid/stray:v1"}]},
    }))?;
    let stray = pods.create(&Default::default(), &stray).await?;
    let stray_token = bound_token(&s.fx.client, &s.fx.namespace, "sked-agent", Some(&stray)).await?;
    refused(
        stream(stray_token.clone(), "k-1", "stray", "guarded-reports").await?,
        tonic::Code::PermissionDenied,
        "not_scheduler_pod",
    );

    // The pod the token was bound to is deleted: refused.
    pods.delete("stray", &kube::api::DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await?;
    wait_for("the stray pod to be gone", || async { Ok(pods.get_opt("stray").await?.is_none().then_some(())) }).await?;
    let err = stream(stray_token, "k-1", "stray", "guarded-reports").await?.expect_err("a gone pod's token is refused");
    assert!(
        err.message().starts_with("token_rejected") || err.message().starts_with("pod_gone"),
        "the agent is told why: {err}"
    );

    // A token of the right pod, past its expiry: refused.
    let fresh = bound_token(&s.fx.client, &s.fx.namespace, "sked-agent", Some(&s.pods["k-1"])).await?;
    let expired = sked_tests::agents::expired_copy(s.fx.cluster, &fresh)?;
    let err = refused(
        stream(expired, "k-1", &k1_pod, "guarded-reports").await?,
        tonic::Code::Unauthenticated,
        "token_rejected",
    );
    assert!(err.message().contains("expired"), "{err}");

    // Garbage: refused.
    refused(
        stream("not-a-token".into(), "k-1", &k1_pod, "guarded-reports").await?,
        tonic::Code::Unauthenticated,
        "token_rejected",
    );

    let stats = &s.fx.report_stats;
    assert_eq!(stats.accepted_streams.get(), 3, "the wrong-node and wrong-Scheduler streams were accepted, then cut");
    assert_eq!(stats.refused_streams.get(), 10);
    for (reason, count) in
        [("wrong_node", 1), ("wrong_scheduler", 1), ("not_agent", 1), ("not_pod_bound", 2), ("not_scheduler_pod", 1)]
    {
        assert_eq!(stats.refusals(reason), count, "{reason}");
    }
    assert_eq!(stats.refusals("token_rejected") + stats.refusals("pod_gone"), 4);
    let metrics = s.fx.scrape_metrics().await?;
    assert!(metrics.contains("sked_report_refusals_total{reason=\"not_scheduler_pod\"} 1"), "{metrics}");
    Ok(())
}

#[tokio::test]
async fn the_reports_server_bounds_streams_messages_and_token_reviews() -> Result<()> {
    use sked_proto::v1::reports_client::ReportsClient;
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

    let s = setup("bounded").await?;
    let ca = std::fs::read(&s.tls.ca)?;
    let pod = s.pods["k-1"].name_any();
    let report = |reason: String| sked_proto::Report {
        node: "k-1".into(),
        pod: pod.clone(),
        scheduler: "bounded".into(),
        reason,
        sequence: 1,
        ..Default::default()
    };
    // A stream that stays open: its first report's answer, and what keeps it open.
    let open = |token: String, report: sked_proto::Report| {
        let (ca, address) = (ca.clone(), s.controller.clone());
        async move {
            let channel = Endpoint::from_shared(address)?
                .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)))?
                .connect()
                .await?;
            let (keep, rest) = futures::channel::mpsc::unbounded::<sked_proto::Report>();
            let reports = futures::StreamExt::chain(futures::stream::iter(vec![report]), rest);
            let mut req = tonic::Request::new(reports);
            req.metadata_mut().insert("authorization", format!("Bearer {token}").parse()?);
            let answer = async {
                let mut acks = ReportsClient::new(channel).stream(req).await?.into_inner();
                let first = acks.message().await?;
                Ok::<_, tonic::Status>((first, acks))
            }
            .await;
            anyhow::Ok((answer, keep))
        }
    };
    let stats = &s.fx.report_stats;
    let reviews_before = stats.token_reviews.get();

    // Two streams of one node are fine; a third is refused. One TokenReview for the three.
    let token = bound_token(&s.fx.client, &s.fx.namespace, "sked-agent", Some(&s.pods["k-1"])).await?;
    let (first, _keep1) = open(token.clone(), report("one".into())).await?;
    let (_, _acks1) = first.map_err(|e| anyhow::anyhow!("first stream refused: {e}"))?;
    let (second, _keep2) = open(token.clone(), report("two".into())).await?;
    let (_, _acks2) = second.map_err(|e| anyhow::anyhow!("second stream refused: {e}"))?;
    let (third, _keep3) = open(token.clone(), report("three".into())).await?;
    let err = third.err().context("a third stream of one node is refused")?;
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err}");
    assert!(err.message().starts_with("too_many_streams"), "{err}");
    assert_eq!(stats.token_reviews.get() - reviews_before, 1, "the token was reviewed once");

    // Junk tokens: one review, however often they come back.
    let junk_before = stats.token_reviews.get();
    for _ in 0..3 {
        let (answer, _keep) = open("junk".into(), report("junk".into())).await?;
        assert_eq!(answer.err().map(|e| e.code()), Some(tonic::Code::Unauthenticated));
    }
    assert_eq!(stats.token_reviews.get() - junk_before, 1);

    // A report larger than the limit ends its stream (k-2, whose node holds no stream).
    let k2 = &s.pods["k-2"];
    let k2_token = bound_token(&s.fx.client, &s.fx.namespace, "sked-agent", Some(k2)).await?;
    let huge = sked_proto::Report {
        node: "k-2".into(),
        pod: k2.name_any(),
        reason: "x".repeat(sked_controller::reports::MAX_MESSAGE_BYTES + 1),
        ..report(String::new())
    };
    let (answer, _keep) = open(k2_token, huge).await?;
    let err = answer.err().context("an oversized report is refused")?;
    assert_eq!(err.code(), tonic::Code::OutOfRange, "{err}");
    Ok(())
}

#[tokio::test]
async fn a_connection_that_opens_no_stream_is_closed_after_the_stale_limit() -> Result<()> {
    use std::io::ErrorKind;
    use tokio::io::AsyncReadExt;
    let s = setup("idle-connection").await?;
    let port: u16 = s.controller.rsplit(':').next().and_then(|p| p.parse().ok()).context("the reports port")?;
    let ca = std::fs::read_to_string(&s.tls.ca)?;
    // Timed from before the connection (the server's clock starts after its handshake), so
    // the lower bound below cannot fail by the handshake's length.
    let opened = std::time::Instant::now();
    let mut idle = sked_tests::agents::tls_connect(([127, 0, 0, 1], port).into(), &ca, "localhost", &[b"h2"]).await?;
    // It never sends the HTTP/2 preface, let alone a stream: the server hangs up on it.
    let mut buf = [0u8; 64];
    // Closed means the server's end of file or a reset (a TCP close without TLS close_notify
    // reads as an unexpected end of file); any other error is not the hang-up this names.
    let read_until_closed = async {
        loop {
            match idle.read(&mut buf).await {
                Ok(0) => return Ok(opened.elapsed()),
                Err(e) if matches!(e.kind(), ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset) => {
                    return Ok(opened.elapsed());
                }
                Err(e) => return Err(anyhow::anyhow!("reading the idle connection failed, not closed: {e}")),
                Ok(_) => {} // the server's HTTP/2 preface and GOAWAY
            }
        }
    };
    let closed = tokio::time::timeout(STALE_AFTER * 10, read_until_closed)
        .await
        .map_err(|_| anyhow::anyhow!("the server kept a connection without a stream for {:?}", STALE_AFTER * 10))??;
    eprintln!("measured: a connection without a stream closed after {closed:?} (limit {STALE_AFTER:?})");
    // Not before the limit: a server that drops every new connection at once would pass above.
    assert!(closed >= STALE_AFTER, "closed after {closed:?}, before the stale limit {STALE_AFTER:?}");
    Ok(())
}

/// Holds one connection to the reports port from 127.0.0.2 that never starts TLS, and opens it
/// again whenever the server closes it (a pause between, so the flood is 1,000 connections, not
/// a busy loop on the test machine's cores).
async fn hold_silent_connection(port: u16) {
    use tokio::io::AsyncReadExt;
    loop {
        let connected = async {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind(([127, 0, 0, 2], 0).into())?;
            socket.connect(([127, 0, 0, 1], port).into()).await
        };
        if let Ok(mut tcp) = connected.await {
            let mut buf = [0u8; 16];
            while matches!(tcp.read(&mut buf).await, Ok(n) if n > 0) {}
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The value of one metric line (`name{labels}`) in a Prometheus text exposition.
fn metric_value(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(series)).and_then(|v| v.trim().parse().ok())
}

#[tokio::test]
async fn a_flood_of_silent_connections_keeps_no_agent_out() -> Result<()> {
    let s = setup("flood").await?;
    let port: u16 = s.controller.rsplit(':').next().and_then(|p| p.parse().ok()).context("the reports port")?;
    let flood: Vec<_> = (0..1000).map(|_| tokio::spawn(hold_silent_connection(port))).collect();
    let dropped = |reason: &str| format!(r#"sked_tls_connections_dropped_total{{port="reports",reason="{reason}"}}"#);
    // The flood is there: the server has closed connections for both reasons.
    wait_for("the flood to be met at the door", || async {
        let metrics = s.fx.scrape_metrics().await?;
        let met =
            ["source_limit", "silent"].iter().all(|r| metric_value(&metrics, &dropped(r)).is_some_and(|n| n > 0.0));
        Ok(met.then_some(()))
    })
    .await?;

    let started = Instant::now();
    let agent = s.agent("k-1").await?;
    agent.set_kernel("enabled", Some("rusty_1.0.0"), 1)?;
    s.wait_kernel("k-1's report in the status while the flood goes on", 1, "NotAttached").await?;
    eprintln!(
        "measured: with 1,000 silent connections from one address, an agent's report reached the status {:?} after the agent started",
        started.elapsed()
    );
    let metrics = s.fx.scrape_metrics().await?;
    assert!(
        metric_value(&metrics, r#"sked_tls_connections_total{port="reports"}"#).is_some_and(|n| n > 1000.0),
        "{metrics}"
    );
    for task in flood {
        task.abort();
    }
    Ok(())
}

#[tokio::test]
async fn a_flood_of_peers_stalling_inside_their_hello_keeps_no_agent_out() -> Result<()> {
    let s = setup("stalled").await?;
    let port: u16 = s.controller.rsplit(':').next().and_then(|p| p.parse().ok()).context("the reports port")?;
    // 1,500 connections from 200 addresses, each a few bytes into its ClientHello and no more:
    // more than the 256 handshake slots, and within every address's limit of 64.
    let flood = sked_tests::agents::stalled_hello_flood(port, 1500, 200);
    let dropped = r#"sked_tls_connections_dropped_total{port="reports",reason="incomplete_hello"}"#;
    wait_for("the flood to be met at the door", || async {
        let metrics = s.fx.scrape_metrics().await?;
        Ok(metric_value(&metrics, dropped).is_some_and(|n| n >= 1500.0).then_some(()))
    })
    .await?;
    let started = Instant::now();
    let agent = s.agent("k-1").await?;
    agent.set_kernel("enabled", Some("rusty_1.0.0"), 1)?;
    s.wait_kernel("k-1's report in the status while the flood goes on", 1, "NotAttached").await?;
    let took = started.elapsed();
    eprintln!(
        "measured: with 1,500 connections stalling in their hello, an agent's report reached the status {took:?} after the agent started"
    );
    // Before the door waited for whole hellos, this agent waited out the stalled peers'
    // handshake timeouts (20.7 s); now it takes a handshake slot as soon as it asks.
    assert!(took < Duration::from_secs(5), "the agent waited {took:?} behind the flood");
    let metrics = s.fx.scrape_metrics().await?;
    let timeouts = r#"sked_tls_connections_dropped_total{port="reports",reason="handshake_timeout"}"#;
    assert_eq!(metric_value(&metrics, timeouts).unwrap_or(0.0), 0.0, "no stalled peer held a handshake slot");
    drop(flood);
    Ok(())
}

#[tokio::test]
async fn a_standby_keeps_the_streams_of_agents_that_reach_every_replica_and_refuses_the_others() -> Result<()> {
    use sked_controller::kernel_table::KernelTable;
    use sked_controller::metrics::ReportStats;
    use sked_controller::reports::ReportsService;
    use std::sync::Arc;

    let s = setup("leader-reports").await?;
    // A second replica's reports server, whose leadership this test controls.
    let (leader_tx, leader_rx) = tokio::sync::watch::channel(false);
    let triggers = sked_controller::triggers::Triggers::default();
    let stats = Arc::new(ReportStats::default());
    let settings = sked_controller::reports::ReportsSettings {
        agent_namespace: s.fx.namespace.clone(),
        agent_service_account: "sked-agent".into(),
        stale_after: STALE_AFTER,
    };
    let service = ReportsService::new(
        s.fx.client.clone(),
        &settings,
        Arc::new(KernelTable::default()),
        triggers,
        stats.clone(),
        leader_rx,
    );
    let port = free_port()?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(sked_controller::reports::serve(
        service,
        ([127, 0, 0, 1], port).into(),
        sked_controller::tls::ReloadingCert::load(&s.tls.cert, &s.tls.key).map_err(anyhow::Error::msg)?,
        sked_controller::handshake_gate::HandshakeGate::new(
            "reports",
            Arc::new(sked_controller::metrics::Metrics::new(stats.clone())),
        ),
        async move {
            let _ = stop_rx.await;
        },
    ));
    let pod = &s.pods["k-1"];
    let token = bound_token(&s.fx.client, &s.fx.namespace, "sked-agent", Some(pod)).await?;
    let agent = AgentProcess::start(&AgentSpec {
        dir: s.dir.path(),
        node: "k-1",
        pod: &pod.name_any(),
        scheduler: &s.name,
        expected_ops: Some("rusty"),
        controller: &format!("https://localhost:{port}"),
        ca: &s.tls.ca,
        server_name: None,
        replicas: None,
        token: &token,
    })?;
    let metric = |name: &str| -> Result<i64> {
        let (_, body) = agent.get("/metrics")?;
        Ok(body.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok())).unwrap_or(-1))
    };

    // A standby refuses streams: the agent keeps retrying, unconnected.
    wait_for("the agent to be refused by the standby", || async {
        Ok((metric("sked_agent_report_stream_failures_total ")? >= 1).then_some(()))
    })
    .await?;
    assert_eq!(metric("sked_agent_report_stream_connected ")?, 0);
    assert_eq!(stats.accepted_streams.get(), 0);

    // It becomes the leader: the agent connects.
    leader_tx.send(true)?;
    wait_for("the agent to connect to the leader", || async {
        Ok((metric("sked_agent_report_stream_connected ")? == 1).then_some(()))
    })
    .await?;
    assert_eq!(stats.open_streams.load(Ordering::Relaxed), 1);

    // It loses leadership: the stream is closed at once, and new ones are refused.
    let failures = metric("sked_agent_report_stream_failures_total ")?;
    leader_tx.send(false)?;
    wait_for("the stream to be closed", || async {
        Ok((stats.open_streams.load(Ordering::Relaxed) == 0 && metric("sked_agent_report_stream_connected ")? == 0)
            .then_some(()))
    })
    .await?;
    wait_for("the agent's reconnects to be refused", || async {
        Ok((metric("sked_agent_report_stream_failures_total ")? > failures).then_some(()))
    })
    .await?;
    assert_eq!(stats.accepted_streams.get(), 1);
    drop(agent);

    // An agent that holds a stream to every replica (k-2's) is taken by the standby, and its
    // stream outlives a term of leadership.
    let pod = &s.pods["k-2"];
    let token = bound_token(&s.fx.client, &s.fx.namespace, "sked-agent", Some(pod)).await?;
    let replicas = format!("127.0.0.1:{port}");
    let every_replica = AgentProcess::start(&AgentSpec {
        dir: s.dir.path(),
        node: "k-2",
        pod: &pod.name_any(),
        scheduler: &s.name,
        expected_ops: Some("rusty"),
        controller: &format!("https://localhost:{port}"),
        ca: &s.tls.ca,
        server_name: None,
        replicas: Some(&replicas),
        token: &token,
    })?;
    wait_for("the standby to take k-2's stream", || async {
        Ok((stats.accepted_streams.get() == 2 && stats.open_streams.load(Ordering::Relaxed) == 1).then_some(()))
    })
    .await?;
    // A term of leadership begins and ends while the stream carries reports: it stays open.
    let more_reports = |n: u64| {
        let (stats, from) = (stats.clone(), stats.reports.get());
        move || {
            let stats = stats.clone();
            async move { Ok((stats.reports.get() >= from + n).then_some(())) }
        }
    };
    leader_tx.send(true)?;
    wait_for("a report on k-2's stream while leading", more_reports(1)).await?;
    leader_tx.send(false)?;
    wait_for("two more reports on k-2's stream after the term", more_reports(2)).await?;
    assert_eq!(stats.accepted_streams.get(), 2, "k-2's stream was never closed: it reached every replica");
    assert_eq!(stats.open_streams.load(Ordering::Relaxed), 1);
    let (_, body) = every_replica.get("/metrics")?;
    assert!(body.lines().any(|l| l == "sked_agent_report_streams_open 1"), "{body}");
    assert!(body.lines().any(|l| l == "sked_agent_report_stream_connected 1"), "{body}");

    // The server stops: it ends the streams it would otherwise keep, and returns.
    let _ = stop_tx.send(());
    server.await?.map_err(|e| anyhow::anyhow!("the reports server: {e}"))?;
    wait_for("k-2's agent to see its stream closed", || async {
        let (_, body) = every_replica.get("/metrics")?;
        Ok(body.lines().any(|l| l == "sked_agent_report_streams_open 0").then_some(()))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_renewed_reports_certificate_is_served_without_a_restart() -> Result<()> {
    let s = setup("renewal").await?;
    let address: std::net::SocketAddr = s
        .controller
        .trim_start_matches("https://localhost:")
        .parse::<u16>()
        .map(|port| ([127, 0, 0, 1], port).into())?;
    let old_ca = std::fs::read_to_string(&s.tls.ca)?;
    sked_tests::agents::tls_handshake(address, &old_ca).await?;

    // cert-manager renews the Secret: the server presents the new pair on new connections.
    let new_ca = s.tls.rotate()?;
    wait_for("the renewed certificate to be served", || async {
        Ok(sked_tests::agents::tls_handshake(address, &new_ca).await.is_ok().then_some(()))
    })
    .await?;
    assert!(sked_tests::agents::tls_handshake(address, &old_ca).await.is_err(), "the old certificate is gone");
    Ok(())
}

#[tokio::test]
async fn an_idle_fleet_is_silent_and_a_kernel_report_changes_only_its_status_and_pod_condition() -> Result<()> {
    let s = setup("idle").await?;
    let a1 = s.agent("k-1").await?;
    let a2 = s.agent("k-2").await?;
    for a in [&a1, &a2] {
        a.set_kernel("enabled", Some("rusty_1.0.0_x86_64_unknown_linux_gnu"), 1)?;
    }
    // A Scheduler whose only node has a taint its pods do not tolerate: no pod, nothing to wait
    // for on a timer.
    s.fx.create_node("k-tainted", &[("pool", "tainted")]).await?;
    let taint =
        serde_json::json!({"spec": {"taints": [{"key": "dedicated", "value": "other", "effect": "NoSchedule"}]}});
    s.fx.nodes().patch("k-tainted", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&taint)).await?;
    s.fx.create_scheduler("idle-tainted", spec_on(IMAGE, &[("pool", "tainted")])).await?;
    s.fx.wait_scheduler("idle-tainted", "its status written", |sch| {
        sch.status.as_ref().is_some_and(|st| st.observed_generation.is_some() && st.rollout.is_some())
    })
    .await?;
    s.fx.mark_pods_ready(&s.name).await?;
    s.fx.wait_scheduler(&s.name, "attached and complete", |sch| {
        has_condition(sch, "KernelAttached", "True", "KernelAttached")
            && has_condition(sch, "Ready", "True", "DaemonSetReady")
            && sch.status.as_ref().and_then(|st| st.rollout.as_ref()).is_some_and(|r| r.current_revision.is_some())
    })
    .await?;

    // And a younger one on the same nodes: it owns none of them, so it has no DaemonSet.
    s.fx.create_scheduler("zz-outranked", spec_on(IMAGE, &[("pool", "k")])).await?;
    s.fx.wait_scheduler("zz-outranked", "its status written", |sch| {
        sch.status.as_ref().is_some_and(|st| st.observed_generation.is_some())
    })
    .await?;
    // Events are published right after the status they describe: the last two are in too.
    s.fx.wait_event(&s.name, "Normal", "DaemonSetReady", 1).await?;
    s.fx.wait_event("zz-outranked", "Warning", "SchedulerConflict", 1).await?;

    // Idle: the agents keep reporting (a heartbeat a second each) and nothing changes.
    let writes = s.fx.apiserver_writes()?;
    let checks = s.fx.metric_total("sked_image_verifications_total").await?;
    let reconciles = s.fx.metric_total("sked_reconciles_total").await?;
    let heard = s.fx.report_stats.reports.get();
    wait_for("a dozen more heartbeats", || async { Ok((s.fx.report_stats.reports.get() >= heard + 12).then_some(())) })
        .await?;
    assert_eq!(s.fx.apiserver_writes()?, writes, "no write while idle");
    assert_eq!(s.fx.metric_total("sked_image_verifications_total").await?, checks, "no image check while idle");
    assert_eq!(
        s.fx.metric_total("sked_reconciles_total").await?,
        reconciles,
        "no reconcile while idle (the tainted one neither)"
    );
    // However long the window: no Scheduler at rest waits on a timer either.
    assert_eq!(
        s.fx.metric_total("sked_timed_rechecks_pending").await?,
        0,
        "no Scheduler to reconcile again on a timer"
    );

    // Reconciled again (as a tag recheck does), the Scheduler without a DaemonSet deletes none:
    // there is nothing to delete, so nothing is written.
    let poke = serde_json::json!({"metadata": {"annotations": {"test.sked/poke": "1"}}});
    s.fx.schedulers()
        .patch("zz-outranked", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&poke))
        .await?;
    wait_for("zz-outranked reconciled again", || async {
        Ok((s.fx.metric_total("sked_reconciles_total").await? > reconciles).then_some(()))
    })
    .await?;
    let poked = s.fx.apiserver_writes()?;
    let daemonset_writes = |w: &std::collections::BTreeMap<(String, String, String), u64>| -> u64 {
        w.iter().filter(|((resource, _, _), _)| resource == "daemonsets").map(|(_, n)| n).sum()
    };
    assert_eq!(daemonset_writes(&poked), daemonset_writes(&writes), "no DaemonSet write for a Scheduler without one");

    // A kernel report that changes something changes the Scheduler's status, its events and
    // the node's pod condition (once detached, once back), and nothing else.
    let k1_condition = || async {
        let pods: kube::Api<Pod> = kube::Api::namespaced(s.fx.client.clone(), &s.fx.namespace);
        let list = pods.list(&kube::api::ListParams::default().labels(&format!("name={}", s.name))).await?;
        let pod = list.items.into_iter().find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("k-1"));
        let conditions = pod.and_then(|p| p.status).and_then(|s| s.conditions).unwrap_or_default();
        let c = conditions.into_iter().find(|c| c.type_ == "sked.schedkit.io/KernelAttached");
        Ok::<_, anyhow::Error>(c.and_then(|c| c.reason))
    };
    a1.set_kernel("disabled", None, 1)?;
    s.wait_kernel("k-1 detached", 1, "NotAttached").await?;
    wait_for("k-1's pod says not attached", || async {
        Ok((k1_condition().await?.as_deref() == Some("NotAttached")).then_some(()))
    })
    .await?;
    a1.set_kernel("enabled", Some("rusty_1.0.0_x86_64_unknown_linux_gnu"), 2)?;
    s.wait_kernel("k-1 back", 2, "KernelAttached").await?;
    wait_for("k-1's pod says attached", || async {
        Ok((k1_condition().await?.as_deref() == Some("KernelAttached")).then_some(()))
    })
    .await?;
    let after = s.fx.apiserver_writes()?;
    let changed: Vec<_> = after.iter().filter(|(k, v)| poked.get(*k) != Some(*v)).map(|(k, _)| k.clone()).collect();
    assert!(
        changed.iter().all(|(resource, subresource, _)| {
            (["schedulers", "pods"].contains(&resource.as_str()) && subresource == "status") || resource == "events"
        }),
        "only the Scheduler's status, its events and the pod's condition were written: {changed:?}"
    );
    let pod_status = |w: &std::collections::BTreeMap<(String, String, String), u64>| -> u64 {
        w.iter().filter(|((r, sub, _), _)| r == "pods" && sub == "status").map(|(_, n)| n).sum()
    };
    assert_eq!(pod_status(&after) - pod_status(&poked), 2, "the pod's condition, once each way");
    assert_eq!(
        s.fx.metric_total("sked_image_verifications_total").await?,
        checks,
        "no image check for a kernel report"
    );
    Ok(())
}

#[tokio::test]
async fn a_node_without_sched_ext_is_labelled_and_left_out_until_its_kernel_changes() -> Result<()> {
    use kube::api::{Patch, PatchParams};
    let s = setup("nosupport").await?;
    let nodes = s.fx.nodes();
    let kernel = |version: &str| serde_json::json!({"status": {"nodeInfo": {"kernelVersion": version}}});
    nodes.patch_status("k-2", &PatchParams::default(), &Patch::Merge(&kernel("6.1.0-28-cloud-amd64"))).await?;
    let a1 = s.agent("k-1").await?;
    let mut a2 = s.agent("k-2").await?;
    a1.set_kernel("enabled", Some("rusty_1.0.0"), 1)?;
    // k-2's kernel has no sched_ext at all.
    std::fs::remove_dir_all(a2.sysfs.join("kernel/sched_ext"))?;

    let label = |node: &str, key: &'static str| {
        let nodes = nodes.clone();
        let node = node.to_owned();
        async move { Ok::<_, anyhow::Error>(nodes.get(&node).await?.labels().get(key).cloned()) }
    };
    wait_for("k-1 labelled supported, k-2 unsupported", || async {
        let k1 = label("k-1", "sked.schedkit.io/sched-ext").await?;
        let k2 = label("k-2", "sked.schedkit.io/sched-ext").await?;
        Ok((k1.as_deref() == Some("supported") && k2.as_deref() == Some("unsupported")).then_some(()))
    })
    .await?;
    assert_eq!(label("k-2", "sked.schedkit.io/sched-ext-kernel").await?.as_deref(), Some("6.1.0-28-cloud-amd64"));
    // k-2 leaves placement: no owner label, and the status says why.
    wait_for("k-2's owner label removed", || async {
        Ok(label("k-2", "sked.schedkit.io/scheduler").await?.is_none().then_some(()))
    })
    .await?;
    let sched =
        s.fx.wait_scheduler(&s.name, "k-2 counted as unsupported", |s| {
            s.status.as_ref().is_some_and(|st| st.unsupported_nodes == 1 && st.desired_number_scheduled == 1)
        })
        .await?;
    let msg = &condition(&sched, "KernelAttached").context("condition")?.message;
    assert!(msg.contains("1 selected node(s) have no sched_ext") && msg.contains("k-2"), "{msg}");
    assert_eq!(label("k-1", "sked.schedkit.io/scheduler").await?.as_deref(), Some("nosupport"));

    // Its pod and agent go; the node boots another kernel: it is judged again.
    a2.stop();
    nodes.patch_status("k-2", &PatchParams::default(), &Patch::Merge(&kernel("6.12.9-cloud-amd64"))).await?;
    wait_for("k-2 back in placement", || async {
        let owner = label("k-2", "sked.schedkit.io/scheduler").await?;
        let support = label("k-2", "sked.schedkit.io/sched-ext").await?;
        Ok((owner.as_deref() == Some("nosupport") && support.is_none()).then_some(()))
    })
    .await?;
    s.fx.wait_scheduler(&s.name, "no unsupported node left", |s| {
        s.status.as_ref().is_some_and(|st| st.unsupported_nodes == 0)
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn an_ejection_reaches_the_status_and_is_recorded_once_across_a_failover() -> Result<()> {
    let mut s = setup("ejected").await?;
    let (a1, a2, _) = s.both_attached().await?;

    // k-2's kernel throws the scheduler out for a stall, and says why in its log.
    a2.kernel_logs("3,374,5425810,-;sched_ext: BPF scheduler \"rusty_1.0.0\" disabled (runnable task stall)")?;
    a2.kernel_logs("3,375,5427884,-;sched_ext: rusty_1.0.0: kworker/1:2[91] failed to run for 31.004s")?;
    a2.set_kernel("disabled", None, 1)?;
    let sched =
        s.fx.wait_scheduler(&s.name, "the ejection in the status", |s| {
            s.status.as_ref().and_then(|st| st.last_exit.as_ref()).is_some_and(|e| !e.detail.is_empty())
        })
        .await?;
    let exit = sched.status.as_ref().and_then(|st| st.last_exit.clone()).context("lastExit")?;
    assert_eq!(
        (exit.node.as_str(), exit.ops.as_str(), exit.reason.as_str()),
        ("k-2", "rusty_1.0.0", "runnable task stall")
    );
    assert_eq!(exit.detail, "kworker/1:2[91] failed to run for 31.004s");
    assert!(exit.ejected);
    let sched = s.wait_kernel("k-2 not attached", 1, "NotAttached").await?;
    let msg = &condition(&sched, "KernelAttached").context("condition")?.message;
    assert!(msg.contains("k-2: no sched_ext scheduler is enabled; the kernel ejected rusty_1.0.0"), "{msg}");
    s.fx.wait_event(&s.name, "Warning", "KernelEjected", 1).await?;
    let (_, metrics) = a2.get("/metrics")?;
    assert!(metrics.contains("sked_agent_sched_ext_exits_total{reason=\"runnable task stall\"} 1"), "{metrics}");

    // A new leader hears the same exit from k-2's agent, and records nothing again.
    let port: u16 = s.controller.rsplit(':').next().and_then(|p| p.parse().ok()).context("reports port")?;
    s.fx.stop_controller().await?;
    let flags = ControllerFlags {
        reports_bind_address: ([127, 0, 0, 1], port).into(),
        reports_cert_file: Some(s.tls.cert.clone()),
        reports_key_file: Some(s.tls.key.clone()),
        report_stale_after: STALE_AFTER,
        ..ControllerFlags::default()
    };
    s.fx.start_controller(flags)?;
    wait_for("both agents heard by the new leader", || async {
        let heard = s.fx.metric_total("sked_reports_received_total").await?;
        let k2 = a2.get("/metrics")?.1.lines().any(|l| l == "sked_agent_report_stream_connected 1");
        Ok((k2 && heard >= 6).then_some(()))
    })
    .await?;
    // Two reconciles that read k-2's exit from the new leader's table (reconciles of one
    // Scheduler run one at a time: once the second wrote, the first recorded its events).
    a1.set_kernel("disabled", None, 1)?;
    s.wait_kernel("k-1 detached", 0, "NotAttached").await?;
    a1.set_kernel("enabled", Some("rusty_1.0.0"), 2)?;
    s.wait_kernel("k-1 attached again", 1, "NotAttached").await?;
    let events = s.fx.scheduler_events(&s.name).await?;
    assert_eq!(events.get(&("Warning".to_owned(), "KernelEjected".to_owned())), Some(&1), "{events:?}");

    // The next ejection is news for the new leader.
    a2.set_kernel("enabled", Some("rusty_1.0.0"), 2)?;
    s.wait_kernel("k-2 attached again", 2, "KernelAttached").await?;
    a2.kernel_logs("6,385,6913881,-;sched_ext: BPF scheduler \"rusty_1.0.0\" disabled (disabled by sysrq-S)")?;
    a2.set_kernel("disabled", None, 2)?;
    s.fx.wait_event(&s.name, "Warning", "KernelEjected", 2).await?;
    drop(a1);
    Ok(())
}

/// A Scheduler deleted and made again under the same name reads none of its predecessor's
/// reports: KernelAttached counts reports of its own pods (by UID) alone, while the old pods'
/// agents still report attached under the same Scheduler name.
#[tokio::test]
async fn a_scheduler_made_again_under_the_same_name_reads_none_of_the_old_ones_reports() -> Result<()> {
    let s = setup("again").await?;
    let (_old1, _old2, sched) = s.both_attached().await?;
    let old_uid = sched.uid().context("the first Scheduler's UID")?;
    // The new pods are made in a later second than the old ones (creation times have seconds),
    // so the old pods' agents, still reporting while their pods go, yield to the new ones.
    let made = s.pods.values().filter_map(|p| p.metadata.creation_timestamp.as_ref()).map(|t| t.0.as_second()).max();
    wait_for("a second later than the first pods' creation", || async move {
        Ok((jiff::Timestamp::now().as_second() > made.unwrap_or(0)).then_some(()))
    })
    .await?;
    s.fx.schedulers().delete(&s.name, &Default::default()).await?;
    s.fx.wait_daemonset_gone(&s.name).await?;
    let spec = SchedulerSpec { expected_ops: Some("rusty".into()), ..spec_on(IMAGE, &[("pool", "k")]) };
    s.fx.create_scheduler(&s.name, spec).await?;
    // The new Scheduler's pods are there and its status counted them, while the old agents
    // (their pods terminating) still say "attached" for Scheduler "again".
    let pods = sked_tests::wait_bound_pods(&s.fx.client, &s.fx.namespace, &s.name, 2).await?;
    let sched =
        s.fx.wait_scheduler(&s.name, "the new Scheduler's kernel view", |sc| {
            // Once its status counts both pods (the first one may be written before the pod
            // watch showed them).
            sc.uid().is_some_and(|u| u != old_uid)
                && sc.status.as_ref().is_some_and(|st| st.desired_number_scheduled == 2)
                && condition(sc, "KernelAttached").is_some_and(|c| c.message.contains("of 2 scheduled nodes"))
        })
        .await?;
    let status = sched.status.as_ref().context("status")?;
    let message = condition(&sched, "KernelAttached").map(|c| c.message.clone()).unwrap_or_default();
    assert_eq!(status.kernel_attached, 0, "the old pods' reports count for nobody: {message}");
    assert!(message.contains("no report yet"), "{message}");
    // The new pods' agents report: counted.
    let renewed = Setup { pods, ..s };
    let a1 = renewed.agent("k-1").await?;
    let a2 = renewed.agent("k-2").await?;
    a1.set_kernel("enabled", Some("rusty_1.0.0"), 1)?;
    a2.set_kernel("enabled", Some("rusty_1.0.0"), 1)?;
    renewed.wait_kernel("the new pods' agents attached", 2, "KernelAttached").await?;
    Ok(())
}
