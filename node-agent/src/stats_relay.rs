//! Relays the statistics of this pod's scheduler (scx_stats, see [`crate::scx_stats`]) to the
//! agent's `/metrics`.
//!
//! While the kernel runs this pod's scheduler, one connection to its stats socket is kept: its
//! `stats_meta` is read once when the connection opens (after each attach, and after the
//! scheduler restarted its server), and its `stats` are asked for every interval; each scrape
//! serves the last reply, so scrapes never reach the scheduler. Each relayed series carries the
//! Scheduler's name and the kernel's ops name as labels. A scheduler without the socket, one
//! that does not answer in time, an oversized or garbled reply: the relayed series go, the
//! failure is counted by reason and logged once until it changes, and the agent goes on.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{info, warn};

use crate::metrics::Metrics;
use crate::observation::Observation;
use crate::scx_stats::{Client, Schema, StatsError};
use crate::verdict::Verdict;

/// How long a connection or a reply may take.
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// Where the relay reads, and for whom.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    pub socket: PathBuf,
    pub interval: Duration,
    /// How long a connection or a reply may take ([`TIMEOUT`]).
    pub timeout: Duration,
    /// The Scheduler resource this pod runs.
    pub scheduler: String,
}

/// The attach the relay follows: this pod's scheduler under one ops name and enable.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Attach {
    ops: String,
    enable_seq: Option<u64>,
}

fn attach_of(o: &Observation) -> Option<Attach> {
    (o.verdict == Verdict::Attached)
        .then(|| Attach { ops: o.read.ops.clone().unwrap_or_default(), enable_seq: o.read.enable_seq })
}

/// Relays until the kernel watch ends (the agent stops).
pub async fn run(cfg: RelayConfig, mut kernel: watch::Receiver<Observation>, metrics: Arc<Metrics>) {
    let mut logged: Option<&'static str> = None;
    loop {
        let Some(attach) = wait_attached(&mut kernel).await else { return };
        let ended = session(&cfg, &attach, &mut kernel, &metrics, &mut logged).await;
        metrics.scx_stats.clear();
        metrics.scx_stats_up.set(0);
        match ended {
            Ended::Stopped => return,
            Ended::Detached => logged = None,
            Ended::Failed(e) => {
                metrics.scx_stats_failure(e.reason());
                if logged != Some(e.reason()) {
                    let hint = if matches!(e, StatsError::NoSocket(_)) {
                        " (schedulers built on scx_utils serve one; others have no statistics to relay)"
                    } else {
                        ""
                    };
                    warn!(scheduler = %cfg.scheduler, ops = %attach.ops, reason = e.reason(), "cannot relay the scheduler's statistics: {e}{hint}; trying again every {:?}", cfg.interval);
                    logged = Some(e.reason());
                }
                // Again after an interval, or at once when the attach changes.
                let deadline = tokio::time::Instant::now() + cfg.interval;
                if let Some(Ended::Stopped) = until(deadline, &attach, &mut kernel).await {
                    return;
                }
            }
        }
    }
}

/// How a session ended.
enum Ended {
    /// The agent stops.
    Stopped,
    /// This pod's scheduler is no longer the one attached (or attached again).
    Detached,
    Failed(StatsError),
}

async fn wait_attached(kernel: &mut watch::Receiver<Observation>) -> Option<Attach> {
    loop {
        if let Some(attach) = attach_of(&kernel.borrow_and_update()) {
            return Some(attach);
        }
        kernel.changed().await.ok()?;
    }
}

/// One connection: the meta once, then the stats every interval, until the attach changes or
/// a request fails.
async fn session(
    cfg: &RelayConfig,
    attach: &Attach,
    kernel: &mut watch::Receiver<Observation>,
    metrics: &Metrics,
    logged: &mut Option<&'static str>,
) -> Ended {
    let mut client = match Client::connect(&cfg.socket, cfg.timeout).await {
        Ok(client) => client,
        Err(e) => return Ended::Failed(e),
    };
    let schema: Schema = match client.meta().await {
        Ok(schema) => schema,
        Err(e) => return Ended::Failed(e),
    };
    // The ops name was escaped and capped when sysfs was read.
    let own = vec![("scheduler".to_owned(), cfg.scheduler.clone()), ("ops".to_owned(), attach.ops.clone())];
    let mut first = true;
    loop {
        let stats = match client.stats().await {
            Ok(stats) => stats,
            Err(e) => return Ended::Failed(e),
        };
        let (samples, dropped) = schema.samples(&stats);
        metrics.scx_stats_relayed(samples.len(), dropped);
        if first {
            info!(scheduler = %cfg.scheduler, ops = %attach.ops, series = samples.len(), fields = schema.fields(), "relaying the scheduler's statistics (scx_stats)");
            (first, *logged) = (false, None);
        }
        metrics.scx_stats.set(own.clone(), samples);
        metrics.scx_stats.keep_snapshot(&stats);
        metrics.scx_stats_up.set(1);
        if let Some(ended) = until(tokio::time::Instant::now() + cfg.interval, attach, kernel).await {
            return ended;
        }
    }
}

