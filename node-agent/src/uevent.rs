//! Kernel uevents on the NETLINK_KOBJECT_UEVENT socket. sched_ext sends `ACTION=add` when a
//! scheduler is enabled and `ACTION=remove` when it is disabled, with
//! `DEVPATH=/kernel/sched_ext/root` and `SUBSYSTEM=sched_ext`. They are only a trigger: the
//! agent then reads the files (SCXOPS is not trusted on remove).

use std::collections::BTreeMap;
use std::io;
use std::os::fd::OwnedFd;

/// One parsed kernel uevent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Uevent {
    pub action: String,
    pub devpath: String,
    pub vars: BTreeMap<String, String>,
}

impl Uevent {
    pub fn subsystem(&self) -> Option<&str> {
        self.vars.get("SUBSYSTEM").map(String::as_str)
    }

    /// Whether this is sched_ext announcing an enable or a disable.
    pub fn is_sched_ext(&self) -> bool {
        self.subsystem() == Some("sched_ext") || self.devpath.starts_with("/kernel/sched_ext")
    }
}

/// Parses a kernel uevent datagram: `action@devpath\0KEY=VALUE\0...`. Messages from udev
/// (`libudev` magic) and anything malformed give `None`.
pub fn parse(buf: &[u8]) -> Option<Uevent> {
    let mut fields = buf.split(|b| *b == 0).filter(|f| !f.is_empty());
    let header = std::str::from_utf8(fields.next()?).ok()?;
    let (action, devpath) = header.split_once('@')?;
    if action.is_empty() || !devpath.starts_with('/') {
        return None;
    }
    let mut vars = BTreeMap::new();
    for field in fields {
        let Ok(text) = std::str::from_utf8(field) else { continue };
        if let Some((k, v)) = text.split_once('=') {
            vars.insert(k.to_owned(), v.to_owned());
        }
    }
    Some(Uevent { action: action.to_owned(), devpath: devpath.to_owned(), vars })
}

/// Opens a non-blocking socket subscribed to kernel uevents (multicast group 1).
pub fn subscribe() -> io::Result<OwnedFd> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType, netlink};
    let fd = rustix::net::socket_with(
        AddressFamily::NETLINK,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        Some(netlink::KOBJECT_UEVENT),
    )?;
    rustix::net::bind(&fd, &netlink::SocketAddrNetlink::new(0, 1))?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_sched_ext_enable_event() {
        let msg = b"add@/kernel/sched_ext/root\0ACTION=add\0DEVPATH=/kernel/sched_ext/root\0SUBSYSTEM=sched_ext\0SEQNUM=1234\0SCXOPS=sked_canary\0";
        let ev = parse(msg).unwrap();
        assert_eq!(ev.action, "add");
        assert_eq!(ev.devpath, "/kernel/sched_ext/root");
        assert!(ev.is_sched_ext());
        assert_eq!(ev.vars.get("SCXOPS").map(String::as_str), Some("sked_canary"));
    }

    #[test]
    fn other_subsystems_are_not_sched_ext() {
        let msg = b"change@/devices/system/cpu/cpu1\0ACTION=change\0SUBSYSTEM=cpu\0";
        assert!(!parse(msg).unwrap().is_sched_ext());
    }

    #[test]
    fn udev_and_garbage_are_ignored() {
        assert_eq!(parse(b"libudev\0\xfe\xed\xca\xfe"), None);
        assert_eq!(parse(b""), None);
        assert_eq!(parse(b"\0\0\0"), None);
        assert_eq!(parse(b"no-at-sign\0A=B\0"), None);
        assert_eq!(parse(b"add@relative\0"), None);
        assert!(parse(b"remove@/kernel/sched_ext/root\0\xff\xff\0SUBSYSTEM=sched_ext\0").unwrap().is_sched_ext());
    }
}
