//! Attaches a sched_ext scheduler from a BPF object (the real-kernel tests run it inside the
//! VM). Two ways, like the two ways schedulers run in practice:
//!
//! - `sked-canary-loader hold OBJ`: holds the struct_ops link while it runs, as a scheduler
//!   process in a pod does; the scheduler detaches when the process is killed.
//! - `sked-canary-loader pin OBJ PATH`: pins the link in bpffs and exits, as a scheduler
//!   started by hand with `bpftool struct_ops register` does; removing PATH detaches it.
//!
//! It prints `attached <ops map> <unix time in ns>` once the kernel accepted the scheduler.

use std::process::ExitCode;

use anyhow::{Context as _, Result, bail};
use libbpf_rs::{MapCore as _, ObjectBuilder};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sked-canary-loader: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mode, object, pin) = match args.as_slice() {
        [mode, object] if mode == "hold" => (mode.as_str(), object, None),
        [mode, object, path] if mode == "pin" => (mode.as_str(), object, Some(path)),
        _ => bail!("usage: sked-canary-loader hold OBJ | sked-canary-loader pin OBJ PATH"),
    };
    let open = ObjectBuilder::default().open_file(object).with_context(|| format!("opening {object}"))?;
    let mut loaded = open.load().with_context(|| format!("loading {object} into the kernel"))?;
    let mut links = Vec::new();
    for mut map in loaded.maps_mut() {
        if map.map_type() != libbpf_rs::MapType::StructOps {
            continue;
        }
        let name = map.name().to_string_lossy().into_owned();
        let mut link = map.attach_struct_ops().with_context(|| format!("attaching struct_ops {name}"))?;
        if let Some(path) = pin {
            link.pin(path).with_context(|| format!("pinning the link at {path}"))?;
        }
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        println!("attached {name} {}", now.as_nanos());
        links.push(link);
    }
    if links.is_empty() {
        bail!("{object} has no struct_ops map to attach");
    }
    if mode == "hold" {
        // Until a signal ends the process; the kernel then releases the links.
        loop {
            std::thread::park();
        }
    }
    Ok(())
}
