//! The release scripts the workflows call (tag rules, chart publishing into a gh-pages tree,
//! the coverage gate, the cross-build check), and the rules the workflow files and Dockerfiles
//! must keep: nothing here can run GitHub Actions, so the files are read and checked.

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

    // Without the URL the index would point at, nothing is published (a fork must not index
    // another repository's site).
    let out = run("publish-chart.sh", &["v3.0.0", &pages_arg, &chart_arg])?;
    assert!(!out.status.success() && stderr(&out).contains("REPO_URL"), "{}", stderr(&out));
    assert_eq!(snapshot(&pages)?, before);
    Ok(())
}

#[test]
fn a_release_rerun_publishes_the_archive_attached_to_the_release_byte_for_byte() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let chart = chart_copy(tmp.path())?;
    let chart_arg = chart.to_string_lossy().into_owned();
    let publish = |pages: &Path, archive: Option<&Path>, tag: &str| {
        let mut cmd = Command::new(workspace_root().join("hack/publish-chart.sh"));
        cmd.args([tag, &pages.to_string_lossy(), &chart_arg, "https://charts.example.test"])
            .env("HELM", tools_dir().join("helm"));
        if let Some(archive) = archive {
            cmd.env("CHART_ARCHIVE", archive);
        }
        cmd.output().context("running publish-chart.sh")
    };

    // The first run attached this archive to the Release.
    let first = tmp.path().join("first");
    let out = publish(&first, None, "v1.0.0")?;
    assert!(out.status.success(), "{}", stderr(&out));
    let released = tmp.path().join("released.tgz");
    std::fs::copy(first.join("sked-1.0.0.tgz"), &released).context("the first run's archive")?;

    // Its gh-pages push failed; the re-run hands the Release's archive in: the same bytes are
    // published (packaging again would give another digest).
    let rerun = tmp.path().join("rerun");
    let out = publish(&rerun, Some(&released), "v1.0.0")?;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("changed=true"), "{}", stdout(&out));
    let republished = std::fs::read(rerun.join("sked-1.0.0.tgz")).context("the re-run's archive")?;
    assert_eq!(republished, std::fs::read(&released)?);

    // An archive of another version is refused, naming the fix.
    let out = publish(&tmp.path().join("other"), Some(&released), "v1.0.1")?;
    assert!(!out.status.success(), "an archive of 1.0.0 must not be published as 1.0.1");
    assert!(stderr(&out).contains("not version 1.0.1"), "{}", stderr(&out));
    Ok(())
}

#[test]
fn the_cross_build_check_refuses_a_binary_that_needs_a_library_the_runtime_image_lacks() -> Result<()> {
    if !cfg!(target_arch = "x86_64") {
        return Ok(()); // the probe binary below is this machine's
    }
    // git needs libz and libpcre2, neither of which distroless/cc has.
    let out = run("cross.sh", &["check", "amd64", "/usr/bin/git"])?;
    assert!(!out.status.success(), "git needs libraries the runtime image lacks");
    assert!(stderr(&out).contains("libz.so.1") && stderr(&out).contains("link it statically"), "{}", stderr(&out));
    // An arm64 check of an x86_64 binary is refused too.
    let out = run("cross.sh", &["check", "arm64", "/usr/bin/git"])?;
    assert!(!out.status.success() && stderr(&out).contains("not arm64"), "{}", stderr(&out));
    Ok(())
}

