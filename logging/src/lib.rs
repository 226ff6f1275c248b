//! The sked log contract, shared by the controller and the agent: newline-delimited JSON with
//! the fields `time` (RFC 3339), `level` (`INFO`, `ERROR`, `DEBUG`, ...), `msg`, `logger`
//! (slash-separated) and `err`, plus the structured fields of the event and of its spans.

#![forbid(unsafe_code)]

use std::io::Write;

pub mod exposition;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber, span};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// Renders a tracing level with the reference's severity names: `debug!` is V(1), shown as
/// `DEBUG+3` (slog level -1), and `trace!` is V(4), shown as `DEBUG` (slog level -4).
pub fn level_name(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "ERROR",
        Level::WARN => "WARN",
        Level::INFO => "INFO",
        Level::DEBUG => "DEBUG+3",
        Level::TRACE => "DEBUG",
    }
}

/// Turns a tracing target (`sked_controller::reconcile`) into a slash-separated logger name
/// (`sked-controller/reconcile`).
pub fn logger_name(target: &str) -> String {
    target.replace("::", "/").replace('_', "-")
}

/// A layer writing one JSON object per event.
pub struct JsonLayer<W> {
    make_writer: W,
}

impl<W> JsonLayer<W> {
    pub fn new(make_writer: W) -> Self {
        Self { make_writer }
    }
}

/// Span fields, stored in the span's extensions.
struct SpanFields(Map<String, Value>);

impl<S, W, O> Layer<S> for JsonLayer<W>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: Fn() -> O + 'static,
    O: Write,
{
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        let mut fields = FieldMap::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(SpanFields(fields.0));
        }
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            let mut ext = span.extensions_mut();
            if let Some(SpanFields(map)) = ext.get_mut::<SpanFields>() {
                let mut fields = FieldMap(std::mem::take(map));
                values.record(&mut fields);
                *map = fields.0;
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut out = Map::new();
        out.insert("time".into(), Value::String(jiff::Timestamp::now().to_string()));
        out.insert("level".into(), Value::String(level_name(event.metadata().level()).into()));
        out.insert("msg".into(), Value::String(String::new()));
        out.insert("logger".into(), Value::String(logger_name(event.metadata().target())));
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(SpanFields(map)) = span.extensions().get::<SpanFields>() {
                    out.extend(map.iter().map(|(k, v)| (k.clone(), v.clone())));
                }
            }
        }
        let mut fields = FieldMap::default();
        event.record(&mut fields);
        for (k, v) in fields.0 {
            let key = if k == "message" { "msg".to_owned() } else { k };
            out.insert(key, v);
        }
        let mut line = Value::Object(out).to_string();
        line.push('\n');
        let _ = (self.make_writer)().write_all(line.as_bytes());
    }
}

#[derive(Default)]
struct FieldMap(Map<String, Value>);

impl Visit for FieldMap {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().into(), Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), Value::String(value.into()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0.insert(field.name().into(), Value::String(error_chain(value)));
    }
}

/// An error that stops a process (or one of its servers), with its cause chain: the one boxed
/// error type of the controller and the agent.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An error and its sources, joined with `: `.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut s = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        let text = e.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        source = e.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn json_lines_carry_the_contract_fields() {
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::registry().with(JsonLayer::new(move || writer.clone()));
        tracing::subscriber::with_default(subscriber, || {
            let span =
                tracing::info_span!("reconcile", controller = "scheduler", scheduler = "rusty", reconcileID = "r1");
            let _g = span.enter();
            let err = std::io::Error::other("boom");
            tracing::error!(target: "sked_controller::reconcile", err = &err as &dyn std::error::Error, "reconcile failed");
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let v: Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(v["level"], "ERROR");
        assert_eq!(v["msg"], "reconcile failed");
        assert_eq!(v["logger"], "sked-controller/reconcile");
        assert_eq!(v["err"], "boom");
        assert_eq!(v["scheduler"], "rusty");
        assert_eq!(v["reconcileID"], "r1");
        let time = v["time"].as_str().unwrap();
        assert!(time.parse::<jiff::Timestamp>().is_ok(), "{time} is RFC 3339");
    }
}

#[cfg(test)]
mod level_tests {
    use super::*;

    #[test]
    fn levels_use_the_reference_names() {
        assert_eq!(level_name(&Level::INFO), "INFO");
        assert_eq!(level_name(&Level::ERROR), "ERROR");
        assert_eq!(level_name(&Level::DEBUG), "DEBUG+3", "V(1)");
        assert_eq!(level_name(&Level::TRACE), "DEBUG", "V(4)");
        assert_eq!(logger_name("sked_controller::reconcile"), "sked-controller/reconcile");
    }
}
