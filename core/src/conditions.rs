//! What a Kubernetes condition says, in one line: the words sked quotes from a Node's Ready
//! condition or a pod's PodScheduled condition.

/// A condition's reason and message as "Reason: message" (either alone when the other is
/// empty; empty when both are), escaped and capped at `max` characters: they come from a
/// kubelet or a scheduler.
pub fn said(reason: Option<&str>, message: Option<&str>, max: usize) -> String {
    let said = [reason, message].into_iter().flatten().filter(|s| !s.is_empty()).collect::<Vec<_>>().join(": ");
    sked_proto::text::escape_and_cap(&said, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_and_message_in_one_escaped_line() {
        assert_eq!(said(Some("Unschedulable"), Some("0/6 nodes"), 100), "Unschedulable: 0/6 nodes");
        assert_eq!(said(None, Some("only this"), 100), "only this");
        assert_eq!(said(Some(""), None, 100), "");
        assert_eq!(said(Some("R"), Some("a\nb"), 100), "R: a\\nb");
    }
}
