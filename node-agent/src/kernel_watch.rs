//! Watching the kernel: read on every sched_ext uevent, and poll as a fallback.

use std::collections::HashSet;
use std::io::Read as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sked_proto::text::escape_and_cap;
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::attacher::{self, LinkMemory, Owner};
use crate::cgroup_ops::{self, CgroupOps, Unread};
use crate::kmsg::{self, Exit};
use crate::metrics::Metrics;
use crate::observation::Observation;
use crate::reactor;
use crate::sysfs::{self, SchedState};
use crate::uevent;
use crate::verdict;

/// Most characters kept of why the cgroup callbacks could not be read.
pub const MAX_UNREAD_CHARS: usize = 256;

/// Where to look, and what this pod expects.
#[derive(Debug)]
pub struct Observer {
    pub sysfs_root: PathBuf,
    pub proc_root: PathBuf,
    pub expected_ops: Option<String>,
    /// Which enable each of the pod's links made.
    pub links: std::sync::Mutex<LinkMemory>,
    /// The running scheduler's cgroup callbacks, read once per enable (and ops name).
    pub cgroup_ops: std::sync::Mutex<Option<CgroupOpsRead>>,
}

/// The cgroup callbacks read for one enable of one ops name: `(enable_seq, ops)`.
#[derive(Debug)]
pub struct CgroupOpsRead {
    key: (Option<u64>, String),
    ops: CgroupOps,
}

impl Observer {
    pub fn observe(&self) -> Observation {
        let read = sysfs::read(&self.sysfs_root);
        let expected_matches = match (&self.expected_ops, &read.ops) {
            (Some(e), Some(ops)) => !e.is_empty() && ops.starts_with(e.as_str()),
            _ => false,
        };
        let enabled = read.supported && read.state == SchedState::Enabled;
        // The ops name decides when it matches expectedOps; /proc is walked anyway until the
        // pod's link is tied to this enable, so a link held past a forced disable is known.
        let link_known = read.enable_seq.is_some_and(|seq| self.lock_links().knows_enable(seq));
        let mut maps = None;
        let owner = if expected_matches && link_known {
            Owner::Unknown("not checked: the ops match expectedOps".into())
        } else if enabled {
            let listed = maps.insert(attacher::sched_ext_map_ids(&self.proc_root));
            if let Err(why) = listed {
                debug!(reason = %why, "checking link holders without the BPF map type");
            }
            let found = attacher::find(&self.proc_root, std::process::id(), listed.as_ref().ok());
            self.current_enable(found, read.enable_seq)
        } else {
            Owner::NotOurs
        };
        let cgroup_ops = match (&read.ops, enabled) {
            (Some(ops), true) => Some(self.cgroup_ops(ops, read.enable_seq, &owner, maps)),
            _ => None,
        };
        let (verdict, reason) = verdict::decide(&read, self.expected_ops.as_deref(), &owner);
        Observation { read, verdict, reason, last_exit: None, cgroup_ops }
    }

    /// The cgroup callbacks of the scheduler running under `ops` (enable `enable_seq`): read
    /// from its struct_ops map once per enable, since a map's programs do not change; a failed
    /// read of the maps is tried again at the next look (the kernel's BTF, which gives the slots'
    /// offsets, is read once for the agent's life: it does not change while the kernel runs). `maps` is the list of sched_ext maps when this look
    /// made it.
    fn cgroup_ops(
        &self,
        ops: &str,
        enable_seq: Option<u64>,
        owner: &Owner,
        maps: Option<Result<HashSet<u32>, attacher::MapsUnknown>>,
    ) -> Result<CgroupOps, String> {
        let key = (enable_seq, ops.to_owned());
        let mut cached = crate::lock(&self.cgroup_ops);
        if let Some(read) = cached.as_ref().filter(|r| r.key == key) {
            return Ok(read.ops);
        }
        let own_map = match owner {
            Owner::Ours { map, .. } => *map,
            _ => None,
        };
        let maps = maps.unwrap_or_else(|| attacher::sched_ext_map_ids(&self.proc_root));
        let read = maps.map_err(Unread::from).and_then(|maps| cgroup_ops::read(ops, &maps, own_map));
        match read {
            Ok(found) => {
                *cached = Some(CgroupOpsRead { key, ops: found });
                Ok(found)
            }
            Err(why) => Err(escape_and_cap(&why.to_string(), MAX_UNREAD_CHARS)),
        }
    }

