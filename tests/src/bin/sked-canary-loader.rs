//! Attaches a sched_ext scheduler from a BPF object (the real-kernel tests run it inside the
//! VM). Two ways, like the two ways schedulers run in practice:
//!
//! - `sked-canary-loader hold OBJ`: holds the struct_ops link while it runs, as a scheduler
//!   process in a pod does; the scheduler detaches when the process is killed. When the kernel
//!   disables the scheduler and asks for a restart (`SCX_ECODE_ACT_RESTART` in the exit code the
//!   object's `exit` op recorded: a CPU went on or off line), it loads and attaches it again, as
//!   scx_utils schedulers do; after any other exit it holds on, detached.
//! - `sked-canary-loader pin OBJ PATH`: pins the link in bpffs and exits, as a scheduler
//!   started by hand with `bpftool struct_ops register` does; removing PATH detaches it.
//! - `sked-canary-loader spin N`: N threads that want a CPU each, for ever: a workload that
//!   wants more than its CPU limit (the canary image has no shell to loop in).
//!
//! It prints `attached <ops map> <unix time in ns>` each time the kernel accepted the scheduler,
//! and `restart <exit code>` when the kernel asked for a restart.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use libbpf_rs::{Link, MapCore as _, MapFlags, Object, ObjectBuilder};

/// The action bit of an exit code that asks user space to register the scheduler again
/// (the kernel's `enum scx_exit_code`).
const SCX_ECODE_ACT_RESTART: i64 = 1 << 48;

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
    if let [mode, threads] = args.as_slice()
        && mode == "spin"
    {
        let threads: usize = threads.parse().with_context(|| format!("spin {threads}: not a number of threads"))?;
        for _ in 1..threads {
            std::thread::spawn(spin);
        }
        spin();
    }
    let (object, pin) = match args.as_slice() {
        [mode, object] if mode == "hold" => (object, None),
        [mode, object, path] if mode == "pin" => (object, Some(path.as_str())),
        _ => bail!("usage: sked-canary-loader hold OBJ | sked-canary-loader pin OBJ PATH | sked-canary-loader spin N"),
    };
    let (mut loaded, mut links) = attach(object, pin)?;
    if pin.is_some() {
        return Ok(());
    }
    // Until a signal ends the process; the kernel then releases the links.
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let Some(code) = exit_code(&loaded)? else { continue };
        if code & SCX_ECODE_ACT_RESTART == 0 {
            // Ejected or unregistered for good: hold on, detached, as a scheduler process that
            // does not restart by itself would.
            loop {
                std::thread::park();
            }
        }
        println!("restart {code:#x}");
        drop(links);
        drop(loaded);
        (loaded, links) = attach_again(object)?;
    }
}

/// Loads `object` and attaches its struct_ops maps (pinning the link at `pin`).
fn attach(object: &str, pin: Option<&str>) -> Result<(Object, Vec<Link>)> {
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
    Ok((loaded, links))
}

/// Attaches `object` again after a restart: the kernel may still be disabling the last
/// instance (it refuses a second one meanwhile), so a few tries, 100 ms apart.
fn attach_again(object: &str) -> Result<(Object, Vec<Link>)> {
    let mut tries = 0;
    loop {
        match attach(object, None) {
            Ok(attached) => return Ok(attached),
            Err(e) if tries < 50 => {
                tries += 1;
                eprintln!("sked-canary-loader: attaching again: {e:#}");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(e),
        }
    }
}

/// The exit code the object's `exit` op recorded (its `sked_exit` in .bss), once it ran.
fn exit_code(loaded: &Object) -> Result<Option<i64>> {
    let Some(bss) = loaded.maps().find(|m| m.name().to_string_lossy().ends_with(".bss")) else { return Ok(None) };
    let Some(value) = bss.lookup(&0u32.to_ne_bytes(), MapFlags::ANY)? else { return Ok(None) };
    let word = |at: usize| value.get(at..at + 8).and_then(|b| <[u8; 8]>::try_from(b).ok()).map(i64::from_ne_bytes);
    match (word(0), word(8)) {
        (Some(code), Some(exited)) if exited != 0 => Ok(Some(code)),
        _ => Ok(None),
    }
}

/// Wants a CPU for ever.
fn spin() -> ! {
    let mut n: u64 = 0;
    loop {
        n = std::hint::black_box(n.wrapping_add(1));
    }
}
