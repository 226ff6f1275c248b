//! A name server for the pods of the test node ([`crate::node`]): answers A queries for a fixed
//! table of names (the Services the pods dial) and nothing else, as cluster DNS would for those
//! names. Runs inside the VM as `sked-vm-relay dns`.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};

use anyhow::{Context as _, Result};

const TYPE_A: u16 = 1;
const CLASS_IN: u16 = 1;
const NXDOMAIN: u8 = 3;
const FORMERR: u8 = 1;
const NOTIMP: u8 = 4;

/// The answer to one query packet, or `None` for a packet that is not a query.
pub fn answer(table: &BTreeMap<String, Ipv4Addr>, query: &[u8]) -> Option<Vec<u8>> {
    if query.len() < 12 || query[2] & 0x80 != 0 {
        return None;
    }
    let questions = u16::from_be_bytes([query[4], query[5]]);
    let mut reply = query[..12].to_vec();
    reply[2] = 0x80 | (query[2] & 0x79) | 0x04; // response, opcode and RD copied, authoritative
    reply[3] = 0x80; // recursion available
    reply[6..12].copy_from_slice(&[0, 0, 0, 0, 0, 0]);
    if query[2] & 0x78 != 0 {
        // Not a standard query (opcode 0).
        reply[3] |= NOTIMP;
        reply[4..6].copy_from_slice(&[0, 0]);
        return Some(reply);
    }
    let Some((name, end)) = (questions == 1).then(|| read_name(query, 12)).flatten() else {
        reply[3] |= FORMERR;
        return Some(reply);
    };
    let Some(fixed) = query.get(end..end + 4) else {
        reply[3] |= FORMERR;
        return Some(reply);
    };
    let (qtype, qclass) = (u16::from_be_bytes([fixed[0], fixed[1]]), u16::from_be_bytes([fixed[2], fixed[3]]));
    reply[5] = 1; // the question, echoed
    reply.extend_from_slice(&query[12..end + 4]);
    match table.get(&name) {
        None => reply[3] |= NXDOMAIN,
        Some(address) if qtype == TYPE_A && qclass == CLASS_IN => {
            reply[7] = 1;
            reply.extend_from_slice(&[0xc0, 12]); // the question's name
            reply.extend_from_slice(&TYPE_A.to_be_bytes());
            reply.extend_from_slice(&CLASS_IN.to_be_bytes());
            reply.extend_from_slice(&5u32.to_be_bytes()); // TTL
            reply.extend_from_slice(&4u16.to_be_bytes());
            reply.extend_from_slice(&address.octets());
        }
        // The name exists, without records of that type (AAAA): an empty answer.
        Some(_) => {}
    }
    Some(reply)
}

/// A name of uncompressed labels at `start`, lower-cased without the root dot; and where it ends.
fn read_name(packet: &[u8], start: usize) -> Option<(String, usize)> {
    let mut labels = Vec::new();
    let mut at = start;
    loop {
        let len = usize::from(*packet.get(at)?);
        at += 1;
        if len == 0 {
            return Some((labels.join("."), at));
        }
        if len > 63 {
            return None;
        }
        labels.push(String::from_utf8_lossy(packet.get(at..at + len)?).to_ascii_lowercase());
        at += len;
    }
}

/// Serves `table` on `listen` (UDP) until an error.
pub fn serve(listen: SocketAddr, table: &BTreeMap<String, Ipv4Addr>) -> Result<()> {
    let socket = UdpSocket::bind(listen).with_context(|| format!("listening on {listen} (udp)"))?;
    let mut buf = [0u8; 512];
    loop {
        let (n, peer) = socket.recv_from(&mut buf)?;
        if let Some(reply) = answer(table, &buf[..n]) {
            let _ = socket.send_to(&reply, peer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(name: &str, qtype: u16) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in name.split('.') {
            q.push(label.len() as u8);
            q.extend_from_slice(label.as_bytes());
        }
        q.push(0);
        q.extend_from_slice(&qtype.to_be_bytes());
        q.extend_from_slice(&CLASS_IN.to_be_bytes());
        q
    }

    fn table() -> BTreeMap<String, Ipv4Addr> {
        BTreeMap::from([("sked-reports.sked-system.svc".to_owned(), Ipv4Addr::new(10, 88, 0, 1))])
    }

    #[test]
    fn a_known_name_gets_its_address() {
        let reply = answer(&table(), &query("Sked-Reports.sked-system.svc", TYPE_A)).unwrap();
        assert_eq!(&reply[..2], &[0x12, 0x34]);
        assert_eq!(reply[3] & 0x0f, 0, "NOERROR");
        assert_eq!(u16::from_be_bytes([reply[6], reply[7]]), 1, "one answer");
        assert_eq!(&reply[reply.len() - 4..], &[10, 88, 0, 1]);
    }

    #[test]
    fn other_types_are_empty_and_unknown_names_do_not_exist() {
        let reply = answer(&table(), &query("sked-reports.sked-system.svc", 28)).unwrap();
        assert_eq!((reply[3] & 0x0f, reply[7]), (0, 0));
        let reply = answer(&table(), &query("elsewhere.example", TYPE_A)).unwrap();
        assert_eq!(reply[3] & 0x0f, NXDOMAIN);
    }

    #[test]
    fn garbage_is_refused_or_ignored() {
        assert!(answer(&table(), &[1, 2, 3]).is_none());
        let mut truncated = query("sked-reports.sked-system.svc", TYPE_A);
        truncated.truncate(20);
        assert_eq!(answer(&table(), &truncated).unwrap()[3] & 0x0f, FORMERR);
        let mut update = query("sked-reports.sked-system.svc", TYPE_A);
        update[2] |= 5 << 3;
        assert_eq!(answer(&table(), &update).unwrap()[3] & 0x0f, NOTIMP);
    }
}
