//! The first run as a new user meets it: each make target builds only the pinned tool sets its
//! own steps run (read from `make -n`, so nothing is built here), and the repository holds only
//! what the project wrote, under the licence its crates declare; every dependency offers a
//! licence that is not GPL, and the layers below the controller link no gRPC stack or runtime.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, ensure};
use sked_tests::cluster::workspace_root;

/// The tool sets each `hack/build-tools.sh` line of `make -n TARGET` asks for (an empty list
/// asks for every set).
fn tool_requests(target: &str) -> Result<Vec<Vec<String>>> {
    let out = Command::new("make")
        .args(["-n", "--no-print-directory", target])
        .current_dir(workspace_root())
        .output()
        .context("running make -n")?;
    ensure!(out.status.success(), "make -n {target}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split("hack/build-tools.sh").nth(1))
        .map(|args| {
            // The first word is the directory the binaries are linked into.
            args.split_whitespace().skip(1).take_while(|w| !w.starts_with('>')).map(str::to_owned).collect()
        })
        .collect())
}

fn sets(names: &[&str]) -> Vec<Vec<String>> {
    vec![names.iter().map(|n| (*n).to_owned()).collect()]
}

#[test]
fn the_demo_builds_only_the_control_plane_it_runs() -> Result<()> {
    // etcd, and kube-apiserver, kube-controller-manager, kube-scheduler and kubectl (one set).
    assert_eq!(tool_requests("demo")?, sets(&["kubernetes", "etcd"]), "make demo asks for tools it does not run");
    let list = Command::new("bash")
        .args(["hack/build-tools.sh", "--list", "/nonexistent", "kubernetes", "etcd"])
        .current_dir(workspace_root())
        .output()?;
    ensure!(list.status.success(), "build-tools.sh --list: {}", String::from_utf8_lossy(&list.stderr));
    let binaries: Vec<String> = String::from_utf8_lossy(&list.stdout)
        .lines()
        .flat_map(|l| l.split_whitespace().nth(2).unwrap_or_default().split(',').map(str::to_owned).collect::<Vec<_>>())
        .collect();
    assert_eq!(binaries, ["kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "etcd"]);
    Ok(())
}

#[test]
fn each_suite_builds_only_the_tool_sets_its_steps_use() -> Result<()> {
    let test = ["kubernetes", "etcd", "helm", "cosign", "crane", "kstatus", "promtool", "cert-manager"];
    assert_eq!(tool_requests("test")?, sets(&test));
    assert_eq!(tool_requests("test-kernel")?, sets(&["kubernetes", "etcd"]));
    let node = ["kubernetes", "etcd", "kubelet", "helm", "cosign", "crane", "cert-manager", "promtool"];
    assert_eq!(tool_requests("test-node")?, sets(&node));
    assert_eq!(tool_requests("demo-node")?, sets(&node));
    assert_eq!(tool_requests("bench")?, sets(&["kubernetes", "etcd", "cosign", "crane"]));
    assert_eq!(tool_requests("bench-rollout")?, sets(&["kubernetes", "etcd"]));
    assert_eq!(tool_requests("chaos")?, sets(&["kubernetes", "etcd"]));
    assert_eq!(tool_requests("actionlint")?, sets(&["actionlint"]));
    assert_eq!(tool_requests("tools")?, vec![Vec::<String>::new()], "make tools builds every set");
    Ok(())
}

#[test]
fn an_unknown_tool_set_is_refused_by_name() -> Result<()> {
    let out = Command::new("bash")
        .args(["hack/build-tools.sh", "--list", "/nonexistent", "kubernetes", "kubeflow"])
        .current_dir(workspace_root())
        .output()?;
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown tool set kubeflow") && err.contains("cert-manager"), "{err}");
    Ok(())
}

/// Every file of the checkout, without build outputs and Git's own directory.
fn repository_files() -> Result<Vec<PathBuf>> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
        for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if matches!(name.as_ref(), ".git" | "target" | ".tools" | "coverage") {
                continue;
            }
            let kind = entry.file_type()?;
            if kind.is_dir() {
                walk(&entry.path(), out)?;
            } else if kind.is_file() {
                out.push(entry.path());
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    walk(&workspace_root(), &mut files)?;
    Ok(files)
}

#[test]
fn the_repository_holds_no_copied_third_party_source() -> Result<()> {
    let root = workspace_root();
    assert!(!root.join("hack/cert-manager").exists(), "cert-manager comes from the Go module proxy, not copied files");
    let header = regex::Regex::new(r"Copyright (\(c\) )?[0-9]{4}(-[0-9]{4})? The [A-Za-z0-9 -]+ Authors")?;
    let files = repository_files()?;
    assert!(files.len() > 50, "the walk found the checkout ({} files)", files.len());
    for file in &files {
        let rel = file.strip_prefix(&root).unwrap_or(file).display().to_string();
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        // The project's only Go is the small wrapper mains hack/build-tools.sh writes for the
        // pinned tools; a Go module or package in the tree is someone else's code.
        assert!(
            !(name.ends_with(".go") || name == "go.mod" || name == "go.sum"),
            "{rel}: Go source in the repository (build upstream tools from the module proxy instead)"
        );
        let Ok(text) = std::fs::read_to_string(file) else { continue };
        if rel == "LICENSE" {
            continue;
        }
        assert!(!header.is_match(&text), "{rel} carries another project's copyright header");
    }
    Ok(())
}

#[test]
fn the_licence_is_stated_where_users_and_the_kernel_read_it() -> Result<()> {
    let root = workspace_root();
    let licence = std::fs::read_to_string(root.join("LICENSE")).context("LICENSE at the root")?;
    assert!(licence.contains("Apache License") && licence.contains("Version 2.0, January 2004"));
    assert!(licence.contains("END OF TERMS AND CONDITIONS"), "the whole licence text");
    let workspace = std::fs::read_to_string(root.join("Cargo.toml"))?;
    assert!(workspace.contains("license = \"Apache-2.0\""));
    let readme = std::fs::read_to_string(root.join("README.md"))?;
    assert!(readme.contains("Apache-2.0") && readme.contains("(LICENSE)"), "the README names the licence");
    // The kernel loads struct_ops schedulers only under a GPL-compatible licence string.
    let canary = std::fs::read_to_string(root.join("bpf/sked_canary.bpf.c"))?;
    assert!(canary.starts_with("// SPDX-License-Identifier: GPL-2.0-only"), "the canary states its licence");
    assert!(canary.contains(r#"char _license[] SEC("license") = "GPL";"#));
    Ok(())
}

/// `cargo` with `args`, in the workspace; its standard output.
fn cargo(args: &[&str]) -> Result<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo).args(args).current_dir(workspace_root()).output().context("running cargo")?;
    ensure!(out.status.success(), "cargo {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8(out.stdout)?)
}

#[test]
fn the_pure_core_and_the_plugin_build_without_the_grpc_stack() -> Result<()> {
    // What each crate links, resolved for that crate alone (as `cargo build -p` builds it).
    for (krate, refused) in [
        ("sked-core", &["tokio", "hyper", "tonic", "kube-client", "kube-runtime", "reqwest"][..]),
        ("sked-api", &["tokio", "hyper", "tonic", "kube-client", "kube-runtime", "reqwest"][..]),
        ("kubectl-sked", &["tonic"][..]),
    ] {
        let tree = cargo(&["tree", "--locked", "-p", krate, "-e", "normal", "--prefix", "none", "--format", "{p}"])?;
        let names: std::collections::BTreeSet<&str> =
            tree.lines().filter_map(|l| l.split_whitespace().next()).collect();
        for name in refused {
            assert!(!names.contains(name), "{krate} links {name}: {names:?}");
        }
    }
    Ok(())
}

#[test]
fn every_dependency_offers_a_licence_that_is_not_gpl() -> Result<()> {
    // Packages whose manifest names a licence file instead of an expression, and what it is.
    const LICENCE_FILES: &[(&str, &str)] =
        &[("sigstore-protobuf-specs-derive", "Apache-2.0 (a proc-macro: runs in the build, not linked)")];
    let platform = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    let metadata: serde_json::Value = serde_json::from_str(&cargo(&[
        "metadata",
        "--locked",
        "--format-version",
        "1",
        "--filter-platform",
        &platform,
    ])?)?;
    let members: Vec<&serde_json::Value> = metadata["workspace_members"].as_array().into_iter().flatten().collect();
    let mut checked = 0;
    for package in metadata["packages"].as_array().into_iter().flatten() {
        if members.contains(&&package["id"]) {
            continue;
        }
        let name = package["name"].as_str().unwrap_or_default();
        checked += 1;
        let Some(expression) = package["license"].as_str() else {
            assert!(
                LICENCE_FILES.iter().any(|(n, _)| *n == name),
                "{name}: no licence expression; read its licence file"
            );
            continue;
        };
        assert!(
            offered_without_gpl(expression)?,
            "{name} is offered only under {expression}: it cannot be linked into Apache-2.0 binaries"
        );
    }
    assert!(checked > 100, "only {checked} dependencies read");
    Ok(())
}

/// Whether an SPDX licence expression can be met with no GPL licence of any kind: every AND
/// needs each side met, an OR one of them (crates' manifests may write `/` for OR, which the
/// lax parse takes).
fn offered_without_gpl(expression: &str) -> Result<bool> {
    let parsed = spdx::Expression::parse_mode(expression, spdx::ParseMode::LAX)
        .map_err(|e| anyhow::anyhow!("{expression:?} is not an SPDX expression: {e}"))?;
    Ok(parsed.evaluate(|req| req.license.id().is_some_and(|id| !id.name.contains("GPL"))))
}

#[test]
fn licence_expressions_are_read_with_and_and_or() -> Result<()> {
    for (expression, ok) in [
        ("MIT OR Apache-2.0", true),
        ("LGPL-2.1-only OR BSD-2-Clause", true),
        ("Apache-2.0 WITH LLVM-exception", true),
        ("MIT/Apache-2.0", true),
        ("(MIT OR Apache-2.0) AND Unicode-3.0", true),
        ("(MIT OR Apache-2.0) AND GPL-2.0", false),
        ("GPL-2.0-only", false),
        ("LGPL-2.1-only", false),
        ("GPL-2.0-or-later OR AGPL-3.0-only", false),
    ] {
        assert_eq!(offered_without_gpl(expression)?, ok, "{expression}");
    }
    Ok(())
}
