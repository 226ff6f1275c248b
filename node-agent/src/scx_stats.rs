//! A client of scx_stats, the statistics protocol of the sched_ext schedulers built on scx_utils
//! (scx_bpfland, scx_lavd, scx_rusty, ...), and the mapping of what it says to Prometheus series.
//!
//! Written here from the protocol's description: the upstream crate is GPL-2.0-only and cannot
//! be linked into the agent (Apache-2.0). The protocol:
//! - a UNIX stream socket, by default `/var/run/scx/root/stats`; one JSON request per line and
//!   one JSON reply per line, in order, on a connection kept open;
//! - requests `{"req":"stats_meta","args":{}}` and `{"req":"stats","args":{"target":"top"}}`;
//! - a reply is `{"errno":0,"args":{"resp":VALUE}}`; another errno means `resp` is the error text;
//! - `stats_meta` describes structs by name: `{"name", "top"?, "desc"?, "user"?: {"_om_prefix",
//!   "_om_label"}, "fields": {NAME: {"datum"|"array"|"dict", "desc"?, "user"?: {"_om_skip"}}}}`,
//!   a datum being `"i64"`, `"u64"`, `"float"`, `"string"` or `{"struct": NAME}`, a dict
//!   `{"key": KIND, "datum": KIND}`;
//! - `stats` answers the top struct as a JSON object (a dict as an object keyed by strings);
//! - a server keeps state per connection: many schedulers answer counts since the previous
//!   request on the same connection, so a client keeps one connection.
//!
//! The mapping follows the OpenMetrics hints the way scx's own translation does: every numeric
//! field of the top struct is a gauge named `<its struct's _om_prefix><field>`; a dict of structs
//! adds the label its struct's `_om_label` names, valued by the dict's key; `_om_skip` leaves a
//! field out; strings, arrays and other shapes are not numbers and are left out.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Map, Value};
use sked_proto::text::escape_and_cap;
use tokio::net::UnixStream;
use tokio_util::codec::{Framed, LinesCodec, LinesCodecError};

/// The socket scx_utils schedulers serve, unless built otherwise.
pub const DEFAULT_SOCKET: &str = sked_proto::contract::STATS_SOCKET;
/// The longest reply read (a line); a longer one ends the connection.
pub const MAX_REPLY: usize = 1 << 20;
/// The most series relayed from one reply; the rest are dropped and counted.
pub const MAX_SERIES: usize = 2_000;
/// Structs nested deeper than this (through dicts) are not followed.
const MAX_DEPTH: usize = 4;
/// Caps on what a scheduler writes: metric names, label values, help texts, error texts
/// (escaped and capped by [`escape_and_cap`], the agent's one way with text from a node).
const MAX_NAME: usize = 128;
const MAX_LABEL_VALUE: usize = 128;
const MAX_HELP: usize = 256;
const MAX_ERROR: usize = 200;

/// Every relayed series' name starts with this.
pub const SERIES_PREFIX: &str = "scx_";

/// Why a request for statistics failed.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    #[error("no stats socket at {0}: the scheduler serves no scx_stats, or has not started serving yet")]
    NoSocket(String),
    #[error("the scheduler did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the scheduler's reply is longer than {MAX_REPLY} bytes")]
    Oversized,
    #[error("the scheduler's reply is not scx_stats: {0}")]
    Garbled(String),
    #[error("the scheduler refused the request (errno {errno}): {message}")]
    Refused { errno: i64, message: String },
    #[error("the scheduler closed the stats connection")]
    Closed,
    #[error("stats socket: {0}")]
    Io(std::io::Error),
}

impl StatsError {
    /// The label of the failure counter.
    pub fn reason(&self) -> &'static str {
        match self {
            StatsError::NoSocket(_) => "no_socket",
            StatsError::Timeout(_) => "timeout",
            StatsError::Oversized => "oversized",
            StatsError::Garbled(_) => "garbled",
            StatsError::Refused { .. } => "refused",
            StatsError::Closed => "closed",
            StatsError::Io(_) => "io",
        }
    }
}

