//! Two `sked-controller` processes against the test cluster: one leads, the other stands by;
//! killing the leader hands reconciling to the standby, and only the leader ever writes. Each
//! process authenticates as a user of its own (its name), so the API server's audit log says who
//! wrote what, and when. The processes log JSON, which the test parses (field names and the
//! reconcile identity). Both serve the admission webhook: the standby answers the API server too.

use std::time::Instant;

use anyhow::Result;
use kube::Api;
use sked_tests::agents::{AgentProcess, AgentSpec, ReportsTls, bound_token};
use sked_tests::cluster::free_port;
use sked_tests::controller_process::{ControllerProcess, webhook_cert};
use sked_tests::{Fixture, spec, spec_on, wait_for};

async fn holder(fx: &Fixture) -> Result<Option<String>> {
    sked_tests::controller_process::holder(&fx.client, "sked-system").await
}

#[tokio::test]
async fn the_standby_takes_over_when_the_leader_dies_and_only_the_leader_writes() -> Result<()> {
    let fx = Fixture::without_controller().await?;
    let dir = tempfile::tempdir()?;
    // One serving certificate for both replicas' webhooks.
    let ca = webhook_cert(dir.path())?;

    let first = ControllerProcess::start(fx.cluster, dir.path(), "controller-a", &[])?;
    wait_for("controller-a to hold the lease", || async {
        Ok(holder(&fx).await?.filter(|h| h.starts_with("controller-a")))
    })
    .await?;
    let mut first = first;
    let second = ControllerProcess::start(fx.cluster, dir.path(), "controller-b", &[])?;

    fx.create_scheduler("led-by-a", spec("ghcr.io/schedkit/scx_rusty:v1")).await?;
    fx.wait_scheduler("led-by-a", "reconciled", |s| s.status.is_some()).await?;
    wait_for("controller-b to have started", || async {
        Ok(second.lines()?.iter().any(|l| l["msg"] == "campaigning for leadership").then_some(()))
    })
    .await?;

    // The standby serves the webhook too: the API server, pointed at controller-b alone, gets
    // an invalid spec refused.
    let url = format!("https://{}{}", second.webhook, sked_controller::webhook::VALIDATE_PATH);
    sked_tests::register_validating_webhook(&fx.client, "sked-leader-test", &url, ca.cert_pem().as_bytes().to_vec())
        .await?;
    let invalid = "apiVersion: sked.schedkit.io/v1\nkind: Scheduler\nmetadata:\n  name: twice\nspec:\n  sched: r.io/a:v1\n  env:\n  - {name: A, value: \"1\"}\n  - {name: A, value: \"2\"}\n";
    wait_for("the standby's webhook to refuse an invalid spec", || async {
        let out = fx.kubectl_apply(invalid)?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() && stderr.contains("is set twice") {
            return Ok(Some(()));
        }
        Err(anyhow::anyhow!(
            "kubectl apply: {stderr}; controller-b log: {}",
            std::fs::read_to_string(&second.log)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains("webhook"))
                .collect::<Vec<_>>()
                .join("\n")
        ))
    })
    .await?;
    sked_tests::delete_validating_webhook(&fx.client, "sked-leader-test").await?;
    wait_for("the webhook to be gone", || async {
        let out = fx.kubectl_apply(
            &invalid.replace("name: twice", "name: probe").replace("  - {name: A, value: \"2\"}\n", ""),
        )?;
        Ok(out.status.success().then_some(()))
    })
    .await?;
    fx.schedulers().delete("probe", &Default::default()).await?;

    // Kill the leader without letting it release the lease.
    first.child.kill()?;
    let _ = first.child.wait();
    let killed = Instant::now();
    let killed_at = jiff::Timestamp::now();

    fx.create_scheduler("led-by-b", spec("ghcr.io/schedkit/scx_rusty:v1")).await?;
    fx.wait_scheduler("led-by-b", "reconciled by the new leader", |s| s.status.is_some()).await?;
    eprintln!("measured: leader killed -> new Scheduler reconciled by the standby: {:?}", killed.elapsed());
    assert!(holder(&fx).await?.is_some_and(|h| h.starts_with("controller-b")));
    let metrics = second.scrape()?;
    assert!(metrics.lines().any(|l| l == "sked_leader 1"), "{metrics}");
    assert!(metrics.contains("sked_reconciles_total{result=\"success\"}"), "{metrics}");
    assert!(metrics.contains("sked_reconcile_duration_seconds_bucket"), "{metrics}");

    // Only the leader of the moment wrote, as the API server's audit log counts writes by
    // client: controller-b nothing at all while controller-a lived (not even the Lease), and
    // each the objects of the Scheduler made while it led.
    let (a, b) = (fx.writes_by("controller-a")?, fx.writes_by("controller-b")?);
    let kinds = |writes: &[sked_tests::cluster::AuditedWrite]| -> Vec<String> {
        writes.iter().map(|w| format!("{} {}", w.kind(), w.name)).collect()
    };
    let b_early: Vec<_> = b.iter().filter(|w| w.received < killed_at).cloned().collect();
    assert!(b_early.is_empty(), "the standby wrote while controller-a led: {:?}", kinds(&b_early));
    let a_late: Vec<_> = a.iter().filter(|w| w.received >= killed_at).cloned().collect();
    assert!(a_late.is_empty(), "controller-a wrote after it was killed: {:?}", kinds(&a_late));
    let made = |writes: &[sked_tests::cluster::AuditedWrite], name: &str| {
        writes.iter().any(|w| w.kind() == "daemonsets patch" && w.name == name)
    };
    assert!(made(&a, "led-by-a") && !made(&a, "led-by-b"), "{:?}", kinds(&a));
    let mut a_schedulers = a.iter().filter(|w| ["daemonsets", "schedulers"].contains(&w.resource.as_str()));
    assert!(a_schedulers.all(|w| w.name == "led-by-a" || w.name == "probe"), "{:?}", kinds(&a));
    assert!(made(&b, "led-by-b") && !made(&b, "led-by-a"), "{:?}", kinds(&b));
    let b_lines = second.lines()?;

    // The log contract: every line has time, level, msg, logger; reconcile lines carry the
    // controller, the Scheduler and a reconcileID; no-op reconciles stay below info.
    for line in first.lines()?.iter().chain(b_lines.iter()) {
        for field in ["time", "level", "msg", "logger"] {
            assert!(line.get(field).is_some(), "missing {field} in {line}");
        }
        assert!(line["time"].as_str().is_some_and(|t| t.parse::<jiff::Timestamp>().is_ok()), "{line}");
        assert!(["INFO", "WARN", "ERROR"].contains(&line["level"].as_str().unwrap_or_default()), "{line}");
        assert_ne!(line["msg"], "reconciled; nothing changed", "no-op reconciles log below info");
    }
    for line in second.write_lines()? {
        assert_eq!(line["controller"], "scheduler", "{line}");
        assert!(line["reconcileID"].as_str().is_some_and(|id| !id.is_empty()), "{line}");
        assert!(line["logger"].as_str().is_some_and(|l| l.contains('/')), "slash-separated logger: {line}");
    }
    drop(second);
    Ok(())
}