#[test]
fn the_plugin_archives_are_reproducible_and_the_krew_manifest_names_their_checksums() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let bin = dir.path().join("kubectl-sked");
    std::fs::write(&bin, "#!/bin/sh\necho sked\n")?;
    std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let dist = dir.path().join("dist");
    let dist_arg = dist.to_string_lossy().into_owned();
    let bin_arg = bin.to_string_lossy().into_owned();
    for arch in ["amd64", "arm64"] {
        let out = run("plugin-release.sh", &["archive", "linux", arch, &bin_arg, &dist_arg])?;
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let archive = dist.join("kubectl-sked-linux-amd64.tar.gz");
    let first = std::fs::read(&archive)?;
    let out = run("plugin-release.sh", &["archive", "linux", "amd64", &bin_arg, &dist_arg])?;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(&archive)?, first, "a re-run packs the same bytes");
    let listed = Command::new("tar").arg("-tzf").arg(&archive).output()?;
    assert_eq!(stdout(&listed), "LICENSE\nkubectl-sked\n");
    let sum = sked_tests::registry::sha256_hex(&first);
    let recorded = std::fs::read_to_string(dist.join("kubectl-sked-linux-amd64.tar.gz.sha256"))?;
    assert_eq!(recorded, format!("{sum}  kubectl-sked-linux-amd64.tar.gz\n"), "sha256sum -c reads it");

    let base = "https://github.com/schedkit/sked/releases/download/v1.2.3";
    let out = run("plugin-release.sh", &["manifest", "v1.2.3", base, &dist_arg])?;
    assert!(out.status.success(), "{}", stderr(&out));
    let manifest: Yaml = serde_saphyr::from_str(&std::fs::read_to_string(dist.join("sked.yaml"))?)?;
    assert_eq!(text(&manifest["kind"]), "Plugin");
    assert_eq!(text(&manifest["metadata"]["name"]), "sked", "installed as kubectl sked");
    assert_eq!(text(&manifest["spec"]["version"]), "v1.2.3");
    let platforms = manifest["spec"]["platforms"].as_array().context("platforms")?;
    assert_eq!(platforms.len(), 2);
    let amd64 = platforms.iter().find(|p| p["selector"]["matchLabels"]["arch"] == "amd64").context("amd64")?;
    assert_eq!(text(&amd64["selector"]["matchLabels"]["os"]), "linux");
    assert_eq!(text(&amd64["uri"]), format!("{base}/kubectl-sked-linux-amd64.tar.gz"));
    assert_eq!(text(&amd64["sha256"]), sum);
    assert_eq!(text(&amd64["bin"]), "kubectl-sked");
    let out = run("plugin-release.sh", &["manifest", "main", base, &dist_arg])?;
    assert!(!out.status.success() && stderr(&out).contains("not a release tag"), "{}", stderr(&out));
    Ok(())
}

// --- the workflow files ----------------------------------------------------------------------

type Yaml = serde_json::Value;

fn read(path: &str) -> Result<String> {
    std::fs::read_to_string(workspace_root().join(path)).with_context(|| format!("reading {path}"))
}

fn workflow(name: &str) -> Result<Yaml> {
    serde_saphyr::from_str(&read(&format!(".github/workflows/{name}"))?).with_context(|| format!("parsing {name}"))
}

fn workflow_names() -> Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(workspace_root().join(".github/workflows"))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n.ends_with(".yml"))
        .collect();
    names.sort();
    Ok(names)
}

/// Every job of a workflow with its steps.
fn jobs(wf: &Yaml) -> Vec<(String, Vec<Yaml>)> {
    let Some(jobs) = wf["jobs"].as_object() else { return Vec::new() };
    jobs.iter().map(|(name, job)| (name.clone(), job["steps"].as_array().cloned().unwrap_or_default())).collect()
}

fn text(v: &Yaml) -> &str {
    v.as_str().unwrap_or_default()
}

/// The step of a job that uses `action` (owner/name), if any.
fn step_using<'a>(steps: &'a [Yaml], action: &str) -> Vec<&'a Yaml> {
    steps.iter().filter(|s| text(&s["uses"]).starts_with(&format!("{action}@"))).collect()
}

/// A pinned version from hack/build-tools.sh (`NAME=${NAME:-vX.Y.Z}`).
fn tool_version(name: &str) -> Result<String> {
    let script = read("hack/build-tools.sh")?;
    let prefix = format!("{name}=${{{name}:-");
    script
        .lines()
        .find_map(|l| l.strip_prefix(&prefix).and_then(|rest| rest.strip_suffix('}')))
        .map(str::to_owned)
        .with_context(|| format!("{name} is not pinned in hack/build-tools.sh"))
}