/// One connection to a scheduler's stats socket.
pub struct Client {
    lines: Framed<UnixStream, LinesCodec>,
    timeout: Duration,
}

impl Client {
    /// Connects, within `timeout`; each request then gets `timeout` for its reply.
    pub async fn connect(path: &Path, timeout: Duration) -> Result<Self, StatsError> {
        let stream = match tokio::time::timeout(timeout, UnixStream::connect(path)).await {
            Err(_) => return Err(StatsError::Timeout(timeout)),
            // A socket left by a scheduler that exited refuses connections.
            Ok(Err(e)) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused) => {
                return Err(StatsError::NoSocket(path.display().to_string()));
            }
            Ok(Err(e)) => return Err(StatsError::Io(e)),
            Ok(Ok(stream)) => stream,
        };
        Ok(Self { lines: Framed::new(stream, LinesCodec::new_with_max_length(MAX_REPLY)), timeout })
    }

    /// What the scheduler's statistics are.
    pub async fn meta(&mut self) -> Result<Schema, StatsError> {
        Schema::parse(&self.request(r#"{"req":"stats_meta","args":{}}"#).await?)
    }

    /// The scheduler's statistics now (its top struct).
    pub async fn stats(&mut self) -> Result<Value, StatsError> {
        self.request(r#"{"req":"stats","args":{"target":"top"}}"#).await
    }

    async fn request(&mut self, line: &str) -> Result<Value, StatsError> {
        let exchange = async {
            self.lines.send(line).await.map_err(codec_error)?;
            match self.lines.next().await {
                None => Err(StatsError::Closed),
                Some(Err(e)) => Err(codec_error(e)),
                Some(Ok(reply)) => parse_reply(&reply),
            }
        };
        tokio::time::timeout(self.timeout, exchange).await.map_err(|_| StatsError::Timeout(self.timeout))?
    }
}

fn codec_error(e: LinesCodecError) -> StatsError {
    match e {
        LinesCodecError::MaxLineLengthExceeded => StatsError::Oversized,
        LinesCodecError::Io(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            StatsError::Garbled("a reply that is not UTF-8".into())
        }
        LinesCodecError::Io(e) => StatsError::Io(e),
    }
}

/// The value of a reply line, or the error it carries.
pub fn parse_reply(line: &str) -> Result<Value, StatsError> {
    #[derive(serde::Deserialize)]
    struct Reply {
        errno: i64,
        #[serde(default)]
        args: Map<String, Value>,
    }
    let reply: Reply =
        serde_json::from_str(line).map_err(|e| StatsError::Garbled(escape_and_cap(&e.to_string(), MAX_ERROR)))?;
    let resp = reply.args.get("resp").cloned().unwrap_or(Value::Null);
    if reply.errno != 0 {
        let message = resp.as_str().map_or_else(|| resp.to_string(), str::to_owned);
        return Err(StatsError::Refused { errno: reply.errno, message: escape_and_cap(&message, MAX_ERROR) });
    }
    Ok(resp)
}

/// What a field holds, as far as the mapping reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum FieldKind {
    Number,
    /// A dict whose values are the struct named.
    DictOf(String),
    /// Strings, arrays, plain nested structs, dicts of scalars: no series.
    Other,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct FieldMeta {
    kind: FieldKind,
    help: String,
    skip: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct StructMeta {
    prefix: String,
    label: Option<String>,
    fields: BTreeMap<String, FieldMeta>,
}

/// What `stats_meta` described: the structs, and which one `stats` answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schema {
    top: String,
    structs: BTreeMap<String, StructMeta>,
}

/// One relayed value: a series' name, help text, labels (besides the scheduler's own) and value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub help: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Schema {
    /// Reads a `stats_meta` reply. The top struct is the one marked `top` (of several, the
    /// last by name, as scx's own translation picks it).
    pub fn parse(resp: &Value) -> Result<Self, StatsError> {
        let garbled = |what: &str| StatsError::Garbled(what.to_owned());
        let described = resp.as_object().ok_or_else(|| garbled("stats_meta is not an object of structs"))?;
        let mut structs = BTreeMap::new();
        let mut top = None;
        for (name, meta) in described {
            let meta = meta.as_object().ok_or_else(|| garbled("a struct of stats_meta is not an object"))?;
            if meta.contains_key("top") {
                top = Some(name.clone());
            }
            let user = |key: &str| meta.get("user").and_then(|u| u.get(key)).and_then(Value::as_str);
            let fields = meta.get("fields").and_then(Value::as_object).map(|fields| {
                fields.iter().filter_map(|(name, field)| Some((name.clone(), field_meta(field.as_object()?)))).collect()
            });
            structs.insert(
                name.clone(),
                StructMeta {
                    prefix: user("_om_prefix").unwrap_or_default().to_owned(),
                    label: user("_om_label").filter(|l| !l.is_empty()).map(str::to_owned),
                    fields: fields.unwrap_or_default(),
                },
            );
        }
        let top = top.ok_or_else(|| garbled("stats_meta marks no struct as top"))?;
        Ok(Self { top, structs })
    }

    /// How many numeric fields the top struct has (dicts counted once).
    pub fn fields(&self) -> usize {
        self.structs.get(&self.top).map_or(0, |s| s.fields.values().filter(|f| f.kind != FieldKind::Other).count())
    }

    /// The series of a `stats` reply, and how many were dropped past [`MAX_SERIES`].
    pub fn samples(&self, stats: &Value) -> (Vec<Sample>, usize) {
        let mut out = Vec::new();
        let mut dropped = 0;
        if let Some(top) = stats.as_object() {
            self.walk(&self.top, top, &[], 0, &mut out, &mut dropped);
        }
        (out, dropped)
    }

    fn walk(
        &self,
        struct_name: &str,
        values: &Map<String, Value>,
        labels: &[(String, String)],
        depth: usize,
        out: &mut Vec<Sample>,
        dropped: &mut usize,
    ) {
        let Some(meta) = self.structs.get(struct_name) else { return };
        for (field, fm) in meta.fields.iter().filter(|(_, f)| !f.skip) {
            match (&fm.kind, values.get(field)) {
                (FieldKind::Number, Some(value)) => {
                    // NaN and infinities arrive as null: no value to relay.
                    let Some(value) = value.as_f64() else { continue };
                    if out.len() >= MAX_SERIES {
                        *dropped += 1;
                        continue;
                    }
                    let name = series_name(&format!("{}{field}", meta.prefix));
                    out.push(Sample { name, help: fm.help.clone(), labels: labels.to_vec(), value });
                }
                (FieldKind::DictOf(inner), Some(Value::Object(dict))) if depth < MAX_DEPTH => {
                    // A dict of structs without a label to tell its entries apart is left out.
                    let Some(label) = self.structs.get(inner).and_then(|s| s.label.as_deref()) else { continue };
                    let label = label_name(label);
                    for (key, entry) in dict {
                        let Value::Object(entry) = entry else { continue };
                        let mut labels = labels.to_vec();
                        labels.push((label.clone(), escape_and_cap(key, MAX_LABEL_VALUE)));
                        self.walk(inner, entry, &labels, depth + 1, out, dropped);
                    }
                }
                _ => {}
            }
        }
    }
}

fn field_meta(field: &Map<String, Value>) -> FieldMeta {
    let kind = match (field.get("datum"), field.get("dict")) {
        (Some(Value::String(t)), _) if matches!(t.as_str(), "i64" | "u64" | "float") => FieldKind::Number,
        (_, Some(dict)) => match dict.get("datum").and_then(|d| d.get("struct")).and_then(Value::as_str) {
            Some(name) => FieldKind::DictOf(name.to_owned()),
            None => FieldKind::Other,
        },
        _ => FieldKind::Other,
    };
    // One line of help: line breaks become spaces, anything else unprintable an escape.
    let help = field.get("desc").and_then(Value::as_str).unwrap_or_default().replace(['\n', '\r', '\t'], " ");
    let skip = field.get("user").and_then(|u| u.get("_om_skip")).is_some();
    FieldMeta { kind, help: escape_and_cap(&help, MAX_HELP), skip }
}

/// A series name from a scheduler's field name: [`SERIES_PREFIX`], then the name with every
/// character Prometheus does not take in a name replaced by `_`, capped.
pub fn series_name(field: &str) -> String {
    let body: String =
        field.chars().take(MAX_NAME).map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    format!("{SERIES_PREFIX}{body}")
}

/// A label name from a scheduler's `_om_label`: Prometheus' characters only, not starting with
/// a digit or `__` (reserved), and not one of the labels the agent sets itself.
pub fn label_name(label: &str) -> String {
    let mut name: String =
        label.chars().take(MAX_NAME).map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) || name.starts_with("__") {
        name = format!("scx_{}", name.trim_start_matches('_'));
    }
    if matches!(name.as_str(), "scheduler" | "ops") {
        name = format!("scx_{name}");
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// The example scx_stats documents: a cluster with a dict of domains.
    fn cluster_meta() -> Value {
        json!({
            "ClusterStats": {"name": "ClusterStats", "top": "true", "desc": "cluster statistics", "fields": {
                "at": {"datum": "u64", "desc": "update timestamp"},
                "bitmap": {"array": "u64", "user": {"_om_skip": "true"}},
                "doms_dict": {"dict": {"key": "u64", "datum": {"struct": "DomainStats"}}, "desc": "domains"},
                "name": {"datum": "string"}
            }},
            "DomainStats": {"name": "DomainStats", "user": {"_om_prefix": "d_", "_om_label": "domain_name"}, "fields": {
                "events": {"datum": "u64", "desc": "an event counter"},
                "name": {"datum": "string"},
                "pressure": {"datum": "float", "desc": "a gauge\nnumber"}
            }}
        })
    }

    fn names(samples: &[Sample]) -> Vec<String> {
        samples.iter().map(|s| format!("{}{:?}={}", s.name, s.labels, s.value)).collect()
    }

    #[test]
    fn numbers_become_series_and_dicts_of_structs_become_labels() {
        let schema = Schema::parse(&cluster_meta()).unwrap();
        assert_eq!(schema.fields(), 2, "at and the dict of domains");
        let stats = json!({"at": 12345, "bitmap": [1, 2], "name": "test cluster", "doms_dict": {
            "0": {"events": 1234, "name": "domain 0", "pressure": 1.5},
            "3": {"events": 5678, "name": "domain 3", "pressure": null}
        }});
        let (samples, dropped) = schema.samples(&stats);
        assert_eq!(dropped, 0);
        assert_eq!(
            names(&samples),
            vec![
                "scx_at[]=12345",
                "scx_d_events[(\"domain_name\", \"0\")]=1234",
                "scx_d_pressure[(\"domain_name\", \"0\")]=1.5",
                "scx_d_events[(\"domain_name\", \"3\")]=5678",
            ],
            "strings, the skipped array and a null (NaN) are left out"
        );
        assert_eq!(samples[0].help, "update timestamp");
        assert_eq!(samples[2].help, "a gauge number", "no control characters in help");
    }

    #[test]
    fn bpfland_s_flat_metrics_struct() {
        let meta = json!({"Metrics": {"name": "Metrics", "top": "true", "fields": {
            "nr_running": {"datum": "u64", "desc": "Number of running tasks"},
            "nr_cpus": {"datum": "u64", "desc": "Number of online CPUs"},
            "nr_direct_dispatches": {"datum": "u64", "desc": "Number of task direct dispatches"}
        }}});
        let schema = Schema::parse(&meta).unwrap();
        let (samples, _) =
            schema.samples(&json!({"nr_running": 3, "nr_cpus": 2, "nr_direct_dispatches": 18446744073709551615u64}));
        assert_eq!(
            samples.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            vec!["scx_nr_cpus", "scx_nr_direct_dispatches", "scx_nr_running"]
        );
        assert_eq!(samples[1].value, u64::MAX as f64);
    }

    #[test]
    fn replies_and_their_errors() {
        assert_eq!(parse_reply(r#"{"errno":0,"args":{"resp":{"a":1}}}"#).unwrap(), json!({"a": 1}));
        let refused =
            parse_reply(r#"{"errno":22,"args":{"resp":"Invalid argument\n\nCaused by:\n    unknown command"}}"#);
        match refused {
            Err(StatsError::Refused { errno: 22, message }) => {
                assert!(message.starts_with("Invalid argument\\n\\nCaused by"), "escaped: {message}")
            }
            other => panic!("{other:?}"),
        }
        for garbage in ["", "not json", "{\"args\":{}}", "[1,2]", "{\"errno\":\"x\"}"] {
            assert_eq!(parse_reply(garbage).err().map(|e| e.reason()), Some("garbled"), "{garbage}");
        }
        let long = format!(r#"{{"errno":1,"args":{{"resp":"{}"}}}}"#, "x".repeat(10_000));
        let Err(StatsError::Refused { message, .. }) = parse_reply(&long) else { panic!("refused") };
        assert!(message.len() < 300, "capped: {}", message.len());
    }

    #[test]
    fn meta_without_a_top_struct_or_of_the_wrong_shape_is_refused() {
        for meta in [json!([]), json!({"S": 1}), json!({"S": {"fields": {}}})] {
            assert_eq!(Schema::parse(&meta).err().map(|e| e.reason()), Some("garbled"), "{meta}");
        }
        // Unknown field shapes are kept out, not fatal; a dict of structs without a label too.
        let meta = json!({"T": {"top": "true", "fields": {
            "odd": {"datum": {"struct": "U"}}, "weird": {"datum": 7}, "dict": {"dict": {"datum": {"struct": "U"}}},
            "n": {"datum": "i64"}
        }}, "U": {"fields": {"x": {"datum": "u64"}}}});
        let schema = Schema::parse(&meta).unwrap();
        let (samples, _) = schema.samples(&json!({"odd": {"x": 1}, "weird": 2, "dict": {"a": {"x": 1}}, "n": -4}));
        assert_eq!(names(&samples), vec!["scx_n[]=-4"]);
    }

    #[test]
    fn a_reply_with_too_many_series_is_cut_and_the_rest_counted() {
        let meta = json!({"T": {"top": "true", "fields": {"d": {"dict": {"datum": {"struct": "U"}}}}},
            "U": {"user": {"_om_label": "cpu"}, "fields": {"busy": {"datum": "float"}}}});
        let schema = Schema::parse(&meta).unwrap();
        let dict: Map<String, Value> = (0..MAX_SERIES + 10).map(|i| (i.to_string(), json!({"busy": 1.0}))).collect();
        let (samples, dropped) = schema.samples(&json!({ "d": dict }));
        assert_eq!((samples.len(), dropped), (MAX_SERIES, 10));
    }

    #[test]
    fn names_and_labels_are_what_prometheus_takes() {
        assert_eq!(series_name("d_busy time%"), "scx_d_busy_time_");
        assert_eq!(label_name("9cpu"), "scx_9cpu");
        assert_eq!(label_name("__x"), "scx_x");
        assert_eq!(label_name("ops"), "scx_ops");
        assert_eq!(label_name("llc id"), "llc_id");
    }

    proptest! {
        /// Whatever a scheduler answers, the mapping neither panics nor relays more than its
        /// cap, and every name it makes is a valid Prometheus name.
        #[test]
        fn any_json_maps_to_valid_bounded_series(meta in arb_json(), stats in arb_json()) {
            if let Ok(schema) = Schema::parse(&meta) {
                let (samples, _) = schema.samples(&stats);
                prop_assert!(samples.len() <= MAX_SERIES);
                let valid = regex_lite(&samples);
                prop_assert!(valid, "{:?}", samples);
            }
        }
    }

    /// A `stats_meta` with a top struct holding a number and a dict of labelled structs, each
    /// holding a number and a labelled dict of its own (the depth a dict of structs needs), and
    /// a `stats` reply for it keyed by `outer` and `inner`: keys as hostile as a scheduler may
    /// send (control characters, quotes, backslashes, text past the label cap), and sizes that
    /// reach past MAX_SERIES (up to 1 + 60 * 61 numbers).
    fn arb_labelled() -> impl Strategy<Value = (Value, Value, usize)> {
        let key = prop_oneof!["[a-z0-9]{1,6}", "\\PC{100,400}", "[\\x00-\\x1f\"\\\\\u{7f}\u{202e}]{1,8}",];
        let keys = || proptest::collection::btree_set(key.clone(), 0..60);
        (keys(), keys()).prop_map(|(outer, inner)| {
            let meta = json!({
                "T": {"top": "true", "fields": {"n": {"datum": "u64"}, "d": {"dict": {"datum": {"struct": "U"}}}}},
                "U": {"user": {"_om_label": "outer key"}, "fields": {
                    "x": {"datum": "float"}, "e": {"dict": {"datum": {"struct": "V"}}}}},
                "V": {"user": {"_om_label": "in\"ner\n"}, "fields": {"y": {"datum": "u64"}}}
            });
            let inner_dict: Map<String, Value> = inner.iter().map(|k| (k.clone(), json!({"y": 2}))).collect();
            let outer_dict: Map<String, Value> =
                outer.iter().map(|k| (k.clone(), json!({"x": 1.5, "e": inner_dict.clone()}))).collect();
            let numbers = 1 + outer.len() * (1 + inner.len());
            (meta, json!({"n": 1, "d": outer_dict}), numbers)
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Labelled dicts of structs, as deep and as wide as schedulers make them: every number
        /// is relayed or counted as dropped, at most MAX_SERIES are relayed, and every label
        /// value is escaped and capped (no control or invisible character gets through).
        #[test]
        fn labelled_dicts_are_escaped_capped_and_counted((meta, stats, numbers) in arb_labelled()) {
            let schema = Schema::parse(&meta).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let (samples, dropped) = schema.samples(&stats);
            prop_assert_eq!(samples.len() + dropped, numbers);
            prop_assert_eq!(samples.len(), numbers.min(MAX_SERIES));
            for s in &samples {
                for (k, v) in &s.labels {
                    prop_assert!(k == "outer_key" || k == "in_ner_", "label name {:?}", k);
                    prop_assert!(v.chars().all(|c| !c.is_control() && c != '\u{202e}'), "raw {:?}", v);
                    prop_assert!(v.chars().count() <= MAX_LABEL_VALUE + 32, "not capped: {} chars", v.chars().count());
                }
            }
        }
    }

    fn regex_lite(samples: &[Sample]) -> bool {
        let name_ok = |n: &str| {
            !n.is_empty()
                && !n.starts_with(|c: char| c.is_ascii_digit())
                && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        };
        samples.iter().all(|s| {
            name_ok(&s.name) && s.labels.iter().all(|(k, v)| name_ok(k) && v.chars().count() <= MAX_LABEL_VALUE + 32)
        })
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            prop_oneof![Just("top"), Just("u64"), Just("float"), Just("fields"), Just("datum"), Just("x\n")]
                .prop_map(|s| Value::String(s.into())),
        ];
        leaf.prop_recursive(4, 64, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map(
                    prop_oneof![
                        Just("top"),
                        Just("fields"),
                        Just("datum"),
                        Just("dict"),
                        Just("struct"),
                        Just("user"),
                        Just("_om_label"),
                        Just("_om_prefix"),
                        Just("S"),
                        Just("a b")
                    ]
                    .prop_map(str::to_owned),
                    inner,
                    0..5
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }
}