/// Writes a webhook serving certificate into `dir/webhook` (replicas share it); returns its CA.
/// A Scheduler's conditions as they read: type, status, reason, message, last transition.
fn conditions(s: &sked_controller::Scheduler) -> Vec<(String, String, String, String, String)> {
    let conditions = s.status.as_ref().map(|st| st.conditions.clone()).unwrap_or_default();
    conditions
        .into_iter()
        .map(|c| (c.type_, c.status, c.reason, c.message, format!("{:?}", c.last_transition_time)))
        .collect()
}

#[tokio::test]
async fn killing_the_leader_with_every_node_attached_changes_no_condition_and_records_no_event() -> Result<()> {
    let fx = Fixture::without_controller().await?;
    let dir = tempfile::tempdir()?;
    webhook_cert(dir.path())?;
    let tls = ReportsTls::generate(dir.path())?;
    let (port_a, port_b) = (free_port()?, free_port()?);
    let flags = |port: u16| {
        vec![
            format!("--reports-bind-address=127.0.0.1:{port}"),
            format!("--reports-cert-file={}", tls.cert.display()),
            format!("--reports-key-file={}", tls.key.display()),
            "--agent-heartbeat-interval=1s".to_owned(),
            "--report-stale-after=20s".to_owned(),
        ]
    };
    let mut first = ControllerProcess::start(fx.cluster, dir.path(), "steady-a", &flags(port_a))?;
    wait_for("steady-a to hold the lease", || async { Ok(holder(&fx).await?.filter(|h| h.starts_with("steady-a"))) })
        .await?;
    let second = ControllerProcess::start(fx.cluster, dir.path(), "steady-b", &flags(port_b))?;
    // Each agent holds a stream to both replicas, as the chart's headless Service lists them.
    let replicas = format!("127.0.0.1:{port_a},127.0.0.1:{port_b}");

    let nodes = ["k-1", "k-2", "k-3"];
    for node in nodes {
        fx.create_node(node, &[("pool", "k")]).await?;
    }
    fx.create_scheduler("kept", spec_on("ghcr.io/schedkit/scx_rusty:v1", &[("pool", "k")])).await?;
    let pods = sked_tests::wait_bound_pods(&fx.client, &fx.namespace, "kept", nodes.len()).await?;
    let endpoint = format!("https://localhost:{port_a}");
    let mut agents = Vec::new();
    for (node, pod) in &pods {
        AgentProcess::preset_kernel(dir.path(), node, "enabled", Some("rusty"), 1)?;
        let reports = sked_tests::agents::ReportsEndpoint {
            address: &endpoint,
            ca: &tls.ca,
            server_name: None,
            replicas: Some(&replicas),
        };
        agents.push(AgentProcess::for_pod(&fx.client, &fx.namespace, dir.path(), pod, "kept", &reports).await?);
    }
    // The pods run, and each says the kernel runs its scheduler before the leader goes (a
    // condition the new leader would otherwise write).
    let pod_api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(fx.client.clone(), &fx.namespace);
    for pod in pods.values() {
        sked_tests::kubelet::set_pod_ready(&pod_api, &kube::ResourceExt::name_any(pod), true).await?;
    }
    let attached = |s: &sked_controller::Scheduler| {
        sked_tests::has_condition(s, "KernelAttached", "True", "KernelAttached")
            && s.status.as_ref().is_some_and(|st| st.kernel_attached == 3)
            && sked_tests::has_condition(s, "Ready", "True", "DaemonSetReady")
    };
    let before = fx.wait_scheduler("kept", "every node attached and Ready", attached).await?;
    let conditions_before = conditions(&before);
    let events_before = fx.scheduler_events("kept").await?;
    let uids = |pods: &std::collections::BTreeMap<String, k8s_openapi::api::core::v1::Pod>| -> Vec<(String, String)> {
        pods.iter().map(|(node, p)| (node.clone(), kube::ResourceExt::uid(p).unwrap_or_default())).collect()
    };
    let pods_before = uids(&pods);
    wait_for("each pod's KernelAttached condition", || async {
        let pods = sked_tests::wait_bound_pods(&fx.client, &fx.namespace, "kept", nodes.len()).await?;
        let written = pods.values().all(|p| {
            let conditions = p.status.as_ref().and_then(|s| s.conditions.as_ref());
            conditions.is_some_and(|cs| cs.iter().any(|c| c.type_ == "sked.schedkit.io/KernelAttached"))
        });
        Ok(written.then_some(()))
    })
    .await?;

    // The standby hears every agent too, and writes nothing while steady-a leads: a change both
    // replicas see (an annotation poke) is reconciled by steady-a alone.
    let reconciles = |c: &ControllerProcess| -> Result<f64> {
        Ok(c.scrape()?
            .lines()
            .filter(|l| l.starts_with("sked_reconciles_total{"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum())
    };
    let metric = |c: &ControllerProcess, name: &str| -> Result<f64> {
        Ok(c.scrape()?.lines().filter_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok()).sum())
    };
    wait_for("every agent's stream to the standby", || async {
        Ok((metric(&second, "sked_agents_connected ")? >= 3.0).then_some(()))
    })
    .await?;
    poke_until_reconciled(&fx, "test.sked/standby-poke", "steady-a", || reconciles(&first)).await?;
    let standby_writes: Vec<String> = fx
        .writes_by("steady-b")?
        .iter()
        .filter(|w| w.changes_state() && w.resource != "leases")
        .map(|w| format!("{} {}/{}", w.kind(), w.namespace, w.name))
        .collect();
    assert!(standby_writes.is_empty(), "the standby wrote while steady-a led: {standby_writes:?}");

    // SIGKILL: the lease is left to run out, every agent's stream to steady-a breaks; their
    // streams to steady-b stay as they were.
    let accepted_before = metric(&second, "sked_report_streams_accepted_total ")?;
    first.child.kill()?;
    let _ = first.child.wait();
    let killed = Instant::now();
    let killed_at = jiff::Timestamp::now();
    wait_for("steady-b to lead", || async { Ok(holder(&fx).await?.filter(|h| h.starts_with("steady-b"))) }).await?;
    eprintln!("measured: leader killed -> steady-b holds the lease: {:?}", killed.elapsed());

    // Judged after the new leader's grace: a reconcile of the Scheduler that starts once the
    // grace is over (an annotation poke) sees every node reported.
    // The Lease names steady-b a moment before steady-b logs that it leads.
    let leading = wait_for("steady-b to say when it started leading", || async {
        Ok(second
            .lines()?
            .iter()
            .find(|l| l["msg"] == "leading: reconciling Schedulers")
            .and_then(|l| l["time"].as_str()?.parse::<jiff::Timestamp>().ok()))
    })
    .await?;
    let grace_over = leading + jiff::SignedDuration::from_secs(20);
    wait_for("steady-b's grace for the agents to be over", || async {
        Ok((jiff::Timestamp::now() > grace_over).then_some(()))
    })
    .await?;
    poke_until_reconciled(&fx, "test.sked/poke", "steady-b", || reconciles(&second)).await?;
    // Read once steady-b has led and reconciled past its grace: a leader that dropped the
    // streams it inherited would have accepted each agent's again by now.
    assert_eq!(
        metric(&second, "sked_report_streams_accepted_total ")?,
        accepted_before,
        "the new leader took over every agent's stream without one reconnecting"
    );
    assert!(metric(&second, "sked_agents_connected ")? >= 3.0, "every agent still reports to steady-b");

    let after = fx.schedulers().get("kept").await?;
    assert_eq!(conditions(&after), conditions_before, "no condition moved");
    assert_eq!(fx.scheduler_events("kept").await?, events_before, "no event recorded");
    // What the API server was asked to change by the new leader: its Lease, nothing else (no
    // status, DaemonSet, label, pod condition, pod deletion or event); the same pods run.
    let changes: Vec<String> = fx
        .writes_by("steady-b")?
        .iter()
        .filter(|w| w.received >= killed_at && w.changes_state() && w.resource != "leases")
        .map(|w| format!("{} {}/{}", w.kind(), w.namespace, w.name))
        .collect();
    assert!(changes.is_empty(), "the new leader changed: {changes:?}");
    let pods_after = sked_tests::wait_bound_pods(&fx.client, &fx.namespace, "kept", nodes.len()).await?;
    assert_eq!(uids(&pods_after), pods_before, "the same pods run");
    assert!(
        !second.write_lines()?.iter().any(|l| l["msg"] == "state changed"),
        "the new leader saw no change of state: {:?}",
        second.write_lines()?
    );
    drop(agents);
    Ok(())
}

#[tokio::test]
async fn sigterm_releases_the_lease_at_once_and_exits_with_streams_open() -> Result<()> {
    let fx = Fixture::without_controller().await?;
    let dir = tempfile::tempdir()?;
    webhook_cert(dir.path())?;
    let tls = ReportsTls::generate(dir.path())?;
    let reports_port = free_port()?;
    // A lease far longer than the test's deadline: its holder can only be cleared in time if the
    // leader releases it.
    let reports = |port: u16| {
        vec![
            "--leader-election-lease-duration=600s".to_owned(),
            "--leader-election-renew-grace=5s".to_owned(),
            format!("--reports-bind-address=127.0.0.1:{port}"),
            format!("--reports-cert-file={}", tls.cert.display()),
            format!("--reports-key-file={}", tls.key.display()),
        ]
    };
    let mut first = ControllerProcess::start(fx.cluster, dir.path(), "handoff-a", &reports(reports_port))?;
    wait_for("handoff-a to hold the lease", || async { Ok(holder(&fx).await?.filter(|h| h.starts_with("handoff-a"))) })
        .await?;
    // An agent streams to the leader.
    fx.create_node("h-1", &[("pool", "h")]).await?;
    fx.create_scheduler("handed", spec_on("ghcr.io/schedkit/scx_rusty:v1", &[("pool", "h")])).await?;
    let pods = sked_tests::wait_bound_pods(&fx.client, &fx.namespace, "handed", 1).await?;
    let pod = &pods["h-1"];
    let token = bound_token(&fx.client, &fx.namespace, "sked-agent", Some(pod)).await?;
    let agent = AgentProcess::start(&AgentSpec {
        dir: dir.path(),
        node: "h-1",
        pod: &kube::ResourceExt::name_any(pod),
        scheduler: "handed",
        expected_ops: Some("rusty"),
        controller: &format!("https://localhost:{reports_port}"),
        ca: &tls.ca,
        server_name: None,
        replicas: None,
        token: &token,
    })?;
    wait_for("the agent's stream to be open", || async {
        let (_, body) = agent.get("/metrics")?;
        Ok(body.lines().any(|l| l == "sked_agent_report_stream_connected 1").then_some(()))
    })
    .await?;

    // SIGTERM: the lease is released (not left to expire) and the process exits cleanly.
    let signalled = Instant::now();
    let pid = libc::pid_t::try_from(first.child.id())?;
    // SAFETY: sending a signal to a child process this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    wait_for("the lease's holder to be cleared", || async { Ok(holder(&fx).await?.is_none().then_some(())) }).await?;
    eprintln!("measured: SIGTERM -> lease holder cleared: {:?}", signalled.elapsed());
    let status = wait_for("handoff-a to exit", || {
        let status = first.child.try_wait();
        async move { Ok(status?) }
    })
    .await?;
    eprintln!("measured: SIGTERM -> leader exited: {:?}", signalled.elapsed());
    assert!(status.success(), "exit status {status}");
    let released = first.lines()?.iter().any(|l| l["msg"] == "released the leader lease");
    assert!(released, "the leader says it released the lease");
    drop(agent);
    Ok(())
}

#[tokio::test]
async fn a_server_that_cannot_start_stops_the_process_with_the_flag_to_change() -> Result<()> {
    let fx = Fixture::without_controller().await?;
    let dir = tempfile::tempdir()?;
    webhook_cert(dir.path())?;
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = taken.local_addr()?.port();
    let tls = ReportsTls::generate(dir.path())?;
    for (flag, extra) in [
        ("--metrics-bind-address", vec![format!("--metrics-bind-address=127.0.0.1:{port}")]),
        ("--webhook-bind-address", vec![format!("--webhook-bind-address=127.0.0.1:{port}")]),
        // Started only once leading: the process must stop all the same.
        (
            "--reports-bind-address",
            vec![
                format!("--reports-bind-address=127.0.0.1:{port}"),
                format!("--reports-cert-file={}", tls.cert.display()),
                format!("--reports-key-file={}", tls.key.display()),
            ],
        ),
    ] {
        let mut controller = ControllerProcess::start(fx.cluster, dir.path(), "blocked", &extra)?;
        let status = wait_for(&format!("the controller with a taken {flag} to exit"), || {
            let status = controller.child.try_wait();
            async move { Ok(status?) }
        })
        .await?;
        assert!(!status.success(), "{flag}: a failed server is a failed process");
        let log = std::fs::read_to_string(&controller.log)?;
        assert!(
            log.contains(flag) && log.contains("Address already in use"),
            "{flag}: the error names the flag: {log}"
        );
    }
    drop(taken);
    Ok(())
}

/// Annotates Scheduler `kept` with `key` (a change every replica sees) and waits until
/// `reconciles` (a replica's reconcile count) moves past where it stood.
async fn poke_until_reconciled(
    fx: &Fixture,
    key: &str,
    replica: &str,
    reconciles: impl Fn() -> Result<f64>,
) -> Result<()> {
    let before = reconciles()?;
    let poke = serde_json::json!({"metadata": {"annotations": {key: "1"}}});
    fx.schedulers().patch("kept", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&poke)).await?;
    wait_for(&format!("{replica} to reconcile the poked Scheduler"), || async {
        Ok((reconciles()? > before).then_some(()))
    })
    .await
}

