//! `DEMO_SCRIPT=1 make demo`, end to end: the scripted tour runs the demo's own binary (its own
//! control plane, controller and played nodes) and every printed table and event is checked: the
//! canary first, never more than maxUnavailable nodes without an attached scheduler, a broken
//! revision rolled back with its real cause on every node it reached, everything attached at
//! the end of each rollout.

use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, ensure};
use sked_tests::agents::workspace_binary;

/// The text of tour step `n` (from its `== n.` title to the next one).
fn section(out: &str, n: usize) -> &str {
    let Some(start) = out.find(&format!("\n== {n}.")) else { return "" };
    let rest = &out[start..];
    let end = rest.get(4..).and_then(|r| r.find("\n== ")).map_or(rest.len(), |i| i + 4);
    &rest[..end]
}

/// The value after `prefix` on the first line that starts with it.
fn line_after<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    text.lines().find_map(|l| l.strip_prefix(prefix))
}

fn most_down(text: &str) -> Option<usize> {
    line_after(text, "most nodes without an attached, Ready scheduler at once: ")?.split(' ').next()?.parse().ok()
}

#[test]
fn the_scripted_demo_shows_a_paced_rollout_and_automatic_rollbacks() -> Result<()> {
    workspace_binary("sked-controller", "SKED_CONTROLLER_BIN")?;
    sked_tests::agents::agent_binary()?;
    workspace_binary("kubectl-sked", "SKED_KUBECTL_SKED_BIN")?;
    let demo = workspace_binary("sked-demo", "SKED_DEMO_BIN")?;
    let out = Command::new(&demo)
        .env("DEMO_SCRIPT", "1")
        .env("SKED_TOOLS_BIN", sked_tests::cluster::tools_dir())
        .stdin(Stdio::null())
        .output()
        .context("running sked-demo")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success(), "the tour failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("tour complete"), "{stdout}");
    // The start: five nodes, each attached.
    let first_table = stdout.split("\n== ").next().unwrap_or_default();
    assert!(first_table.contains("5/5") && first_table.contains("Complete"), "{first_table}");

    // 1. A new revision: a canary first, then waves, never more than two nodes down.
    let one = section(&stdout, 1);
    let phases = line_after(one, "phases seen: ").context("phases of step 1")?;
    assert!(phases.starts_with("Canary") && phases.ends_with("Complete") && phases.contains("Rolling"), "{one}");
    assert!(most_down(one).is_some_and(|n| (1..=2).contains(&n)), "{one}");
    assert!(one.contains("5/5"), "every node attached at the end: {one}");
    // `kubectl sked status`, during the rollout and after it: a row per node with its kernel.
    let during = one.split("$ kubectl sked status scx-rusty\n").nth(1).context("kubectl sked status during step 1")?;
    assert!(during.starts_with("scx-rusty: KERNEL-ATTACHED "), "{one}");
    let rows = |text: &str| text.lines().filter(|l| l.starts_with("demo-node-")).take(5).count();
    assert_eq!(rows(during), 5, "one row per node: {one}");
    let after = one.rsplit("$ kubectl sked status scx-rusty\n").next().unwrap_or_default();
    assert!(after.starts_with("scx-rusty: KERNEL-ATTACHED 5/5  UP-TO-DATE 5  READY 5  PHASE Complete"), "{one}");
    let attached_rows =
        after.lines().filter(|l| l.starts_with("demo-node-") && l.contains(" current ") && l.contains(" attached "));
    assert_eq!(attached_rows.count(), 5, "{one}");
    let stable = line_after(one, "revisions running: ").context("revisions after step 1")?;
    assert!(stable.ends_with(" on 5 nodes") && !stable.contains(','), "{one}");

    // 2. A revision that never attaches: the canary fails with the kernel's cause, is rolled
    // back, and the other nodes never leave the stable revision.
    let two = section(&stdout, 2);
    assert!(line_after(two, "phases seen: ").is_some_and(|p| p.ends_with("RolledBack")), "{two}");
    assert_eq!(most_down(two), Some(1), "only the canary left its scheduler: {two}");
    assert!(two.contains("Degraded=True RolloutFailed: Revision"), "{two}");
    assert!(two.contains("the kernel did not run the scheduler within 15s"), "{two}");
    assert_eq!(line_after(two, "revisions running: "), Some(stable), "the stable revision again everywhere: {two}");
    assert!(two.contains("RolledBack"), "the RolledBack event: {two}");

    // 3. An ejection during the bake: the kernel's own reason is the cause.
    let three = section(&stdout, 3);
    assert!(three.contains("runnable task stall"), "{three}");
    assert_eq!(most_down(three), Some(1), "{three}");
    // `kubectl sked why`: the kernel's words with its backtrace, kept with the failure.
    assert!(three.contains("$ kubectl sked why scx-rusty") && three.contains("Kernel: the kernel ejected "), "{three}");
    assert!(three.contains("    scx_watchdog_workfn+0x15b/0x1f0"), "{three}");
    assert_eq!(line_after(three, "revisions running: "), Some(stable), "{three}");

    // 4. A revision that attaches and slows its nodes: the analysis of the canary's bake rolls
    // it back, with its change against the nodes it left alone as the cause.
    let four = section(&stdout, 4);
    assert!(line_after(four, "phases seen: ").is_some_and(|p| p.ends_with("RolledBack")), "{four}");
    assert_eq!(most_down(four), Some(1), "only the canary switched: {four}");
    assert!(four.contains("Degraded=True RolloutFailed: Revision") && four.contains(" on demo-node-"), "{four}");
    // The controls are the nodes left alone with enough samples in both windows: 3 or 4 (the
    // node ejected in step 3 may have too few since its pod came back).
    let controls = ["3", "4"].iter().any(|n| four.contains(&format!("beyond the median change of {n} control nodes")));
    assert!(controls && four.contains("the limit is "), "{four}");
    assert!(four.contains("AnalysisFailed"), "the AnalysisFailed event: {four}");
    assert_eq!(line_after(four, "revisions running: "), Some(stable), "the stable revision again everywhere: {four}");

    // 5. A revision whose scheduler keeps no pod's CPU limit: the canary's bake fails on the
    // pods' CPU contract, naming the pod of team-a that ran over its limit and what it used.
    let limits = section(&stdout, 5);
    assert!(line_after(limits, "phases seen: ").is_some_and(|p| p.ends_with("RolledBack")), "{limits}");
    assert_eq!(most_down(limits), Some(1), "only the canary switched: {limits}");
    assert!(limits.contains("Degraded=True RolloutFailed: Revision"), "{limits}");
    assert!(limits.contains("team-a/api-") && limits.contains("against its limit of 0.50"), "{limits}");
    // The stand-in agent cannot read the scheduler's callbacks (no BPF here): the cause says so,
    // and claims no callback either way.
    assert!(limits.contains("the scheduler does not keep cpu.max (whether it implements"), "{limits}");
    assert_eq!(
        line_after(limits, "revisions running: "),
        Some(stable),
        "the stable revision again everywhere: {limits}"
    );

    // 6. Paused: nothing moves; resumed: the new revision everywhere, attached, each bake
    // judged by the analysis and passed.
    let five = section(&stdout, 6);
    assert!(five.contains("phases seen: Paused"), "{five}");
    let resumed = five.rsplit("phases seen: ").next().unwrap_or_default();
    assert!(resumed.starts_with("Canary") && resumed.contains("Complete"), "{five}");
    let last = line_after(resumed, "revisions running: ").context("revisions after the resume")?;
    assert!(last.ends_with(" on 5 nodes") && last != stable, "{five}");
    assert!(
        resumed.contains("Analysis of the last bake, by node:") && resumed.contains(": Passed: waiting tasks per CPU"),
        "{five}"
    );

    // 7. Deleted: no scheduler pod is left.
    let six = section(&stdout, 7);
    assert!(six.contains("deleted"), "{six}");

    // 8. A first deployment that fails: only the canary left the kernel's default, and it went
    // back to it; no node carries the label, no pod is left.
    let seven = section(&stdout, 8);
    let phases = line_after(seven, "phases seen: ").context("phases of step 7")?;
    assert!(phases.starts_with("Canary") && phases.ends_with("Failed"), "{seven}");
    assert_eq!(most_down(seven), Some(1), "only the canary switched: {seven}");
    assert!(seven.contains("Stalled=True RolloutFailed"), "{seven}");
    assert!(seven.contains("run the kernel's default scheduler again"), "{seven}");
    assert_eq!(line_after(seven, "revisions running: "), Some(""), "no pod of the failed revision: {seven}");
    assert!(seven.contains("Rolled back to the kernel's default scheduler on every node it reached (1)"), "{seven}");

    // 9. A node with no kubelet in the pool: the first deployment completes around it, canary
    // first, and says which node it skipped and why.
    let eight = section(&stdout, 9);
    let phases = line_after(eight, "phases seen: ").context("phases of step 8")?;
    assert!(phases.starts_with("Canary") && phases.ends_with("Complete"), "{eight}");
    assert!(
        eight.contains(r#"skipped: ["demo-node-6-no-kubelet"] {"NodeNotReady":1}"#),
        "the skipped node and its reason: {eight}"
    );
    assert!(eight.contains("demo-node-6-no-kubelet   Registering"), "kubectl sked nodes says why: {eight}");
    Ok(())
}
