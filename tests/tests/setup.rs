//! The set-up step `make demo`, `make test` and `.ci/run` start with, and the pinned tool build:
//! a second run does nothing, what cannot be installed stops at once with the command to run,
//! and a failing tool build says which one and shows its log.

use std::process::{Command, Output};

use anyhow::{Context as _, Result};
use sked_tests::cluster::workspace_root;

fn script(name: &str) -> Command {
    let mut command = Command::new("bash");
    command.arg(workspace_root().join("hack").join(name)).stdin(std::process::Stdio::null());
    command
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn setup_twice_installs_nothing_the_second_time() -> Result<()> {
    let first = script("setup.sh").output().context("running hack/setup.sh")?;
    assert!(first.status.success(), "first run: {}", stderr(&first));
    let second = script("setup.sh").output().context("running hack/setup.sh again")?;
    assert!(second.status.success(), "second run: {}", stderr(&second));
    assert_eq!(stderr(&second), "setup: nothing to install\n");
    Ok(())
}

#[test]
fn a_package_it_may_not_install_stops_with_the_command_to_run() -> Result<()> {
    let out = script("setup.sh")
        .env("SKED_SETUP_EXTRA_PACKAGES", "sked-no-such-package")
        .env("SKED_SETUP_NO_INSTALL", "1")
        .output()?;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("missing Debian packages: sked-no-such-package"), "{err}");
    assert!(err.contains("apt-get install -y sked-no-such-package"), "{err}");
    Ok(())
}

#[test]
fn a_failing_tool_build_names_the_tool_and_shows_its_log() -> Result<()> {
    // An empty cache, and a crane version that does not exist: only that set is asked for (as
    // each make target names the sets its steps run).
    let cache = tempfile::tempdir()?;
    let bin = tempfile::tempdir()?;
    let out = script("build-tools.sh")
        .arg(bin.path())
        .arg("crane")
        .env("SKED_TOOLS_CACHE", cache.path())
        .env("CRANE_VERSION", "v9.9.9")
        .output()?;
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("building 1 pinned tool set(s) once"), "{err}");
    assert!(err.contains("[1/1] crane v9.9.9"), "{err}");
    assert!(err.contains("building crane v9.9.9 failed; the last lines of"), "{err}");
    assert!(err.contains("go.mod"), "the Go error is shown: {err}");
    Ok(())
}
