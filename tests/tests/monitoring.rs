//! The chart's monitoring: its alerting rules pass `promtool check rules` and their unit tests
//! (`promtool test rules`), the Grafana dashboard is valid JSON whose every query is valid PromQL,
//! and every metric the rules and the dashboard name is one the binaries export.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, Result, bail};
use sked_tests::cluster::{tools_dir, workspace_root};
use sked_tests::run_command as run;

fn helm_template(home: &Path, args: &[&str]) -> Result<String> {
    let chart = workspace_root().join("charts/sked");
    run(Command::new(tools_dir().join("helm"))
        .args(["template", "sked"])
        .arg(&chart)
        .args(["--namespace", "sked-system", "--show-only", "templates/monitoring.yaml"])
        .args(args)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data")))
}

fn promtool(args: &[&str]) -> Result<String> {
    run(Command::new(tools_dir().join("promtool")).args(args))
}

/// The `spec` of the rendered PrometheusRule: a rules file as promtool reads it.
fn rules_file(rendered: &str) -> Result<String> {
    let doc = rendered.split("\n---").find(|d| d.contains("kind: PrometheusRule")).context("a PrometheusRule")?;
    let (_, spec) = doc.split_once("\nspec:\n").context("its spec")?;
    Ok(spec.lines().map(|l| l.strip_prefix("  ").unwrap_or(l)).collect::<Vec<_>>().join("\n") + "\n")
}

/// Every family name the agent and the controller export (from their own registries, with a
/// sample in each labelled family).
fn exported_metrics() -> BTreeSet<String> {
    use sked_agent::sysfs::{KernelRead, SchedState};
    let agent = sked_agent::metrics::Metrics::new();
    agent.exits_known(&sked_agent::kmsg::KNOWN_REASONS);
    agent.observe(&sked_agent::observation::Observation {
        read: KernelRead {
            supported: true,
            state: SchedState::Enabled,
            ops: Some("lavd".into()),
            enable_seq: Some(1),
            switch_all: Some(true),
            nr_rejected: Some(0),
            hotplug_seq: Some(0),
            events: [("SCX_EV_SELECT_CPU_FALLBACK".to_owned(), 1)].into(),
            problems: Vec::new(),
        },
        verdict: sked_proto::Verdict::Attached,
        reason: String::new(),
        last_exit: None,
        cgroup_ops: Some(Ok(sked_agent::cgroup_ops::CgroupOps {
            limits: sked_agent::cgroup_ops::Support::Missing,
            requests: sked_agent::cgroup_ops::Support::Implemented,
        })),
    });
    agent.pods_sampled(3, 1, 1);
    agent.scx_stats_failure("timeout");
    let stats = std::sync::Arc::new(sked_controller::metrics::ReportStats::default());
    stats.refused("wrong_node");
    let controller = sked_controller::metrics::Metrics::new(stats);
    controller.reconciled(std::time::Duration::ZERO, Some("api"));
    controller.verified("reconcile", "verified");
    controller.policy_reloaded(true);
    controller.set_conflicting_nodes("s", 1);
    controller.rolled_back("s");
    [agent.encode(), controller.encode()]
        .iter()
        .flat_map(|text| {
            sked_logging::exposition::to_classic_text(text)
                .lines()
                .filter_map(|l| l.strip_prefix("# TYPE ")?.split_whitespace().next().map(str::to_owned))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The `sked_` metric names an expression reads.
fn metrics_in(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find("sked_") {
        let tail = &rest[at..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        names.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

#[test]
fn the_alerts_and_the_dashboard_check_with_promtool() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let tls = ["--set", "reports.tls.issuerRef.name=ca", "--set-string", "reports.tls.caBundle=x"];
    // Off, the template renders nothing, which `--show-only` reports as not found; any other
    // failure (a template that does not render, no helm) is not "off".
    match helm_template(dir.path(), &tls) {
        Ok(rendered) => assert!(rendered.trim().is_empty(), "monitoring is off by default: {rendered}"),
        Err(e) => {
            let said = format!("{e:#}");
            assert!(said.contains("could not find template templates/monitoring.yaml"), "{said}");
        }
    }

    let mut on = tls.to_vec();
    on.extend(["--set", "metrics.prometheusRule.enabled=true", "--set", "metrics.dashboard.enabled=true"]);
    on.extend(["--set", "metrics.podMonitor.enabled=true"]);
    let rendered = helm_template(dir.path(), &on)?;
    assert!(rendered.contains("kind: PodMonitor") && rendered.contains("targetLabel: scheduler"), "{rendered}");

    // The rules: valid, and their alerts fire when and only when they should.
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, rules_file(&rendered)?)?;
    let checked = promtool(&["check", "rules", &rules.to_string_lossy()])?;
    assert!(checked.contains("SUCCESS: 5 rules found"), "{checked}");
    let tests = std::fs::read_to_string(workspace_root().join("tests/fixtures/monitoring/alerts-test.yaml"))?;
    let tests_file = dir.path().join("alerts-test.yaml");
    std::fs::write(&tests_file, tests.replace("[RULES]", &format!("[{}]", rules.display())))?;
    let tested = promtool(&["test", "rules", &tests_file.to_string_lossy()]);
    if let Err(e) = tested {
        bail!("promtool test rules failed: {e:#}");
    }

    // The dashboard: the chart ships the checked-in JSON; every panel queries valid PromQL.
    let json = std::fs::read_to_string(workspace_root().join("charts/sked/dashboards/sked.json"))?;
    let dashboard: serde_json::Value = serde_json::from_str(&json).context("the dashboard is JSON")?;
    assert_eq!(dashboard["uid"], "sked-schedulers");
    assert!(rendered.contains("\"uid\": \"sked-schedulers\""), "the ConfigMap carries the dashboard");
    let panels = dashboard["panels"].as_array().context("panels")?;
    let mut exprs = Vec::new();
    for panel in panels {
        let targets = panel["targets"].as_array().with_context(|| format!("targets of {}", panel["title"]))?;
        assert!(!targets.is_empty(), "panel {} queries nothing", panel["title"]);
        for t in targets {
            exprs.push(t["expr"].as_str().context("expr")?.to_owned());
        }
    }
    // Grafana's variables, as Grafana substitutes them, and each query as a recording rule.
    let recording: String = exprs
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let e = e.replace("$__rate_interval", "5m").replace("$scheduler", ".*");
            format!(
                "      - record: sked:dashboard:q{i}\n        expr: {}\n",
                serde_json::to_string(&e).unwrap_or_default()
            )
        })
        .collect();
    let queries = dir.path().join("dashboard-queries.yaml");
    std::fs::write(&queries, format!("groups:\n  - name: dashboard\n    rules:\n{recording}"))?;
    let checked = promtool(&["check", "rules", &queries.to_string_lossy()])?;
    assert!(checked.contains(&format!("SUCCESS: {} rules found", exprs.len())), "{checked}");

    // Every metric they read exists.
    let exported = exported_metrics();
    let rules_text = std::fs::read_to_string(&rules)?;
    let read: BTreeSet<String> =
        exprs.iter().map(String::as_str).chain([rules_text.as_str()]).flat_map(metrics_in).collect();
    let missing: Vec<&String> = read.iter().filter(|m| !exported.contains(*m)).collect();
    assert!(missing.is_empty(), "metrics no binary exports: {missing:?} (exported: {exported:?})");
    Ok(())
}
