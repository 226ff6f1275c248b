//! Running the upstream tools the suites drive (kubectl, helm, cosign, crane).

use anyhow::{Context as _, Result, bail};

/// Runs a command to completion; its stdout on success, its stderr in the error otherwise.
pub fn run_command(cmd: &mut std::process::Command) -> Result<String> {
    let out = cmd.stdin(std::process::Stdio::null()).output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A finished command's stdout and stderr, for messages.
pub fn output_text(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Runs `promtool check metrics` on a Prometheus text exposition (an HTTP response's headers,
/// if any, are skipped). Fails with promtool's findings: lint problems too, not only errors.
pub fn promtool_check_metrics(exposition: &str) -> Result<()> {
    use std::io::Write as _;
    let body = exposition.split_once("\r\n\r\n").map_or(exposition, |(_, body)| body);
    let mut child = std::process::Command::new(crate::cluster::tools_dir().join("promtool"))
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running promtool (built by `make tools`)")?;
    child.stdin.take().context("promtool's stdin")?.write_all(body.as_bytes())?;
    let out = child.wait_with_output()?;
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() || !said.trim().is_empty() {
        bail!("promtool check metrics found problems:\n{said}\nin:\n{body}");
    }
    Ok(())
}
