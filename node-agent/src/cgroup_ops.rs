//! Which of the pods' CPU controls the running sched_ext scheduler is handed, read from the
//! kernel.
//!
//! Kubernetes writes a pod's CPU limit to its cgroup's `cpu.max` and its request to
//! `cpu.weight`. For tasks on sched_ext the kernel enforces neither: it passes them to the BPF
//! scheduler through the struct_ops callbacks `cgroup_set_bandwidth` and `cgroup_set_weight`
//! (`cgroup_init` passes both when a cgroup is first seen). A scheduler that lacks them ignores
//! limits and requests.
//!
//! Which ops a scheduler implements is in its struct_ops map: on update the kernel stores the id
//! of the BPF program of each op in the map's user-visible value, and a lookup returns that value
//! (kernel/bpf/bpf_struct_ops.c, "put prog_id to udata"). A zero slot is an op the scheduler
//! does not implement. The slots' offsets come from the kernel's BTF of `sched_ext_ops`; a
//! kernel whose `sched_ext_ops` has no such member hands the scheduler nothing to enforce.
//!
//! Implemented is not kept: a scheduler may take a limit and not enforce it (scx_lavd takes
//! `cgroup_set_bandwidth` and enforces it only with `--enable-cpu-bw`). What the pods get is
//! measured by [`crate::pod_cgroups`].

use std::collections::HashSet;

use libbpf_rs::MapCore as _;
use libbpf_rs::btf::{Btf, types::Struct};

/// Whether the running scheduler takes one of the pods' CPU controls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Support {
    /// The scheduler implements the callback (its program id is in the slot).
    Implemented,
    /// The scheduler does not implement the callback: the control is not enforced.
    Missing,
    /// This kernel's `sched_ext_ops` has no such callback: nothing passes the control to a
    /// sched_ext scheduler, so it is not enforced either.
    NotInKernel,
}

/// The running scheduler's cgroup callbacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CgroupOps {
    /// `cgroup_set_bandwidth`: CPU limits (`cpu.max`).
    pub limits: Support,
    /// `cgroup_set_weight`: CPU requests (`cpu.weight`).
    pub requests: Support,
}

/// Parses the kernel's BTF for the layout and the sched_ext map type, on a blocking thread, so
/// the first attach is not reported late for it (under emulation the parse takes most of a
/// second). The results are kept for the agent's life.
pub fn warm_up() {
    std::thread::spawn(|| {
        let _ = Layout::of_kernel();
        let _ = crate::attacher::sched_ext_value_type();
    });
}

/// Where the slots are in a `bpf_struct_ops_sched_ext_ops` value, in bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The ops name (`char name[SCX_OPS_NAME_LEN]`): offset and length.
    pub name: (usize, usize),
    /// The program slot of `cgroup_set_bandwidth`, when the kernel has it.
    pub bandwidth: Option<usize>,
    /// The program slot of `cgroup_set_weight`, when the kernel has it.
    pub weight: Option<usize>,
}

