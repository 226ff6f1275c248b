//! Tables as kubectl prints them (upper-case headers, aligned columns, `-` for nothing, ages
//! like `5m`), and JSON or YAML of the same rows.

use std::io::Write;

use serde::Serialize;

use crate::cli::Output;
use crate::doctor::Diagnosis;
use crate::error::{Error, Result};
use crate::fleet::{NodeRow, StatusRow, Summary};

/// One Scheduler in `status -o json|yaml`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SchedulerReport {
    #[serde(flatten)]
    pub summary: Summary,
    pub nodes: Vec<StatusRow>,
}

/// Writes `value` as JSON or YAML.
pub fn structured(out: &mut impl Write, format: Output, value: &impl Serialize) -> Result<()> {
    let text = match format {
        Output::Json => serde_json::to_string_pretty(value).map_err(|e| Error::Other(e.to_string()))? + "\n",
        Output::Yaml => serde_saphyr::to_string(value).map_err(|e| Error::Other(e.to_string()))?,
        Output::Wide => return Err(Error::Other("wide is a table".into())),
    };
    out.write_all(text.as_bytes()).map_err(io)
}

fn io(e: std::io::Error) -> Error {
    Error::Other(format!("writing the output: {e}"))
}

/// How long ago an RFC 3339 time was, as kubectl shows ages (`45s`, `5m`, `3h`, `2d`).
pub fn age(time: &str, now: jiff::Timestamp) -> String {
    let Ok(t) = time.parse::<jiff::Timestamp>() else { return "-".into() };
    let secs = now.as_second().saturating_sub(t.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7_200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3_600),
        s => format!("{}d", s / 86_400),
    }
}

fn or_dash(value: Option<&str>) -> &str {
    value.filter(|v| !v.is_empty()).unwrap_or("-")
}

/// The `status` table of one Scheduler.
pub fn status_table(
    out: &mut impl Write,
    summary: &Summary,
    rows: &[StatusRow],
    wide: bool,
    now: jiff::Timestamp,
) -> Result<()> {
    writeln!(out, "{}", summary.line()).map_err(io)?;
    let mut table = tabwriter::TabWriter::new(Vec::new()).padding(3);
    let header = "NODE\tPOD\tREVISION\tREADY\tKERNEL\tOPS\tSINCE\tLAST-EXIT\tRESTARTS\tAGENT";
    let header = if wide { format!("{header}\tREASON\tMESSAGE") } else { header.to_owned() };
    writeln!(table, "{header}").map_err(io)?;
    for r in rows {
        let revision = match (r.revision_role, &r.revision) {
            (Some(role), Some(rev)) if wide => format!("{role} ({rev})"),
            (Some(role), _) => role.to_owned(),
            _ => "-".into(),
        };
        let ready = r.ready.map_or("-", |ready| if ready { "true" } else { "false" });
        let kernel = if r.terminating { format!("{} (terminating)", r.kernel) } else { r.kernel.clone() };
        let since = r.since.as_deref().map_or_else(|| "-".into(), |s| age(s, now));
        let exit =
            r.last_exit.as_ref().map_or_else(|| "-".into(), |e| format!("{} ({} ago)", e.reason, age(&e.time, now)));
        let mut line = format!(
            "{}\t{}\t{revision}\t{ready}\t{kernel}\t{}\t{since}\t{exit}\t{}\t{}",
            r.node,
            or_dash(r.pod.as_deref()),
            or_dash(r.ops.as_deref()),
            r.restarts,
            or_dash(r.agent.as_deref())
        );
        if wide {
            line.push_str(&format!("\t{}\t{}", or_dash(r.reason.as_deref()), or_dash(r.message.as_deref())));
        }
        writeln!(table, "{line}").map_err(io)?;
    }
    flush(out, table)?;
    let contracts: Vec<&StatusRow> = rows.iter().filter(|r| r.cpu_contract.is_some()).collect();
    if !contracts.is_empty() {
        writeln!(out, "The pods' CPU contract, by node:").map_err(io)?;
        for r in contracts {
            writeln!(out, "  {}: {}", r.node, or_dash(r.cpu_contract.as_deref())).map_err(io)?;
        }
    }
    let judged: Vec<&StatusRow> = rows.iter().filter(|r| r.analysis.is_some()).collect();
    if !judged.is_empty() {
        writeln!(out, "Analysis of the last bake, by node:").map_err(io)?;
        for r in judged {
            writeln!(out, "  {}: {}", r.node, or_dash(r.analysis.as_deref())).map_err(io)?;
        }
    }
    Ok(())
}

/// The `nodes` table.
pub fn nodes_table(out: &mut impl Write, rows: &[NodeRow], wide: bool) -> Result<()> {
    let mut table = tabwriter::TabWriter::new(Vec::new()).padding(3);
    let header = if wide {
        "NODE\tSTATUS\tSCHED-EXT\tOWNER\tKERNEL\tOPS\tCONFLICTS\tJUDGED-ON\tNOT-READY"
    } else {
        "NODE\tSTATUS\tSCHED-EXT\tOWNER\tKERNEL\tOPS\tCONFLICTS"
    };
    writeln!(table, "{header}").map_err(io)?;
    for r in rows {
        let conflicts = if r.conflicts.is_empty() { "-".into() } else { r.conflicts.join(",") };
        let mut line = format!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{conflicts}",
            r.node,
            r.status,
            r.sched_ext,
            or_dash(r.owner.as_deref()),
            r.kernel,
            or_dash(r.ops.as_deref())
        );
        if wide {
            line.push_str(&format!(
                "\t{}\t{}",
                or_dash(r.unsupported_kernel.as_deref()),
                or_dash(r.not_ready.as_deref())
            ));
        }
        writeln!(table, "{line}").map_err(io)?;
    }
    flush(out, table)
}

/// The `doctor` report.
pub fn diagnosis(out: &mut impl Write, d: &Diagnosis) -> Result<()> {
    writeln!(out, "Node {}", d.node).map_err(io)?;
    let mut table = tabwriter::TabWriter::new(Vec::new()).padding(2);
    for (what, value) in &d.facts {
        writeln!(table, "  {what}:\t{value}").map_err(io)?;
    }
    flush(out, table)?;
    writeln!(out, "What to do:").map_err(io)?;
    for line in &d.advice {
        writeln!(out, "  - {line}").map_err(io)?;
    }
    Ok(())
}

fn flush(out: &mut impl Write, table: tabwriter::TabWriter<Vec<u8>>) -> Result<()> {
    let bytes = table.into_inner().map_err(|e| Error::Other(format!("aligning the table: {e}")))?;
    out.write_all(&bytes).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_as_kubectl_shows_them() {
        let now: jiff::Timestamp = "2026-12-04T12:00:00Z".parse().unwrap_or_default();
        assert_eq!(age("2026-12-04T11:59:15Z", now), "45s");
        assert_eq!(age("2026-12-04T11:55:00Z", now), "5m");
        assert_eq!(age("2026-12-04T09:00:00Z", now), "3h");
        assert_eq!(age("2026-12-01T12:00:00Z", now), "3d");
        assert_eq!(age("not a time", now), "-");
        assert_eq!(age("2026-12-04T11:59:59.500Z", now), "1s", "fractions of a second are fine");
    }
}
