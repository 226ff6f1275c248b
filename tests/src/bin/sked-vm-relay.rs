//! Inside the test VM:
//! - `sked-vm-relay PORT_DEVICE LISTEN_ADDR` carries TCP connections made to a local address
//!   over a virtio console port to the host (see `sked_tests::vmlink`);
//! - `sked-vm-relay dns LISTEN_ADDR NAME=IPV4...` answers those names for the node's pods (see
//!   `sked_tests::vmdns`).

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.as_slice() {
        [dns, listen, names @ ..] if dns == "dns" => serve_dns(listen, names),
        [port, listen] => listen
            .parse()
            .map_err(|e| anyhow::anyhow!("{listen:?} is not an address: {e}"))
            .and_then(|listen| sked_tests::vmlink::serve_guest_side(port, listen)),
        _ => Err(anyhow::anyhow!(
            "usage: sked-vm-relay /dev/vport0p1 127.0.0.1:8443 | sked-vm-relay dns 0.0.0.0:53 NAME=IPV4..."
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sked-vm-relay: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn serve_dns(listen: &str, names: &[String]) -> anyhow::Result<()> {
    let listen = listen.parse().map_err(|e| anyhow::anyhow!("{listen:?} is not an address: {e}"))?;
    let mut table = std::collections::BTreeMap::new();
    for entry in names {
        let (name, ip) = entry.split_once('=').ok_or_else(|| anyhow::anyhow!("{entry:?} is not NAME=IPV4"))?;
        let ip = ip.parse().map_err(|e| anyhow::anyhow!("{ip:?} is not an IPv4 address: {e}"))?;
        table.insert(name.trim_end_matches('.').to_ascii_lowercase(), ip);
    }
    sked_tests::vmdns::serve(listen, &table)
}