/// Why the callbacks could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unread {
    #[error("nothing is attached")]
    NotAttached,
    #[error(transparent)]
    Maps(#[from] crate::attacher::MapsUnknown),
    #[error("this kernel's BTF has no {0}")]
    NoType(&'static str),
    #[error("no sched_ext struct_ops map is named {0:?}")]
    NoMap(String),
    #[error("{count} sched_ext struct_ops maps are named {ops:?} and differ in their cgroup callbacks")]
    Ambiguous { ops: String, count: usize },
    #[error("reading struct_ops map {id}: {why}")]
    Lookup { id: u32, why: String },
}

impl Layout {
    /// The layout this kernel's BTF gives, looked up once (the kernel's BTF does not change while
    /// it runs).
    pub fn of_kernel() -> Result<Self, Unread> {
        static LAYOUT: std::sync::OnceLock<Result<Layout, Unread>> = std::sync::OnceLock::new();
        LAYOUT.get_or_init(Self::from_btf).clone()
    }

    fn from_btf() -> Result<Self, Unread> {
        use crate::attacher::MapsUnknown;
        let btf = Btf::from_vmlinux().map_err(|e| MapsUnknown::NoBtf(e.to_string()))?;
        let value = btf
            .type_by_name::<Struct<'_>>("bpf_struct_ops_sched_ext_ops")
            .ok_or(Unread::NoType("bpf_struct_ops_sched_ext_ops"))?;
        let data = member_offset(&value, "data").ok_or(Unread::NoType("bpf_struct_ops_sched_ext_ops.data"))?;
        let ops = btf.type_by_name::<Struct<'_>>("sched_ext_ops").ok_or(Unread::NoType("sched_ext_ops"))?;
        let name = member_offset(&ops, "name").ok_or(Unread::NoType("sched_ext_ops.name"))?;
        Ok(Self {
            // SCX_OPS_NAME_LEN: the kernel's ops names are at most 127 characters and a NUL.
            name: (data + name, 128),
            bandwidth: member_offset(&ops, "cgroup_set_bandwidth").map(|o| data + o),
            weight: member_offset(&ops, "cgroup_set_weight").map(|o| data + o),
        })
    }

    /// The ops name in a map's value (up to its first NUL).
    pub fn ops_name(&self, value: &[u8]) -> Option<String> {
        let (at, len) = self.name;
        let bytes = value.get(at..at.checked_add(len)?)?;
        let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
        Some(String::from_utf8_lossy(&bytes[..end]).into_owned())
    }

    /// The callbacks a map's value shows; `None` when the value is too short for the layout.
    pub fn cgroup_ops(&self, value: &[u8]) -> Option<CgroupOps> {
        let slot = |at: Option<usize>| -> Option<Support> {
            let Some(at) = at else { return Some(Support::NotInKernel) };
            let bytes: [u8; 8] = value.get(at..at.checked_add(8)?)?.try_into().ok()?;
            Some(if u64::from_ne_bytes(bytes) == 0 { Support::Missing } else { Support::Implemented })
        };
        Some(CgroupOps { limits: slot(self.bandwidth)?, requests: slot(self.weight)? })
    }
}

/// A member's byte offset in a struct (BTF gives bits; the slots are never bitfields).
fn member_offset(s: &Struct<'_>, name: &str) -> Option<usize> {
    s.iter().find(|m| m.name.is_some_and(|n| n == name)).map(|m| match m.attr {
        libbpf_rs::btf::types::MemberAttr::Normal { offset }
        | libbpf_rs::btf::types::MemberAttr::BitField { offset, .. } => offset as usize / 8,
    })
}

/// The cgroup callbacks of the scheduler the kernel runs under the ops name `ops`: read from the
/// sched_ext struct_ops maps `maps` named so. `own_map` (the map of this pod's link, when known)
/// decides among several of that name.
pub fn read(ops: &str, maps: &HashSet<u32>, own_map: Option<u32>) -> Result<CgroupOps, Unread> {
    let layout = Layout::of_kernel()?;
    let mut found = Vec::new();
    for id in maps.iter().copied().filter(|id| own_map.is_none_or(|own| own == *id)) {
        let value = lookup(id)?;
        if layout.ops_name(&value).as_deref() == Some(ops) {
            let seen = layout.cgroup_ops(&value).ok_or_else(|| Unread::Lookup { id, why: "value too short".into() })?;
            found.push(seen);
        }
    }
    decide(ops, &found)
}

/// One answer from the maps that carry the running ops name: the one, or the one they agree on.
pub fn decide(ops: &str, found: &[CgroupOps]) -> Result<CgroupOps, Unread> {
    match found {
        [] => Err(Unread::NoMap(ops.to_owned())),
        [first, rest @ ..] if rest.iter().all(|o| o == first) => Ok(*first),
        _ => Err(Unread::Ambiguous { ops: ops.to_owned(), count: found.len() }),
    }
}

/// The value of struct_ops map `id` (its one key, 0).
fn lookup(id: u32) -> Result<Vec<u8>, Unread> {
    let why = |e: libbpf_rs::Error| Unread::Lookup { id, why: e.to_string() };
    let map = libbpf_rs::MapHandle::from_map_id(id).map_err(why)?;
    map.lookup(&0u32.to_ne_bytes(), libbpf_rs::MapFlags::ANY)
        .map_err(why)?
        .ok_or_else(|| Unread::Lookup { id, why: "no value".into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(bandwidth: Option<usize>, weight: Option<usize>) -> Layout {
        Layout { name: (16, 128), bandwidth, weight }
    }

    fn value(name: &str, slots: &[(usize, u64)]) -> Vec<u8> {
        let mut v = vec![0u8; 512];
        v[16..16 + name.len()].copy_from_slice(name.as_bytes());
        for (at, id) in slots {
            v[*at..*at + 8].copy_from_slice(&id.to_ne_bytes());
        }
        v
    }

    #[test]
    fn a_zero_slot_is_a_missing_op_and_a_program_id_an_implemented_one() {
        let l = layout(Some(256), Some(264));
        let bpfland = value("bpfland_1.1.4", &[]);
        assert_eq!(l.ops_name(&bpfland).as_deref(), Some("bpfland_1.1.4"));
        let missing = CgroupOps { limits: Support::Missing, requests: Support::Missing };
        assert_eq!(l.cgroup_ops(&bpfland), Some(missing));
        let lavd = value("lavd", &[(256, 41)]);
        assert_eq!(l.cgroup_ops(&lavd), Some(CgroupOps { limits: Support::Implemented, requests: Support::Missing }));
        let both = value("both", &[(256, 41), (264, 42)]);
        let implemented = CgroupOps { limits: Support::Implemented, requests: Support::Implemented };
        assert_eq!(l.cgroup_ops(&both), Some(implemented));
    }

    #[test]
    fn a_kernel_without_the_callback_hands_the_scheduler_nothing() {
        let l = layout(None, Some(264));
        let ops = l.cgroup_ops(&value("x", &[(264, 7)]));
        assert_eq!(ops, Some(CgroupOps { limits: Support::NotInKernel, requests: Support::Implemented }));
    }

    #[test]
    fn a_short_value_is_not_read() {
        let l = layout(Some(600), None);
        assert_eq!(l.cgroup_ops(&value("x", &[])), None);
        assert_eq!(Layout { name: (500, 128), ..l }.ops_name(&[0; 512]), None);
        assert_eq!(layout(Some(usize::MAX - 2), None).cgroup_ops(&[0; 8]), None, "no overflow");
    }

    #[test]
    fn maps_of_one_name_answer_only_when_they_agree() {
        let a = CgroupOps { limits: Support::Missing, requests: Support::Missing };
        let b = CgroupOps { limits: Support::Implemented, requests: Support::Missing };
        assert_eq!(decide("s", &[a]), Ok(a));
        assert_eq!(decide("s", &[a, a]), Ok(a));
        assert_eq!(decide("s", &[]), Err(Unread::NoMap("s".into())));
        assert_eq!(decide("s", &[a, b]), Err(Unread::Ambiguous { ops: "s".into(), count: 2 }));
    }
}