    /// `found`, unless it is a link of the pod that made an earlier enable than the current one
    /// (`enable_seq`): then the scheduler running now is not the pod's.
    fn current_enable(&self, found: Owner, enable_seq: Option<u64>) -> Owner {
        let (Owner::Ours { link: Some(link), .. }, Some(seq)) = (&found, enable_seq) else { return found };
        if self.lock_links().made_current_enable(*link, seq) { found } else { Owner::NotOurs }
    }

    fn lock_links(&self) -> std::sync::MutexGuard<'_, LinkMemory> {
        crate::lock(&self.links)
    }

    /// Observes for as long as the task runs, publishing changes on `tx`. Uses kernel uevents when the
    /// socket can be opened (it only receives them in the host's network namespace) and polls
    /// every `poll` in any case. Each exit the kernel log tells of (`exits`) is a change too.
    pub async fn run(
        self,
        tx: watch::Sender<Observation>,
        mut exits: watch::Receiver<Option<Exit>>,
        metrics: Arc<Metrics>,
        poll: Duration,
        uevents: bool,
    ) {
        let socket = if uevents {
            let registered = uevent::subscribe().and_then(reactor::register);
            match registered {
                Ok(fd) => Some(fd),
                Err(e) => {
                    warn!(err = %e, "cannot subscribe to kernel uevents; polling only");
                    None
                }
            }
        } else {
            None
        };
        // The first tick is at once: a read after subscribing to uevents catches a change made
        // between the first read (before the loop) and the subscription.
        let mut tick = tokio::time::interval(poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let trigger = match &socket {
                Some(fd) => tokio::select! {
                    _ = tick.tick() => "poll",
                    Ok(()) = exits.changed() => "kmsg",
                    ready = fd.readable() => {
                        match ready {
                            Ok(mut guard) => {
                                let relevant = drain_uevents(guard.get_inner());
                                guard.clear_ready();
                                if !relevant { continue; }
                                "uevent"
                            }
                            Err(_) => "poll",
                        }
                    }
                },
                None => tokio::select! {
                    _ = tick.tick() => "poll",
                    Ok(()) = exits.changed() => "kmsg",
                },
            };
            let mut o = self.observe();
            o.last_exit = exits.borrow_and_update().clone();
            if o.left_without_a_reason(&tx.borrow()) {
                // Reported with its reason (an ejection, or a restart the kernel asked for), so
                // the controller never fails a revision for a restart: the log line is a moment
                // behind the state. Without a kernel log, the wait ends at once or at the bound.
                if let Ok(Ok(())) = tokio::time::timeout(kmsg::REASON_WAIT, exits.changed()).await {
                    o = self.observe();
                    o.last_exit = exits.borrow_and_update().clone();
                }
            }
            metrics.observe(&o);
            let changed = tx.send_if_modified(|current| {
                let differs = o.differs_from(current);
                *current = o.clone();
                differs
            });
            if changed {
                let exit = o.last_exit.as_ref().map_or("", |e| e.reason.as_str());
                info!(trigger, verdict = o.verdict.as_str(), state = o.state_name(), ops = o.read.ops.as_deref().unwrap_or(""), reason = %o.reason, last_exit = exit, "kernel state changed");
            }
        }
    }
}

/// Opens the kernel log at its end, for [`follow_kernel_log`]: older lines were reported by an
/// earlier agent, or happened before any scheduler of this pod ran.
pub fn open_kernel_log(path: &Path) -> std::io::Result<std::fs::File> {
    use std::io::Seek as _;
    let mut file =
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(path)?;
    match file.seek(std::io::SeekFrom::End(0)) {
        // A pipe (the tests' stand-in for the kernel log) has no end to seek to: it starts empty.
        Err(e) if e.raw_os_error() == Some(libc::ESPIPE) => {}
        other => {
            other?;
        }
    }
    Ok(file)
}

/// Follows the kernel log for as long as the task runs, publishing the node's last exit on
/// `tx` and counting exits in `metrics`.
pub async fn follow_kernel_log(file: std::fs::File, tx: watch::Sender<Option<Exit>>, metrics: Arc<Metrics>) {
    let fd = match reactor::register(file) {
        Ok(fd) => fd,
        Err(e) => {
            warn!(err = %e, "cannot watch the kernel log; exits are not reported");
            return;
        }
    };
    metrics.kernel_log_followed.set(1);
    metrics.exits_known(&kmsg::KNOWN_REASONS);
    let mut log = KernelLog { fd, tracker: kmsg::Tracker::default(), buf: vec![0u8; kmsg::MAX_RECORD] };
    loop {
        let mut changed = match log.drain(&metrics).await {
            Ok(changed) => changed,
            Err(e) => {
                warn!(err = %e, "reading the kernel log failed; exits are no longer reported");
                metrics.kernel_log_followed.set(0);
                return;
            }
        };
        // An error exit's detail line follows its own within milliseconds: report them together.
        if changed
            && log.tracker.last().is_some_and(kmsg::Exit::awaits_detail)
            && let Ok(more) = tokio::time::timeout(kmsg::DETAIL_WAIT, log.drain(&metrics)).await
        {
            changed |= more.unwrap_or(false);
        }
        if changed && let Some(exit) = log.tracker.last() {
            info!(ops = %exit.ops, reason = %exit.reason, detail = %exit.detail, ejected = exit.ejected, "the kernel disabled a sched_ext scheduler");
            tx.send_replace(Some(exit.clone()));
        }
    }
}