#[test]
fn main_and_latest_move_only_on_pushes_to_main_and_the_newest_push_wins() -> Result<()> {
    let wf = workflow("publish-image.yml")?;
    let group = text(&wf["concurrency"]["group"]);
    assert!(group.contains("github.ref"), "one concurrency group per ref, got {group:?}");
    let cancel = &wf["concurrency"]["cancel-in-progress"];
    assert!(
        cancel == &Yaml::Bool(true) || text(cancel).contains("refs/heads/main"),
        "a newer push to main must cancel an older build, got {cancel}"
    );

    let (_, steps) = jobs(&wf).into_iter().find(|(n, _)| n == "image").context("job image")?;
    let meta = step_using(&steps, "docker/metadata-action");
    let meta = meta.first().context("a docker/metadata-action step")?;
    assert!(
        text(&meta["with"]["flavor"]).contains("latest=false"),
        "metadata-action adds latest to tag builds unless latest=false"
    );
    let main_only = "enable=${{ github.ref == 'refs/heads/main' }}";
    for line in text(&meta["with"]["tags"]).lines().map(str::trim).filter(|l| !l.is_empty()) {
        let allowed = line == "type=ref,event=tag"
            || line == "type=sha,format=long,prefix=sha-"
            || (line.starts_with("type=raw,value=main,") || line.starts_with("type=raw,value=latest,"))
                && line.ends_with(main_only);
        assert!(allowed, "image tag rule {line:?}: main and latest only from main, a Git tag only its own tag");
    }
    let tags = text(&meta["with"]["tags"]);
    for needed in ["value=main", "value=latest", "type=ref,event=tag", "type=sha"] {
        assert!(tags.contains(needed), "{needed} missing from the image tags:\n{tags}");
    }
    Ok(())
}

#[test]
fn every_action_is_pinned_by_commit_sha_and_kept_current_by_dependabot() -> Result<()> {
    for name in workflow_names()? {
        for (job, steps) in jobs(&workflow(&name)?) {
            for step in steps {
                let uses = text(&step["uses"]);
                if uses.is_empty() || uses.starts_with("./") {
                    continue;
                }
                let sha = uses.rsplit_once('@').map(|(_, r)| r).unwrap_or_default();
                assert!(
                    sha.len() == 40 && sha.chars().all(|c| c.is_ascii_hexdigit()),
                    "{name} job {job}: {uses} must be pinned by a full commit SHA (the version in a comment)"
                );
            }
        }
    }
    let dependabot: Yaml = serde_saphyr::from_str(&read(".github/dependabot.yml")?)?;
    let ecosystems: Vec<&str> =
        dependabot["updates"].as_array().into_iter().flatten().map(|u| text(&u["package-ecosystem"])).collect();
    for needed in ["github-actions", "docker", "cargo"] {
        assert!(ecosystems.contains(&needed), "dependabot must update {needed}: {ecosystems:?}");
    }
    Ok(())
}

#[test]
fn every_workflow_sets_up_with_the_script_ci_uses_and_runs_each_suite_once() -> Result<()> {
    let mut make_runs: Vec<(String, String)> = Vec::new();
    for name in workflow_names()? {
        for (job, steps) in jobs(&workflow(&name)?) {
            let runs: Vec<&str> = steps.iter().map(|s| text(&s["run"])).collect();
            let setup = runs.iter().position(|r| r.starts_with("bash hack/setup.sh"));
            let first_make = runs.iter().position(|r| r.lines().any(|l| l.trim_start().starts_with("make ")));
            if let Some(first_make) = first_make {
                assert!(
                    setup.is_some_and(|s| s < first_make),
                    "{name} job {job} runs make before `bash hack/setup.sh` (the set-up .ci/run and make use)"
                );
            }
            for r in runs {
                assert!(!r.contains("apt-get"), "{name} job {job} installs packages itself; hack/setup.sh does: {r}");
                for line in r.lines().map(str::trim).filter(|l| l.starts_with("make ")) {
                    make_runs.push((format!("{name}/{job}"), line.to_owned()));
                }
            }
        }
    }
    let count = |target: &str| make_runs.iter().filter(|(_, l)| l.as_str() == target).count();
    assert_eq!(count("make test"), 1, "the README's test command runs once: {make_runs:?}");
    assert_eq!(count("make coverage"), 1, "{make_runs:?}");
    assert_eq!(count("make test-kernel"), 1, "{make_runs:?}");
    assert_eq!(count("make test-node"), 1, "{make_runs:?}");
    assert_eq!(count("make test-integration"), 0, "make test already runs the integration suites: {make_runs:?}");
    assert!(make_runs.iter().any(|(w, l)| w.starts_with("test.yml") && l == "make test"), "{make_runs:?}");
    assert_eq!(count("make cross-check"), 1, "{make_runs:?}");
    assert!(read(".ci/run")?.contains("bash hack/setup.sh"), ".ci/run sets up with the same script");
    let makefile = read("Makefile")?;
    assert!(
        ["test: setup", "test-kernel: setup", "test-node: setup", "demo: setup", "coverage-clean:\n\t@hack/setup.sh"]
            .iter()
            .all(|t| makefile.contains(t)),
        "make's targets set up first"
    );
    let ci = read(".ci/run")?;
    for suite in
        ["make test COVERAGE=1", "make test-kernel COVERAGE=1", "make test-node COVERAGE=1", "make coverage-report"]
    {
        assert!(ci.contains(suite), ".ci/run runs `{suite}`: each suite once, instrumented, one report");
    }
    Ok(())
}

