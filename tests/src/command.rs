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
