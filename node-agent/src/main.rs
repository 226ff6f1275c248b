//! sked-agent: reports the kernel's sched_ext state for one node. Until the agent lands it only
//! prints its version.

fn main() {
    println!("sked-agent {}", env!("CARGO_PKG_VERSION"));
}
