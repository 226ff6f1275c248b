//! The agent keeps only the capabilities it uses. The pod grants more (the template stays as it
//! is, so running schedulers are not restarted for it); the process drops the rest at start,
//! before any other thread exists, so every thread runs with the three it needs:
//! CAP_SYS_ADMIN (walking BPF map ids), CAP_SYS_PTRACE (reading the scheduler container's
//! `/proc/<pid>/fdinfo`) and CAP_SYSLOG (reading `/dev/kmsg` where `kernel.dmesg_restrict` is set).

use caps::{CapSet, Capability, CapsHashSet};

/// The capabilities the agent uses.
pub const USED: [Capability; 3] = [Capability::CAP_SYS_ADMIN, Capability::CAP_SYS_PTRACE, Capability::CAP_SYSLOG];

/// Drops every capability but [`USED`] from this thread's effective, permitted, inheritable and
/// ambient sets. Call it before starting threads: they inherit the result. Returns the names
/// of the capabilities dropped, sorted.
pub fn keep_only_used() -> Result<Vec<String>, String> {
    let permitted = caps::read(None, CapSet::Permitted).map_err(|e| format!("reading capabilities: {e}"))?;
    let keep: CapsHashSet = permitted.iter().copied().filter(|c| USED.contains(c)).collect();
    let mut dropped: Vec<String> = permitted.difference(&keep).map(ToString::to_string).collect();
    dropped.sort();
    caps::clear(None, CapSet::Ambient).map_err(|e| format!("clearing ambient capabilities: {e}"))?;
    // Effective must stay within permitted: shrink it first.
    for set in [CapSet::Effective, CapSet::Permitted] {
        caps::set(None, set, &keep).map_err(|e| format!("dropping unused capabilities ({set:?}): {e}"))?;
    }
    caps::clear(None, CapSet::Inheritable).map_err(|e| format!("clearing inheritable capabilities: {e}"))?;
    Ok(dropped)
}