/// Waits until `deadline` (None), unless the attach changes before (Detached) or the agent
/// stops (Stopped).
async fn until(
    deadline: tokio::time::Instant,
    attach: &Attach,
    kernel: &mut watch::Receiver<Observation>,
) -> Option<Ended> {
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => return None,
            changed = kernel.changed() => {
                if changed.is_err() {
                    return Some(Ended::Stopped);
                }
                if attach_of(&kernel.borrow_and_update()).as_ref() != Some(attach) {
                    return Some(Ended::Detached);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The relay against stats servers the tests start on a UNIX socket: one that answers as a
    //! scheduler does, and ones that hang, answer too much, answer garbage or are not there.

    use super::*;
    use crate::sysfs::{KernelRead, SchedState};
    use std::sync::atomic::{AtomicU64, Ordering};
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    use tokio::net::UnixListener;

    const META: &str = r#"{"errno":0,"args":{"resp":{"Metrics":{"name":"Metrics","top":"true","fields":{"nr_running":{"datum":"u64","desc":"Number of running tasks"},"nr_direct_dispatches":{"datum":"u64","desc":"Number of task direct dispatches"},"nr_kthread_dispatches":{"datum":"u64","desc":"Number of kthread direct dispatches"},"label":{"datum":"string"}}}}}}"#;

    /// How a test server answers `stats`.
    #[derive(Clone, Copy)]
    enum Answer {
        /// Counts since the previous request on the connection, as scx_bpfland does.
        Deltas,
        Hang,
        Oversized,
        Garbage,
        Refuse,
    }

    /// Serves scx_stats on `path`: each connection gets the meta, then `stats` as `answer`
    /// says. Returns how many connections it accepted.
    fn serve(path: &std::path::Path, answer: Answer) -> Arc<AtomicU64> {
        let listener = UnixListener::bind(path).expect("bind the test socket");
        let accepted = Arc::new(AtomicU64::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let (read, mut write) = stream.into_split();
                    let mut lines = BufReader::new(read).lines();
                    let mut requests = 0u64;
                    while let Ok(Some(line)) = lines.next_line().await {
                        let reply = if line.contains("stats_meta") {
                            META.to_owned()
                        } else {
                            requests += 1;
                            match answer {
                                Answer::Deltas => format!(
                                    r#"{{"errno":0,"args":{{"resp":{{"nr_running":2,"nr_direct_dispatches":{},"nr_kthread_dispatches":{},"label":"x"}}}}}}"#,
                                    requests * 10,
                                    requests
                                ),
                                Answer::Hang => std::future::pending().await,
                                Answer::Oversized => "x".repeat(crate::scx_stats::MAX_REPLY + 10),
                                Answer::Garbage => "{\"errno\":0,".to_owned(),
                                Answer::Refuse => r#"{"errno":22,"args":{"resp":"unknown stat target"}}"#.to_owned(),
                            }
                        };
                        if write.write_all(format!("{reply}\n").as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        accepted
    }

    fn attached(ops: &str) -> Observation {
        Observation {
            read: KernelRead {
                supported: true,
                state: SchedState::Enabled,
                ops: Some(ops.into()),
                enable_seq: Some(1),
                switch_all: Some(true),
                nr_rejected: Some(0),
                hotplug_seq: Some(1),
                events: Default::default(),
                problems: Vec::new(),
            },
            verdict: Verdict::Attached,
            reason: String::new(),
            last_exit: None,
            cgroup_ops: None,
        }
    }

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
    }

    /// Polls the metrics text until `ok` holds (deadline 10 s).
    async fn until(metrics: &Metrics, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let text = metrics.encode();
            if ok(&text) {
                return text;
            }
            assert!(tokio::time::Instant::now() < deadline, "never saw {what}:\n{text}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn start(dir: &tempfile::TempDir, observation: Observation) -> (Arc<Metrics>, watch::Sender<Observation>) {
        let metrics = Arc::new(Metrics::new());
        let (tx, rx) = watch::channel(observation);
        let cfg = RelayConfig {
            socket: dir.path().join("stats"),
            interval: Duration::from_millis(50),
            timeout: Duration::from_millis(200),
            scheduler: "bpfland".into(),
        };
        tokio::spawn(run(cfg, rx, metrics.clone()));
        (metrics, tx)
    }

    const DISPATCHES: &str = "scx_nr_direct_dispatches{scheduler=\"bpfland\",ops=\"bpfland_1.1.4_x86_64\"}";

    #[tokio::test]
    async fn an_attached_scheduler_s_statistics_are_relayed_on_one_connection_and_move() {
        let dir = tempfile::tempdir().unwrap();
        let accepted = serve(&dir.path().join("stats"), Answer::Deltas);
        let (metrics, tx) = start(&dir, attached("bpfland_1.1.4_x86_64"));
        let first = until(&metrics, "a relayed reply", |t| value(t, DISPATCHES).is_some()).await;
        let later = until(&metrics, "the next reply", |t| value(t, DISPATCHES) > value(&first, DISPATCHES)).await;
        assert!(later.contains("# HELP scx_nr_direct_dispatches Number of task direct dispatches"), "{later}");
        assert!(later.contains("# TYPE scx_nr_running gauge"), "{later}");
        assert!(!later.contains("scx_label"), "strings are not relayed: {later}");
        assert_eq!(value(&later, "sked_agent_scx_stats_up"), Some(1.0));
        assert_eq!(value(&later, "sked_agent_scx_stats_series"), Some(3.0));
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "one connection keeps the scheduler's deltas");

        // Detached: the series go; attached again: a new connection (and stats_meta).
        let mut gone = attached("bpfland_1.1.4_x86_64");
        gone.verdict = Verdict::NotAttached;
        tx.send_replace(gone);
        until(&metrics, "the series gone", |t| value(t, DISPATCHES).is_none() && !t.contains("scx_nr_running")).await;
        // The last reply is kept past the detach: what the scheduler said last, for the report
        // that tells why it left.
        let snapshot = metrics.scx_stats.snapshot().unwrap_or_default();
        assert!(snapshot.contains("nr_direct_dispatches"), "{snapshot}");
        let mut again = attached("bpfland_1.1.4_x86_64");
        again.read.enable_seq = Some(2);
        tx.send_replace(again);
        until(&metrics, "the series back", |t| value(t, DISPATCHES).is_some()).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_scheduler_that_is_not_attached_is_not_asked() {
        let dir = tempfile::tempdir().unwrap();
        let accepted = serve(&dir.path().join("stats"), Answer::Deltas);
        let mut foreign = attached("other");
        foreign.verdict = Verdict::ForeignScheduler;
        let (metrics, _tx) = start(&dir, foreign);
        // The agent's own metrics are served meanwhile; no connection is made.
        until(&metrics, "the agent's metrics", |t| t.contains("sked_agent_scx_stats_up 0")).await;
        tokio::task::yield_now().await;
        assert_eq!(accepted.load(Ordering::SeqCst), 0);
    }

    /// A failure of `answer` is counted by `reason`, the relay tries again (a new connection),
    /// and nothing is relayed.
    async fn fails_with(answer: Answer, reason: &str) {
        let dir = tempfile::tempdir().unwrap();
        let accepted = serve(&dir.path().join("stats"), answer);
        let (metrics, _tx) = start(&dir, attached("bpfland_1.1.4_x86_64"));
        let series = format!("sked_agent_scx_stats_failures_total{{reason=\"{reason}\"}}");
        let text = until(&metrics, "two failures", |t| value(t, &series).is_some_and(|n| n >= 2.0)).await;
        assert!(value(&text, DISPATCHES).is_none(), "{text}");
        assert_eq!(value(&text, "sked_agent_scx_stats_up"), Some(0.0));
        assert!(accepted.load(Ordering::SeqCst) >= 2, "tried again on a new connection");
    }

    #[tokio::test]
    async fn a_garbled_reply_is_counted_and_the_relay_goes_on() {
        fails_with(Answer::Garbage, "garbled").await;
    }

    #[tokio::test]
    async fn an_oversized_reply_is_counted_and_the_relay_goes_on() {
        fails_with(Answer::Oversized, "oversized").await;
    }

    #[tokio::test]
    async fn a_refused_request_is_counted_and_the_relay_goes_on() {
        fails_with(Answer::Refuse, "refused").await;
    }

    #[tokio::test]
    async fn a_socket_that_hangs_is_given_up_after_the_timeout() {
        fails_with(Answer::Hang, "timeout").await;
    }

    #[tokio::test]
    async fn no_socket_is_counted_and_the_relay_waits_for_one() {
        let dir = tempfile::tempdir().unwrap();
        let (metrics, _tx) = start(&dir, attached("bpfland_1.1.4_x86_64"));
        let series = "sked_agent_scx_stats_failures_total{reason=\"no_socket\"}";
        until(&metrics, "no socket counted", |t| value(t, series).is_some()).await;
        // The scheduler starts serving: relayed from then on.
        serve(&dir.path().join("stats"), Answer::Deltas);
        until(&metrics, "relayed once the socket is there", |t| value(t, DISPATCHES).is_some()).await;
    }
}