/// The kernel log being followed, and what was read of it.
struct KernelLog {
    fd: AsyncFd<std::fs::File>,
    tracker: kmsg::Tracker,
    buf: Vec<u8>,
}

impl KernelLog {
    /// Waits for records, then reads every one pending. Returns whether the last exit changed.
    async fn drain(&mut self, metrics: &Metrics) -> std::io::Result<bool> {
        let mut guard = self.fd.readable().await?;
        let mut changed = false;
        loop {
            match guard.get_inner().read(&mut self.buf) {
                // /dev/kmsg never ends; a pipe whose writers are gone does, and stays readable
                // (what was read before the end is published first).
                Ok(0) if changed => return Ok(true),
                Ok(0) => return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the kernel log ended")),
                Ok(n) => {
                    // One record per read from /dev/kmsg; a pipe may hand over several.
                    for raw in self.buf.get(..n).into_iter().flat_map(kmsg::split_records) {
                        let Some(record) = kmsg::parse_record(raw) else { continue };
                        let (new_exit, updated) = self.tracker.feed(&record, wall_ms(record.micros));
                        if let Some(reason) = new_exit {
                            metrics.exit(reason);
                        }
                        changed |= updated;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    guard.clear_ready();
                    return Ok(changed);
                }
                // Records were overwritten before this reader got to them; carry on.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Milliseconds since the epoch of a record logged `micros` after boot: now, less how long ago
/// that was on the kernel's clock.
pub fn wall_ms(micros: u64) -> i64 {
    let now_ms = jiff::Timestamp::now().as_millisecond();
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let since_boot_ms = ts.tv_sec.saturating_mul(1000) + ts.tv_nsec / 1_000_000;
    let logged_ms = i64::try_from(micros / 1000).unwrap_or(i64::MAX);
    now_ms - since_boot_ms.saturating_sub(logged_ms).max(0)
}

/// Reads every pending datagram; true when one was a sched_ext event.
fn drain_uevents(fd: &std::os::fd::OwnedFd) -> bool {
    let mut relevant = false;
    let mut buf = [0u8; 8192];
    loop {
        let len = match rustix::net::recv(fd, &mut buf, rustix::net::RecvFlags::DONTWAIT) {
            Ok((n, _)) if n > 0 => n.min(buf.len()),
            _ => return relevant,
        };
        if uevent::parse(&buf[..len]).is_some_and(|e| e.is_sched_ext()) {
            relevant = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_time_is_now_less_the_age_of_the_record() {
        let now = jiff::Timestamp::now().as_millisecond();
        // Logged at boot: at least as long ago as the machine is up, never in the future.
        assert!(wall_ms(0) <= now);
        assert!(wall_ms(u64::MAX) >= now - 1_000);
    }

    #[tokio::test]
    async fn a_kernel_log_that_ends_is_followed_to_its_last_record_and_no_further() -> std::io::Result<()> {
        use std::io::Write as _;
        use std::os::fd::OwnedFd;
        let (read, mut write) = std::io::pipe()?;
        let read = std::fs::File::from(OwnedFd::from(read));
        // Non-blocking, as open_kernel_log opens the kernel log.
        rustix::fs::fcntl_setfl(&read, rustix::fs::OFlags::NONBLOCK)?;
        write
            .write_all(b"6,385,6913881,-;sched_ext: BPF scheduler \"sked_canary\" disabled (disabled by sysrq-S)\n")?;
        drop(write);
        let (tx, rx) = watch::channel(None);
        let metrics = Arc::new(Metrics::new());
        // Returns (instead of spinning on a pipe that stays readable at its end).
        follow_kernel_log(read, tx, metrics.clone()).await;
        assert_eq!(rx.borrow().as_ref().map(|e| e.reason.as_str()), Some("disabled by sysrq-S"));
        assert_eq!(metrics.kernel_log_followed.get(), 0);
        Ok(())
    }
}
