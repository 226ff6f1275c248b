//! The metrics exposition both binaries serve on `/metrics`. They encode OpenMetrics; a scraper
//! that does not ask for it (no `application/openmetrics-text` in `Accept`: `curl`,
//! `promtool check metrics`, older Prometheus) gets the classic text format (0.0.4) instead, as the
//! Go client does.

/// Content type of OpenMetrics text.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Content type of the classic Prometheus text format.
pub const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The content type and body to answer a scrape with `accept` (the request's `Accept` header),
/// from an OpenMetrics exposition.
pub fn negotiate(accept: Option<&str>, openmetrics: String) -> (&'static str, String) {
    if accept.is_some_and(|a| a.contains("application/openmetrics-text")) {
        (OPENMETRICS, openmetrics)
    } else {
        (TEXT, to_classic_text(&openmetrics))
    }
}

/// Rewrites an OpenMetrics exposition in the classic text format: a counter family's `# HELP`
/// and `# TYPE` name its samples (`x_total`), `unknown` is `untyped`, and `# UNIT`/`# EOF` go.
pub fn to_classic_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> =
        openmetrics.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter")).collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "].into_iter().find_map(|p| Some((p, line.strip_prefix(p)?)));
        match meta {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                let name = if counters.contains(name) { format!("{name}_total") } else { name.to_owned() };
                let tail = if prefix == "# TYPE " && tail == "unknown" { "untyped" } else { tail };
                out.push_str(prefix);
                out.push_str(&name);
                out.push(' ');
                out.push_str(tail);
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const OM: &str = "# HELP sked_reports Reports.\n# TYPE sked_reports counter\nsked_reports_total 3\n\
        # HELP sked_leader 1 while leading.\n# TYPE sked_leader gauge\nsked_leader 1\n\
        # TYPE sked_x unknown\nsked_x 2\n# UNIT sked_t seconds\n# EOF\n";

    #[test]
    fn counters_are_named_by_their_samples_and_the_trailer_goes() {
        assert_eq!(
            to_classic_text(OM),
            "# HELP sked_reports_total Reports.\n# TYPE sked_reports_total counter\nsked_reports_total 3\n\
             # HELP sked_leader 1 while leading.\n# TYPE sked_leader gauge\nsked_leader 1\n\
             # TYPE sked_x untyped\nsked_x 2\n"
        );
    }

    #[test]
    fn openmetrics_only_when_asked_for() {
        let asked = Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5");
        assert_eq!(negotiate(asked, OM.into()), (OPENMETRICS, OM.to_owned()));
        let (kind, body) = negotiate(None, OM.into());
        assert_eq!(kind, TEXT);
        assert!(!body.contains("# EOF"));
        assert_eq!(negotiate(Some("*/*"), OM.into()).0, TEXT);
    }
}
