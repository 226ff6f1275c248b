//! The release scripts the workflows call: tag rules, chart publishing into a gh-pages tree,
//! and the coverage gate.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context as _, Result};
use sked_tests::cluster::{tools_dir, workspace_root};

fn run(script: &str, args: &[&str]) -> Result<Output> {
    Command::new(workspace_root().join("hack").join(script))
        .args(args)
        .env("HELM", tools_dir().join("helm"))
        .env_remove("GITHUB_STEP_SUMMARY")
        .output()
        .with_context(|| format!("running {script}"))
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn release_tags_give_chart_and_app_versions() -> Result<()> {
    for (tag, version, prerelease) in [
        ("v1.2.3", "1.2.3", "false"),
        ("1.2.3", "1.2.3", "false"),
        ("v0.1.0-rc.1", "0.1.0-rc.1", "true"),
        ("v10.20.30-alpha.beta-2.0", "10.20.30-alpha.beta-2.0", "true"),
    ] {
        let out = run("release-tag.sh", &[tag])?;
        assert!(out.status.success(), "{tag}: {}", stderr(&out));
        assert_eq!(stdout(&out), format!("version={version}\napp_version={tag}\nprerelease={prerelease}\n"), "{tag}");
    }
    Ok(())
}

#[test]
fn other_tags_are_refused_with_the_rule() -> Result<()> {
    for (tag, why) in [
        ("v1.2.3+build.5", "build metadata"),
        ("v1.2", "not a release tag"),
        ("v01.2.3", "not a release tag"),
        ("v1.2.3-rc.01", "not a release tag"),
        ("v1.2.3-", "not a release tag"),
        ("release-2026", "not a release tag"),
        ("main", "not a release tag"),
        ("", "usage"),
    ] {
        let out = run("release-tag.sh", &[tag])?;
        assert!(!out.status.success(), "{tag:?} must be refused");
        assert!(stderr(&out).contains(why), "{tag:?}: {}", stderr(&out));
    }
    Ok(())
}

/// A copy of the fixture chart that a test may modify.
fn chart_copy(dir: &Path) -> Result<PathBuf> {
    let src = workspace_root().join("tests/fixtures/chart");
    let dst = dir.join("chart");
    let status = Command::new("cp").arg("-r").arg(&src).arg(&dst).status()?;
    anyhow::ensure!(status.success(), "copying the fixture chart");
    Ok(dst)
}

/// Every file under `dir` with its contents, to compare trees before and after.
fn snapshot(dir: &Path) -> Result<Vec<(PathBuf, Vec<u8>)>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push((path.clone(), std::fs::read(&path)?));
            }
        }
    }
    out.sort();
    Ok(out)
}

#[test]
fn chart_publishing_is_idempotent_immutable_and_keeps_history() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let chart = chart_copy(tmp.path())?;
    let pages = tmp.path().join("gh-pages");
    let chart_arg = chart.to_string_lossy().into_owned();
    let pages_arg = pages.to_string_lossy().into_owned();
    let publish = |tag: &str| run("publish-chart.sh", &[tag, &pages_arg, &chart_arg, "https://charts.example.test"]);

    // First release: archive and index appear; the checkout is not edited.
    let chart_before = snapshot(&chart)?;
    let out = publish("v1.0.0")?;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("changed=true"), "{}", stdout(&out));
    assert!(pages.join("sked-1.0.0.tgz").exists());
    assert_eq!(snapshot(&chart)?, chart_before, "packaging derives versions without editing files");
    let index = std::fs::read_to_string(pages.join("index.yaml"))?;
    assert!(index.contains("version: 1.0.0") && index.contains("appVersion: v1.0.0"), "{index}");
    assert!(index.contains("https://charts.example.test/sked-1.0.0.tgz"), "{index}");

    // Second run of the same tag: nothing in the tree changes.
    let before = snapshot(&pages)?;
    let out = publish("v1.0.0")?;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("changed=false"), "{}", stdout(&out));
    assert_eq!(snapshot(&pages)?, before, "a re-run is a no-op");

    // Same version, different contents: refused, tree untouched.
    std::fs::write(chart.join("values.yaml"), "greeting: changed\n")?;
    let out = publish("v1.0.0")?;
    assert!(!out.status.success(), "overwriting a released archive must be refused");
    assert!(stderr(&out).contains("immutable"), "{}", stderr(&out));
    assert_eq!(snapshot(&pages)?, before);

    // A new version is added; the older entry is kept exactly.
    let old_entry: String = index.lines().skip_while(|l| !l.contains("- apiVersion")).collect::<Vec<_>>().join("\n");
    let out = publish("v1.1.0-rc.1")?;
    assert!(out.status.success(), "{}", stderr(&out));
    let index = std::fs::read_to_string(pages.join("index.yaml"))?;
    assert!(index.contains("version: 1.1.0-rc.1") && index.contains("version: 1.0.0"), "{index}");
    for line in old_entry.lines().filter(|l| l.contains("created:") || l.contains("digest:")) {
        assert!(index.contains(line.trim()), "older entry changed: {line} missing from\n{index}");
    }
    assert!(pages.join("sked-1.0.0.tgz").exists() && pages.join("sked-1.1.0-rc.1.tgz").exists());

    // An invalid tag publishes nothing.
    let before = snapshot(&pages)?;
    let out = publish("v2.0.0+meta")?;
    assert!(!out.status.success());
    assert_eq!(snapshot(&pages)?, before);
    Ok(())
}

#[test]
fn coverage_gate_fails_below_and_passes_at_or_above_the_threshold() -> Result<()> {
    // The fixture covers 45 of 100 lines.
    let report = workspace_root().join("tests/fixtures/coverage-45.lcov");
    let report = report.to_string_lossy();
    for (threshold, passes) in [("40", true), ("45", true), ("45.1", false), ("60", false)] {
        let out = Command::new("make")
            .current_dir(workspace_root())
            .args(["--no-print-directory", "-s", "coverage-gate"])
            .arg(format!("COVERAGE_REPORT={report}"))
            .arg(format!("COVERAGE_THRESHOLD={threshold}"))
            .env_remove("GITHUB_STEP_SUMMARY")
            .output()?;
        assert_eq!(out.status.success(), passes, "threshold {threshold}: {}{}", stdout(&out), stderr(&out));
        assert!(stdout(&out).contains("45.0% (45 of 100 lines)"), "{}", stdout(&out));
    }
    let out = run("coverage-gate.sh", &["/nonexistent/lcov.info", "40"])?;
    assert!(!out.status.success() && stderr(&out).contains("run make coverage"), "{}", stderr(&out));
    Ok(())
}
