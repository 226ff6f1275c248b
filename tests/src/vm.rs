//! A test VM: a kernel and an initramfs under qemu (TCG), driven through a virtio console
//! control port, with more ports each carrying the guest's connections to one address on the
//! host ([`crate::vmlink`]). The guest side is `hack/kernel-e2e.sh`'s `/init`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use crate::cluster;

pub struct TestVm {
    child: Child,
    pub dir: PathBuf,
    lines: tokio::io::Lines<BufReader<OwnedReadHalf>>,
    control: OwnedWriteHalf,
    /// `uname -r` of the guest.
    pub kernel_release: String,
    relays: Vec<tokio::task::JoinHandle<()>>,
}

impl TestVm {
    /// Boots `kernel` with `initramfs`; connections the guest makes to 127.0.0.1:8443 reach
    /// `reports` on the host. Returns once the guest's `/init` is ready for commands.
    pub async fn boot(kernel: &Path, initramfs: &Path, dir: &Path, reports: std::net::SocketAddr) -> Result<Self> {
        Self::boot_with(kernel, initramfs, dir, 1024, &[("relay", reports)]).await
    }

    /// Boots `kernel` with `initramfs` and `memory_mib` of memory. Each forward `(name, target)`
    /// is a virtio console port named `sked.<name>` whose connections reach `target` on the
    /// host (the first is port 1, where the kernel tests' `/init` starts its relay; the guest
    /// finds the others by name under /sys/class/virtio-ports). Returns once the guest's init
    /// is ready for commands.
    pub async fn boot_with(
        kernel: &Path,
        initramfs: &Path,
        dir: &Path,
        memory_mib: u32,
        forwards: &[(&str, std::net::SocketAddr)],
    ) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let control_sock = dir.join("control.sock");
        let _ = std::fs::remove_file(&control_sock);
        let mut cmd = Command::new("qemu-system-x86_64");
        // One host thread runs both vCPUs: with a thread per vCPU (multi-threaded TCG), a guest
        // that patches its own code on one CPU (the kernel's int3-based text_poke, which
        // sched_ext's static keys go through on every enable) can run a half-patched
        // instruction on the other; a CI run caught the guest dying of that ("Oops: int3" in
        // __schedule while a scheduler was being enabled).
        let memory = memory_mib.to_string();
        cmd.args(["-accel", "tcg,thread=single", "-cpu", "max", "-machine", "q35", "-m", &memory, "-smp", "2"])
            .args(["-display", "none", "-no-reboot", "-kernel"])
            .arg(kernel)
            .arg("-initrd")
            .arg(initramfs)
            .args(["-append", "console=ttyS0 panic=-1 rdinit=/init quiet"])
            .arg("-serial")
            .arg(format!("file:{}", dir.join("console.log").display()))
            .args(["-device", "virtio-serial-pci"])
            .arg("-chardev")
            .arg(format!("socket,id=control,path={},server=on,wait=off", control_sock.display()))
            .args(["-device", "virtserialport,chardev=control,nr=2,name=sked.control"]);
        let mut sockets = Vec::new();
        for (i, (name, target)) in forwards.iter().enumerate() {
            let socket = dir.join(format!("{name}.sock"));
            let _ = std::fs::remove_file(&socket);
            let nr = if i == 0 { 1 } else { i + 2 };
            cmd.arg("-chardev")
                .arg(format!("socket,id={name},path={},server=on,wait=off", socket.display()))
                .arg("-device")
                .arg(format!("virtserialport,chardev={name},nr={nr},name=sked.{name}"));
            sockets.push((socket, *target));
        }
        cmd.stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.join("qemu.log"))?)
            .stderr(std::fs::File::create(dir.join("qemu.err"))?);
        let child = cluster::spawn(cmd).context("starting qemu-system-x86_64 (hack/kernel-e2e.sh deps installs it)")?;

        let control = connect(&control_sock).await?;
        let relays = sockets
            .into_iter()
            .map(|(socket, target)| {
                tokio::spawn(async move {
                    if let Err(e) = crate::vmlink::serve_host_side(socket, target).await {
                        eprintln!("vm relay to {target} stopped: {e:#}");
                    }
                })
            })
            .collect();
        let (read, write) = control.into_split();
        let mut vm = Self {
            child,
            dir: dir.to_path_buf(),
            lines: BufReader::new(read).lines(),
            control: write,
            kernel_release: String::new(),
            relays,
        };
        let ready = tokio::time::timeout(Duration::from_secs(120), async {
            loop {
                match vm.lines.next_line().await? {
                    Some(line) if line.starts_with("@@ready ") => return Ok::<_, anyhow::Error>(line),
                    Some(_) => {}
                    None => bail!("the VM closed its control port"),
                }
            }
        })
        .await
        .map_err(|_| anyhow!("the VM did not boot within 120 s:\n{}", vm.console_tail(30)))??;
        vm.kernel_release = ready.trim_start_matches("@@ready ").trim().to_owned();
        Ok(vm)
    }

    /// Runs a shell command in the guest; its output, or an error with it when it fails.
    pub async fn run(&mut self, command: &str) -> Result<String> {
        self.control.write_all(format!("{command}\n").as_bytes()).await?;
        let mut out = String::new();
        let deadline = Duration::from_secs(60);
        let status = tokio::time::timeout(deadline, async {
            loop {
                match self.lines.next_line().await? {
                    Some(line) => match line.strip_prefix("@@done ") {
                        Some(code) => return Ok::<_, anyhow::Error>(code.trim().to_owned()),
                        None => {
                            out.push_str(&line);
                            out.push('\n');
                        }
                    },
                    None => bail!("the VM closed its control port"),
                }
            }
        })
        .await
        .map_err(|_| anyhow!("{command:?} did not finish in the VM within {deadline:?}"))??;
        if status != "0" {
            bail!("{command:?} failed in the VM (status {status}): {out}");
        }
        Ok(out)
    }

    /// Runs `command` in the guest until it succeeds; fails with `what` and the last error after
    /// `within`.
    pub async fn wait_until(&mut self, what: &str, command: &str, within: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match self.run(command).await {
                Ok(_) => return Ok(()),
                Err(e) if tokio::time::Instant::now() > deadline => {
                    return Err(e.context(format!("{what}: not within {within:?}")));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// Writes a file in the guest.
    pub async fn write_file(&mut self, path: &str, contents: &[u8]) -> Result<()> {
        use base64::Engine;
        let encoded = base64::engine::general_purpose::STANDARD.encode(contents);
        self.run(&format!("mkdir -p $(dirname {path}) && echo {encoded} | base64 -d > {path}")).await.map(|_| ())
    }

    pub fn console_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.dir.join("console.log")).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Powers the VM off and waits for qemu to exit.
    pub async fn shutdown(mut self) -> Result<()> {
        let _ = self.control.write_all(b"poweroff -f\n").await;
        for _ in 0..100 {
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        Ok(())
    }
}

impl Drop for TestVm {
    fn drop(&mut self) {
        for relay in &self.relays {
            relay.abort();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// qemu creates its sockets shortly after it starts.
async fn connect(path: &Path) -> Result<UnixStream> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match UnixStream::connect(path).await {
            Ok(s) => return Ok(s),
            Err(e) if tokio::time::Instant::now() > deadline => {
                return Err(anyhow!("qemu did not open {}: {e}", path.display()));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}
