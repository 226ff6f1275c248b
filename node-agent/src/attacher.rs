//! Who attached the running sched_ext scheduler: a process of this pod, or someone else.
//!
//! The pod shares one process namespace, so the agent sees the scheduler container's processes
//! under /proc. A process that attached a sched_ext scheduler holds a BPF link of type
//! `struct_ops` (its fdinfo shows `link_type: struct_ops` and the `map_id` of the ops map);
//! reading another container's fdinfo needs CAP_SYS_PTRACE. With CAP_SYS_ADMIN (walking the
//! kernel's map ids needs it; CAP_BPF alone does not allow it) the agent also lists the kernel's
//! struct_ops maps with libbpf and keeps only those whose vmlinux value type is `sched_ext_ops`,
//! so another kind of struct_ops (a TCP congestion control, say) is not mistaken for a scheduler.

use std::collections::HashSet;
use std::fs;
use std::path::Path;

use sked_proto::text::{MAX_NAME_CHARS, escape_and_cap};

/// Ownership of the attached scheduler, as far as this pod can see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owner {
    /// A process in this pod holds the sched_ext struct_ops link `link` to the ops map `map`
    /// (their ids, when shown).
    Ours { pid: u32, comm: String, link: Option<u32>, map: Option<u32> },
    /// Every process of the pod was inspected and none holds it.
    NotOurs,
    /// The pod's processes could not be inspected.
    Unknown(String),
}

/// Ids of the kernel's struct_ops maps whose value type is `sched_ext_ops`, or why they cannot
/// be listed.
pub fn sched_ext_map_ids(proc_root: &Path) -> Result<HashSet<u32>, MapsUnknown> {
    if !Capabilities::of_self(proc_root).sys_admin {
        return Err(MapsUnknown::NoSysAdmin);
    }
    let value_type = sched_ext_value_type()?;
    Ok(libbpf_rs::query::MapInfoIter::default()
        .filter(|info| info.ty == libbpf_rs::MapType::StructOps && info.btf_vmlinux_value_type_id == value_type)
        .map(|info| info.id)
        .collect())
}

/// Why the sched_ext struct_ops maps cannot be told apart from the others.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MapsUnknown {
    #[error("the agent lacks CAP_SYS_ADMIN, which listing BPF maps needs (CAP_BPF alone does not allow it)")]
    NoSysAdmin,
    /// The kernel's BTF did not load (the library's words).
    #[error("loading vmlinux BTF: {0}")]
    NoBtf(String),
    #[error("this kernel's BTF has no bpf_struct_ops_sched_ext_ops")]
    NoSchedExtType,
}

/// The vmlinux BTF type id of `bpf_struct_ops_sched_ext_ops`, looked up once (parsing the
/// kernel's BTF takes milliseconds; the id does not change while the kernel runs).
pub(crate) fn sched_ext_value_type() -> Result<u32, MapsUnknown> {
    static TYPE_ID: std::sync::OnceLock<Result<u32, MapsUnknown>> = std::sync::OnceLock::new();
    TYPE_ID
        .get_or_init(|| {
            // Kept as text: the library's error is neither Clone nor wanted past its words.
            let btf = libbpf_rs::btf::Btf::from_vmlinux().map_err(|e| MapsUnknown::NoBtf(e.to_string()))?;
            btf.type_by_name::<libbpf_rs::btf::BtfType<'_>>("bpf_struct_ops_sched_ext_ops")
                .map(|t| u32::from(t.type_id()))
                .ok_or(MapsUnknown::NoSchedExtType)
        })
        .clone()
}

/// The capabilities the owner check uses, as the agent holds them (effective set).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// CAP_SYS_ADMIN (21): walk the kernel's BPF map ids.
    pub sys_admin: bool,
    /// CAP_SYS_PTRACE (19): read the scheduler container's `/proc/<pid>/fdinfo`.
    pub sys_ptrace: bool,
}

impl Capabilities {
    /// From a `/proc/<pid>/status` text; none when it cannot be read.
    pub fn parse(status: &str) -> Self {
        let effective = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            .unwrap_or(0);
        Self { sys_admin: effective & (1 << 21) != 0, sys_ptrace: effective & (1 << 19) != 0 }
    }

    /// This process's capabilities.
    pub fn of_self(proc_root: &Path) -> Self {
        Self::parse(&fs::read_to_string(proc_root.join("self/status")).unwrap_or_default())
    }