#[test]
fn release_tools_in_workflows_are_the_versions_the_tests_run() -> Result<()> {
    let publish = workflow("publish-image.yml")?;
    let (_, steps) = jobs(&publish).into_iter().find(|(n, _)| n == "image").context("job image")?;
    let cosign = step_using(&steps, "sigstore/cosign-installer");
    let cosign = cosign.first().context("a cosign-installer step")?;
    assert_eq!(text(&cosign["with"]["cosign-release"]), tool_version("COSIGN_VERSION")?);

    let release = workflow("release.yml")?;
    let (_, steps) = jobs(&release).into_iter().find(|(n, _)| n == "chart").context("job chart")?;
    let helm = step_using(&steps, "Azure/setup-helm");
    let helm = helm.first().context("a setup-helm step")?;
    assert_eq!(text(&helm["with"]["version"]), tool_version("HELM_VERSION")?);

    // A re-run publishes the Release's own archive, at this repository's Pages URL.
    let publish_step = steps.iter().find(|s| text(&s["id"]) == "publish").context("step publish")?;
    assert!(text(&publish_step["env"]["CHART_ARCHIVE"]).contains("steps.released.outputs.archive"));
    assert!(text(&publish_step["env"]["REPO_URL"]).contains("steps.pages-url.outputs.url"));
    assert!(text(&publish_step["run"]).contains("\"$REPO_URL\""));
    let url_step = steps.iter().find(|s| text(&s["id"]) == "pages-url").context("step pages-url")?;
    assert!(text(&url_step["run"]).contains("repos/$GITHUB_REPOSITORY/pages"), "the URL comes from this repository");
    Ok(())
}

#[test]
fn images_cross_compile_per_platform_from_pinned_bases_and_are_smoke_tested() -> Result<()> {
    for (dockerfile, package) in [("Dockerfile.controller", "sked-controller"), ("Dockerfile.agent", "sked-agent")] {
        let text = read(dockerfile)?;
        let froms: Vec<&str> = text.lines().filter(|l| l.starts_with("FROM ")).collect();
        assert!(
            froms[0].starts_with("FROM --platform=$BUILDPLATFORM "),
            "{dockerfile}: the build runs natively: {}",
            froms[0]
        );
        for from in &froms {
            let image = from.split_whitespace().find(|w| w.contains('/') || w.contains(':')).unwrap_or_default();
            let stage_ref = !image.contains('/') && !image.contains(':');
            let pinned = image.split_once("@sha256:").is_some_and(|(_, d)| d.len() == 64);
            assert!(stage_ref || pinned, "{dockerfile}: {from} must pin its base image by digest");
        }
        assert!(
            text.contains(&format!("hack/cross.sh build \"$TARGETARCH\" {package}")),
            "{dockerfile} builds with hack/cross.sh"
        );
        assert!(text.contains("hack/cross.sh check \"$TARGETARCH\""), "{dockerfile} checks the binary");
        assert!(
            text.contains("target=/src/target") && text.contains("-$TARGETARCH,target=/src/target"),
            "{dockerfile}: one build cache per platform"
        );
        assert!(
            text.contains("AS smoke") && text.contains(&format!("\"/usr/local/bin/{package}\", \"--version\"")),
            "{dockerfile}: smoke stage"
        );
    }
    let wf = workflow("publish-image.yml")?;
    let (_, steps) = jobs(&wf).into_iter().find(|(n, _)| n == "image").context("job image")?;
    let builds = step_using(&steps, "docker/build-push-action");
    let targets: Vec<(&str, bool)> =
        builds.iter().map(|s| (text(&s["with"]["target"]), s["with"]["push"] == Yaml::Bool(true))).collect();
    assert_eq!(targets, [("smoke", false), ("image", true)], "the smoke stage runs before the image is pushed");
    let ignore = read(".dockerignore")?;
    assert!(ignore.lines().any(|l| l == "**/target"), ".dockerignore patterns must match at any depth");
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
