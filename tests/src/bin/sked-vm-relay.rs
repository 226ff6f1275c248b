//! Inside the test VM: carries TCP connections made to a local address over a virtio console
//! port to the host (see `sked_tests::vmlink`). Usage: `sked-vm-relay PORT_DEVICE LISTEN_ADDR`.

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [port, listen] = args.as_slice() else {
        eprintln!("usage: sked-vm-relay /dev/vport0p1 127.0.0.1:8443");
        return std::process::ExitCode::FAILURE;
    };
    let listen = match listen.parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("sked-vm-relay: {listen:?} is not an address: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match sked_tests::vmlink::serve_guest_side(port, listen) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sked-vm-relay: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