    /// What is missing, each with what it costs.
    pub fn missing(self) -> Vec<(&'static str, &'static str)> {
        let mut missing = Vec::new();
        if !self.sys_admin {
            missing.push((
                "CAP_SYS_ADMIN",
                "BPF maps cannot be listed, so any struct_ops link of the pod counts as the scheduler's",
            ));
        }
        if !self.sys_ptrace {
            missing.push((
                "CAP_SYS_PTRACE",
                "the scheduler container's links cannot be read, so only spec.expectedOps can prove attachment",
            ));
        }
        missing
    }
}

/// Finds a process under `proc_root` (other than `self_pid`) holding a struct_ops link; when
/// `sched_ext_maps` is known, the link's map must be one of them.
pub fn find(proc_root: &Path, self_pid: u32, sched_ext_maps: Option<&HashSet<u32>>) -> Owner {
    let Ok(entries) = fs::read_dir(proc_root) else {
        return Owner::Unknown(format!("cannot list {}", proc_root.display()));
    };
    let mut unreadable = None;
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if pid == self_pid {
            continue;
        }
        let fdinfo = entry.path().join("fdinfo");
        let files = match fs::read_dir(&fdinfo) {
            Ok(files) => files,
            Err(e) => {
                // A process that exited meanwhile is fine; one we may not inspect is not.
                if e.kind() == std::io::ErrorKind::PermissionDenied {
                    unreadable.get_or_insert_with(|| format!("cannot read {}: {e}", fdinfo.display()));
                }
                continue;
            }
        };
        for file in files.flatten() {
            let Ok(text) = fs::read_to_string(file.path()) else { continue };
            if let Some(link) = struct_ops_link(&text)
                && sched_ext_maps.is_none_or(|ids| link.map_id.is_some_and(|id| ids.contains(&id)))
            {
                let comm = fs::read(entry.path().join("comm")).unwrap_or_default();
                let comm = escape_and_cap(String::from_utf8_lossy(&comm).trim(), MAX_NAME_CHARS);
                return Owner::Ours { pid, comm, link: link.link_id, map: link.map_id };
            }
        }
    }
    match unreadable {
        Some(why) => Owner::Unknown(why),
        None => Owner::NotOurs,
    }
}

/// A struct_ops BPF link as its fdinfo shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StructOpsLink {
    pub link_id: Option<u32>,
    pub map_id: Option<u32>,
}

/// If an fdinfo text describes a struct_ops BPF link, its ids (when shown).
pub fn struct_ops_link(fdinfo: &str) -> Option<StructOpsLink> {
    let mut is_struct_ops = false;
    let mut link = StructOpsLink { link_id: None, map_id: None };
    for line in fdinfo.lines() {
        let Some((key, value)) = line.split_once(':') else { continue };
        match key.trim() {
            "link_type" => is_struct_ops = value.trim() == "struct_ops",
            "link_id" => link.link_id = value.trim().parse().ok(),
            "map_id" => link.map_id = value.trim().parse().ok(),
            _ => {}
        }
    }
    is_struct_ops.then_some(link)
}

/// Which enable of sched_ext each of the pod's links made.
///
/// A link attaches its scheduler once. When the kernel forces a scheduler off (a watchdog stall,
/// an error, SysRq-S) its process may keep holding the link, still naming the same map, and
/// another scheduler can then attach: the pod's link is no proof any more. So the first time a
/// link is seen while sched_ext is enabled, it is tied to that enable (`enable_seq`); under a
/// later enable the same link is stale. A link first seen by an agent that started after such a
/// hand-over cannot be told apart; `spec.expectedOps` decides that case.
#[derive(Debug, Default)]
pub struct LinkMemory {
    enabled_by: std::collections::HashMap<u32, u64>,
}

impl LinkMemory {
    /// Whether some link of the pod is known to have made the enable `enable_seq`.
    pub fn knows_enable(&self, enable_seq: u64) -> bool {
        self.enabled_by.values().any(|seq| *seq == enable_seq)
    }

