//! Text that comes from a node (a sysfs file, an agent's report) is escaped and capped before it
//! reaches a status, an event, a log line or a metric label: control characters, invalid UTF-8
//! and other unprintable characters are written as escapes, and the length is bounded.

/// Most characters kept of a report's `reason`.
pub const MAX_REASON_CHARS: usize = 256;
/// Most characters kept of an ops name or a state read from sysfs.
pub const MAX_NAME_CHARS: usize = 128;
/// Most characters kept of the kernel's reason for an exit ("runnable task stall").
pub const MAX_EXIT_REASON_CHARS: usize = 128;
/// Most lines kept of the backtrace the kernel prints with an error exit.
pub const MAX_TRACE_LINES: usize = 16;
/// Most characters kept of one of those lines.
pub const MAX_TRACE_LINE_CHARS: usize = 160;
/// Most characters kept of a scheduler's last statistics (its scx_stats reply, as JSON text).
pub const MAX_SCHEDULER_STATS_CHARS: usize = 4096;
/// The kernel's reason for an exit it asks the scheduler's user space to restart from
/// (`SCX_EXIT_UNREG_KERN` with `SCX_ECODE_ACT_RESTART`: on current kernels, a CPU went on or off
/// line and the scheduler implements no `cpu_online`/`cpu_offline`). Both ends read it: an agent
/// of the release before `KernelExit.restart` sends the reason alone.
pub const RESTART_EXIT_REASON: &str = "unregistered from the main kernel";

/// `text` with every control or unprintable character escaped (`\u{0}`, `\u{1b}`, `\u{fffd}` for
/// invalid UTF-8 read lossily), cut to `max` characters of output, with how much was cut.
pub fn escape_and_cap(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max));
    let mut kept = 0usize;
    for (i, c) in text.char_indices() {
        let piece: String = if c.is_control() || c == char::REPLACEMENT_CHARACTER || is_invisible(c) {
            c.escape_default().collect()
        } else {
            c.to_string()
        };
        let len = piece.chars().count();
        if kept + len > max {
            out.push_str(&format!("… ({} more bytes)", text.len() - i));
            return out;
        }
        kept += len;
        out.push_str(&piece);
    }
    out
}

/// Characters that print as nothing, reorder text or break lines: bidirectional controls,
/// zero-width and other format characters, line and paragraph separators, tag characters.
fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{ad}'
            | '\u{61c}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}'
            | '\u{e0000}'..='\u{e007f}'
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_bytes_and_invalid_utf8_are_escaped() {
        let lossy = String::from_utf8_lossy(b"en\0abled\xff\x1b[31m");
        assert_eq!(escape_and_cap(&lossy, 100), "en\\u{0}abled\\u{fffd}\\u{1b}[31m");
        assert_eq!(escape_and_cap("rusty_1.0.0", 100), "rusty_1.0.0");
        assert_eq!(escape_and_cap("a\u{202e}b", 100), "a\\u{202e}b");
        assert_eq!(escape_and_cap("a\u{2028}b\u{e0041}", 100), "a\\u{2028}b\\u{e0041}");
    }

    #[test]
    fn long_text_is_capped_and_says_how_much_was_cut() {
        let long = "x".repeat(10_000);
        let capped = escape_and_cap(&long, 8);
        assert_eq!(capped, "xxxxxxxx… (9992 more bytes)");
    }

    #[test]
    fn escaping_never_exceeds_the_cap() {
        let text = "\0".repeat(100);
        let capped = escape_and_cap(&text, 10);
        assert!(capped.starts_with("\\u{0}\\u{0}…"), "{capped}");
    }
}
