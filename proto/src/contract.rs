//! Names the controller puts into a scheduler pod and the agent reads there. The controller
//! builds the pod from these; the agent's flag defaults are these; neither side spells them.

/// Audience of the agent's projected service-account token; the reports server reviews tokens
/// for it.
pub const REPORTS_AUDIENCE: &str = "sked-reports";

/// Port of the agent's `/readyz`, `/healthz` and `/metrics`.
pub const AGENT_PORT: u16 = 9464;

/// gRPC metadata an agent sends on a report stream when it holds one to every controller
/// replica: any replica keeps such a stream, leading or not. A stream without it (an agent that
/// reaches the leader alone) is refused by a standby and closed when its replica stops leading,
/// so that agent reconnects to the new leader.
pub const EVERY_REPLICA_METADATA: &str = "sked-every-replica";

/// How often an agent reports when nothing changes (its `--heartbeat-interval` default); a new
/// leader gives agents this long to report before it judges their kernels.
pub const HEARTBEAT_INTERVAL: &str = "10s";

/// Path of the agent's readiness endpoint (Ready only while its scheduler is attached).
pub const READYZ_PATH: &str = "/readyz";

/// Where the projected token is mounted, and its file name there.
pub const TOKEN_DIR: &str = "/var/run/sked/token";
pub const TOKEN_FILE_NAME: &str = "token";
/// `TOKEN_DIR/TOKEN_FILE_NAME`: the agent's default `--token-file`.
pub const TOKEN_FILE: &str = "/var/run/sked/token/token";

/// Where the reports CA ConfigMap is mounted, and the key holding the CA there.
pub const CA_DIR: &str = "/var/run/sked/ca";
pub const CA_FILE_NAME: &str = "ca.crt";
/// `CA_DIR/CA_FILE_NAME`: the agent's default `--ca-file`.
pub const CA_FILE: &str = "/var/run/sked/ca/ca.crt";

/// The directory the scheduler container and the agent share (an emptyDir) for the scheduler's
/// statistics socket: schedulers built on scx_utils serve scx_stats at `STATS_DIR/root/stats`.
pub const STATS_DIR: &str = "/var/run/scx";
/// The socket the agent relays statistics from (its `--stats-socket` default).
pub const STATS_SOCKET: &str = "/var/run/scx/root/stats";

/// The host's `/boot`, mounted read-only at the same path in the scheduler container: libbpf
/// reads the running kernel's config (`/boot/config-$(uname -r)`) for the `CONFIG_*` values a
/// BPF scheduler uses, and distributions such as Debian and Ubuntu keep it only there.
pub const HOST_BOOT: &str = "/boot";

/// The host's cgroup2 tree (`/sys/fs/cgroup`), mounted read-only here in the agent container:
/// the agent reads the pods' CPU limits and usage under its `kubepods` directory (a container's
/// own `/sys/fs/cgroup` shows only its own cgroup namespace).
pub const HOST_CGROUP: &str = "/host/cgroup";
/// Where the host keeps its cgroup2 tree.
pub const HOST_CGROUP_SOURCE: &str = "/sys/fs/cgroup";

/// Environment variables the controller sets on the agent container.
pub mod env {
    /// The node the pod runs on (downward API `spec.nodeName`).
    pub const NODE_NAME: &str = "NODE_NAME";
    /// The pod's name (downward API `metadata.name`).
    pub const POD_NAME: &str = "POD_NAME";
    /// The Scheduler resource whose pod this is.
    pub const SCHEDULER: &str = "SKED_SCHEDULER";
    /// The Scheduler's `spec.expectedOps`, when set.
    pub const EXPECTED_OPS: &str = "SKED_EXPECTED_OPS";
    /// The reports server's address.
    pub const CONTROLLER_ADDRESS: &str = "SKED_CONTROLLER_ADDRESS";
    /// Every controller replica (a name whose DNS records are the replicas), when set.
    pub const CONTROLLER_REPLICAS: &str = "SKED_CONTROLLER_REPLICAS";
    /// The host's cgroup2 tree as the agent sees it (`super::HOST_CGROUP`).
    pub const CGROUP_ROOT: &str = "SKED_CGROUP_ROOT";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_paths_are_their_directory_and_name() {
        assert_eq!(TOKEN_FILE, format!("{TOKEN_DIR}/{TOKEN_FILE_NAME}"));
        assert_eq!(CA_FILE, format!("{CA_DIR}/{CA_FILE_NAME}"));
        assert!(STATS_SOCKET.starts_with(&format!("{STATS_DIR}/")));
    }
}