    /// Whether the pod's `link` made the current enable `enable_seq`; remembers it when new.
    pub fn made_current_enable(&mut self, link: u32, enable_seq: u64) -> bool {
        // Links of schedulers long gone are forgotten.
        if self.enabled_by.len() > 64 {
            self.enabled_by.retain(|_, seq| *seq + 64 > enable_seq);
        }
        *self.enabled_by.entry(link).or_insert(enable_seq) == enable_seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINK: &str =
        "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\nlink_type:\tstruct_ops\nlink_id:\t3\nmap_id:\t12\n";
    const FILE: &str = "pos:\t0\nflags:\t0100000\nmnt_id:\t22\nino:\t77\n";

    fn proc_tree(procs: &[(u32, &str, &[&str])]) -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        for (pid, comm, fds) in procs {
            let dir = tmp.path().join(pid.to_string());
            fs::create_dir_all(dir.join("fdinfo")).unwrap();
            fs::write(dir.join("comm"), format!("{comm}\n")).unwrap();
            for (i, fd) in fds.iter().enumerate() {
                fs::write(dir.join("fdinfo").join(i.to_string()), fd).unwrap();
            }
        }
        tmp
    }

    #[test]
    fn parses_struct_ops_links_only() {
        assert_eq!(struct_ops_link(LINK), Some(StructOpsLink { link_id: Some(3), map_id: Some(12) }));
        assert_eq!(struct_ops_link(FILE), None);
        assert_eq!(struct_ops_link("link_type:\tstruct_ops\n"), Some(StructOpsLink { link_id: None, map_id: None }));
        assert_eq!(struct_ops_link("link_type:\ttracing\nmap_id:\t3\n"), None);
    }

    #[test]
    fn the_pod_s_scheduler_process_owns_the_link() {
        let tree = proc_tree(&[(1, "pause", &[FILE]), (7, "scx_rusty", &[FILE, LINK]), (9, "sked-agent", &[LINK])]);
        // pid 9 is the agent itself and is skipped.
        assert_eq!(
            find(tree.path(), 9, None),
            Owner::Ours { pid: 7, comm: "scx_rusty".into(), link: Some(3), map: Some(12) }
        );
        assert_eq!(
            find(tree.path(), 9, Some(&HashSet::from([12]))),
            Owner::Ours { pid: 7, comm: "scx_rusty".into(), link: Some(3), map: Some(12) }
        );
        // A struct_ops link of another kind (map 99 is not sched_ext_ops) does not count.
        let tree = proc_tree(&[(7, "tcp_cc_loader", &[&LINK.replace("map_id:\t12", "map_id:\t99")])]);
        assert_eq!(find(tree.path(), 1, Some(&HashSet::from([12]))), Owner::NotOurs);
    }

    #[test]
    fn no_holder_in_the_pod_is_not_ours() {
        let tree = proc_tree(&[(1, "pause", &[FILE]), (7, "sh", &[])]);
        assert_eq!(find(tree.path(), 99, None), Owner::NotOurs);
        assert!(matches!(find(Path::new("/nonexistent/proc"), 1, None), Owner::Unknown(_)));
    }

    #[test]
    fn a_link_held_past_its_enable_is_stale() {
        let mut memory = LinkMemory::default();
        assert!(memory.made_current_enable(3, 1), "first seen under enable 1");
        assert!(memory.made_current_enable(3, 1), "still enable 1");
        // The kernel forced it off and another scheduler attached: enable 2, same link held.
        assert!(!memory.made_current_enable(3, 2));
        // The pod's scheduler restarts with a new link: enable 3 is its own.
        assert!(memory.made_current_enable(4, 3));
    }

    #[test]
    fn capabilities_come_from_capeff() {
        let all = Capabilities::parse("Name:\tx\nCapEff:\t000001ffffffffff\n");
        assert_eq!(all, Capabilities { sys_admin: true, sys_ptrace: true });
        assert!(all.missing().is_empty());
        // CAP_BPF alone cannot walk map ids: it is not enough.
        let bpf_only = Capabilities::parse("CapEff:\t0000008000000000\n");
        assert!(!bpf_only.sys_admin);
        let names: Vec<&str> = bpf_only.missing().iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["CAP_SYS_ADMIN", "CAP_SYS_PTRACE"]);
        assert!(Capabilities::parse("CapEff:\t0000000000200000\n").sys_admin, "CAP_SYS_ADMIN");
        assert!(Capabilities::parse("CapEff:\t0000000000080000\n").sys_ptrace, "CAP_SYS_PTRACE");
        assert_eq!(Capabilities::parse("garbage"), Capabilities { sys_admin: false, sys_ptrace: false });
    }
}