#[tokio::test]
async fn a_failed_reconcile_is_logged_in_its_span_and_a_text_log_to_a_file_has_no_colour() -> Result<()> {
    let fx = Fixture::without_controller().await?;
    let dir = tempfile::tempdir()?;
    webhook_cert(dir.path())?;
    // Every reconcile outlives a timeout of 1 ms: each fails, and says so. (The reference's
    // largest verbosity is taken.)
    let failing = ControllerProcess::start(
        fx.cluster,
        dir.path(),
        "log-contract",
        &[
            "--leader-election-id=log-contract".to_owned(),
            "--reconcile-timeout=1ms".to_owned(),
            "--log-verbosity=2147483647".to_owned(),
        ],
    )?;
    fx.create_scheduler("fails-to-reconcile", spec("ghcr.io/schedkit/scx_rusty:v1")).await?;
    let line = wait_for("a \"reconcile failed\" line", || async {
        Ok(failing
            .lines()?
            .into_iter()
            .find(|l| l["msg"] == "reconcile failed" && l["scheduler"] == "fails-to-reconcile"))
    })
    .await?;
    assert_eq!(line["level"], "ERROR", "{line}");
    assert_eq!(line["controller"], "scheduler", "in the reconcile's span: {line}");
    assert!(line["reconcileID"].as_str().is_some_and(|id| !id.is_empty()), "in the reconcile's span: {line}");
    assert_eq!(line["error_kind"], "timeout", "{line}");
    assert!(line["err"].as_str().is_some_and(|e| e.contains("fails-to-reconcile")), "the error names it: {line}");
    assert!(line["logger"].as_str().is_some_and(|l| l.starts_with("sked-controller/")), "{line}");
    drop(failing);

    // Text to a file (not a terminal): no ANSI escape codes.
    let text = ControllerProcess::start(
        fx.cluster,
        dir.path(),
        "log-text",
        &["--leader-election-id=log-text".to_owned(), "--log-format=text".to_owned()],
    )?;
    let log = wait_for("the text log's leading line", || async {
        let log = std::fs::read_to_string(&text.log)?;
        Ok(log.contains("leading").then_some(log))
    })
    .await?;
    assert!(!log.contains('\u{1b}'), "a text log written to a file carries no colour codes: {log:?}");
    Ok(())
}
