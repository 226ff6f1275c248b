//! Pods that sked names by UID, named as their users know them: `namespace/name`.
//!
//! An agent finds a pod by its cgroup, whose path holds the pod's UID and nothing else, and the
//! controller reads no pod outside its own namespace (reading every pod of the cluster is a
//! right it does not need): so status says "pod UID 1f0c...". The plugin runs with the user's
//! rights, and looks the UIDs up among the pods of the nodes they were measured on. Where the
//! user may not list those pods, or a pod is gone, the UID stays.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use crate::cluster::Cluster;

/// How sked's texts name a pod by its UID.
const MARK: &str = "pod UID ";
/// Nodes looked up at most, per command (one list call each).
const MAX_NODES: usize = 16;

/// The UIDs a text names, in order.
pub fn uids(text: &str) -> Vec<&str> {
    text.match_indices(MARK)
        .filter_map(|(at, _)| {
            let rest = &text[at + MARK.len()..];
            let end = rest.find(|c: char| !(c.is_ascii_hexdigit() || c == '-')).unwrap_or(rest.len());
            Some(&rest[..end]).filter(|uid| uid.len() == 36)
        })
        .collect()
}

/// Pods by UID: `namespace/name`.
#[derive(Debug, Default)]
pub struct PodNames(BTreeMap<String, String>);

impl PodNames {
    /// `text` with each pod it names by a known UID named `namespace/name` instead.
    pub fn apply(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for uid in uids(text) {
            if let Some(name) = self.0.get(uid) {
                out = out.replace(&format!("{MARK}{uid}"), &format!("pod {name}"));
            }
        }
        out
    }
}

impl Cluster {
    /// The names of the pods on `nodes` (the first [`MAX_NODES`]) whose UIDs `texts` name; an
    /// empty map when none does, or the user may not list them.
    pub async fn pod_names<'a>(
        &self,
        nodes: impl IntoIterator<Item = &'a str>,
        texts: impl IntoIterator<Item = &'a str>,
    ) -> PodNames {
        let wanted: Vec<&str> = texts.into_iter().flat_map(uids).collect();
        let mut names = PodNames::default();
        if wanted.is_empty() {
            return names;
        }
        let pods: Api<Pod> = Api::all(self.client.clone());
        let mut nodes: Vec<&str> = nodes.into_iter().collect();
        nodes.sort_unstable();
        nodes.dedup();
        for node in nodes.into_iter().take(MAX_NODES) {
            let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
            let Ok(list) = pods.list_metadata(&params).await else { continue };
            for pod in list.items {
                if let Some(uid) = pod.metadata.uid.as_deref().filter(|uid| wanted.contains(uid)) {
                    let name = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
                    names.0.insert(uid.to_owned(), name);
                }
            }
        }
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0b7c2f3e-1d2a-4c5b-9e8f-123456789abc";

    #[test]
    fn a_uid_sked_names_reads_as_the_pod_s_namespace_and_name() {
        let text = format!("pod UID {UID} used 1.38 CPU against its limit of 0.50 on node n7; pod UID short is no UID");
        assert_eq!(uids(&text), vec![UID]);
        let names = PodNames(BTreeMap::from([(UID.to_owned(), "team-a/api-1".to_owned())]));
        assert_eq!(
            names.apply(&text),
            "pod team-a/api-1 used 1.38 CPU against its limit of 0.50 on node n7; pod UID short is no UID"
        );
        // Unknown: the UID stays.
        assert_eq!(PodNames::default().apply(&text), text);
        assert!(uids(&format!("pod UID {UID}")).len() == 1 && uids("no pod here").is_empty());
    }
}
