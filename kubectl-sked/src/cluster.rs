//! The API server, with the user's kubeconfig and RBAC: the reads every command shares, each
//! failure naming the call that failed.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::ListParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, ResourceExt};
use sked_api::Scheduler;
use sked_api::labels::{MANAGED_BY, MANAGED_BY_LABEL, NAME_LABEL};

use crate::cli::Global;
use crate::error::{Error, Result};
use crate::fleet::Fleet;

/// A client, and the namespace of the scheduler pods.
pub struct Cluster {
    pub client: Client,
    pub namespace: String,
}

/// Whether a command needs the Nodes or can do without them.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Nodes {
    Required,
    IfAllowed,
}

impl Cluster {
    pub async fn connect(global: &Global) -> Result<Self> {
        let options = KubeConfigOptions { context: global.context.clone(), ..KubeConfigOptions::default() };
        let config = match &global.kubeconfig {
            Some(path) => {
                let kubeconfig = Kubeconfig::read_from(path)
                    .map_err(|e| Error::Other(format!("reading the kubeconfig {}: {e}", path.display())))?;
                Config::from_custom_kubeconfig(kubeconfig, &options).await.map_err(|e| e.to_string())
            }
            None if global.context.is_some() => Config::from_kubeconfig(&options).await.map_err(|e| e.to_string()),
            None => Config::infer().await.map_err(|e| e.to_string()),
        }
        .map_err(|e| Error::Other(format!("loading the kubeconfig: {e}; set KUBECONFIG or pass --kubeconfig")))?;
        let client = Client::try_from(config).map_err(|e| Error::Other(format!("building a client: {e}")))?;
        Ok(Cluster { client, namespace: global.namespace.clone() })
    }

    pub fn schedulers(&self) -> Api<Scheduler> {
        Api::all(self.client.clone())
    }

    pub async fn scheduler(&self, name: &str) -> Result<Scheduler> {
        self.schedulers().get(name).await.map_err(|e| match Error::api(format!("getting Scheduler {name}"), e) {
            Error::NotFound(_) => {
                Error::NotFound(format!("Scheduler {name} not found (kubectl get schedulers lists them)"))
            }
            other => other,
        })
    }

    /// The Schedulers (one, or all), their pods, and the Nodes as `nodes` asks.
    pub async fn fleet(&self, scheduler: Option<&str>, nodes: Nodes) -> Result<Fleet> {
        let schedulers = match scheduler {
            Some(name) => vec![self.scheduler(name).await?],
            None => {
                self.schedulers()
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| Error::api("listing Schedulers", e))?
                    .items
            }
        };
        let mut selector = format!("{MANAGED_BY_LABEL}={MANAGED_BY}");
        if let Some(name) = scheduler {
            selector.push_str(&format!(",{NAME_LABEL}={name}"));
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let pods = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| Error::api(format!("listing scheduler pods in namespace {} (-n sets it)", self.namespace), e))?
            .items;
        let nodes = match Api::<Node>::all(self.client.clone()).list(&ListParams::default()).await {
            Ok(list) => Some(list.items),
            Err(e) => match (nodes, Error::api("listing Nodes", e)) {
                (Nodes::IfAllowed, Error::Forbidden { .. }) => {
                    eprintln!("note: you may not list Nodes; nodes without a scheduler pod are left out");
                    None
                }
                (_, e) => return Err(e),
            },
        };
        Ok(Fleet { schedulers, pods, nodes })
    }

    /// The scheduler pod on `node`, and its agent's `/metrics` through the API server's pod
    /// proxy.
    pub async fn agent_metrics(&self, node: &str) -> Result<(String, String)> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let listing = ListParams::default()
            .labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"))
            .fields(&format!("spec.nodeName={node}"));
        let found = pods.list(&listing).await.map_err(|e| {
            Error::api(format!("listing scheduler pods in namespace {} (-n sets it)", self.namespace), e)
        })?;
        let pod = found.items.into_iter().find(|p| p.metadata.deletion_timestamp.is_none()).ok_or_else(|| {
            Error::NotFound(format!(
                "no scheduler pod on node {node} in namespace {} (kubectl sked status lists them)",
                self.namespace
            ))
        })?;
        let name = pod.name_any();
        let port = sked_proto::contract::AGENT_PORT;
        let path = format!("/api/v1/namespaces/{}/pods/{name}:{port}/proxy/metrics", self.namespace);
        let request = http::Request::get(&path)
            .header(http::header::ACCEPT, "text/plain;version=0.0.4")
            .body(Vec::new())
            .map_err(|e| Error::Other(format!("building the request {path}: {e}")))?;
        let what = format!("reading the agent's /metrics of pod {name} through the API server ({path})");
        let text = self.client.request_text(request).await.map_err(|e| proxy_error(what, &path, &self.namespace, e))?;
        Ok((name, text))
    }
}

/// What a failed read through the API server's pod proxy means: RBAC's refusal ("... is
/// forbidden: User ... cannot get resource pods/proxy") names the Role that grants it; any other
/// 403 or 5xx is the proxy's own failure to reach the pod, not a permission.
fn proxy_error(what: String, path: &str, namespace: &str, e: kube::Error) -> Error {
    match e {
        kube::Error::Api(s) if s.code == 403 && s.message.contains("forbidden") => Error::Forbidden {
            what: format!(
                "{what}; get on pods/proxy in namespace {namespace} is needed: the chart's <release>-stats-reader Role grants it"
            ),
            message: s.message,
        },
        kube::Error::Api(s) if s.code == 403 || s.code >= 500 => Error::Other(format!(
            "{what}: the API server could not reach the pod: {}; its pod proxy must reach the pods' network (`kubectl get --raw {path}` fails the same way)",
            s.message
        )),
        e => Error::api(what, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(kube::core::Status::failure(message, "").with_code(code).boxed())
    }

    #[test]
    fn a_proxy_that_cannot_reach_the_pod_is_not_called_a_permission() {
        let rbac =
            r#"pods "p" is forbidden: User "v" cannot get resource "pods/proxy" in API group "" in the namespace "ns""#;
        let refused = proxy_error("reading".into(), "/p", "ns", status(403, rbac));
        assert!(matches!(&refused, Error::Forbidden { what, .. } if what.contains("<release>-stats-reader Role")));
        let unreachable = proxy_error("reading".into(), "/p", "ns", status(403, "resolve_deny: denied destination"));
        assert!(matches!(&unreachable, Error::Other(m) if m.contains("could not reach the pod")), "{unreachable}");
        let down = proxy_error("reading".into(), "/p", "ns", status(503, "error trying to reach service"));
        assert!(matches!(down, Error::Other(_)));
        assert!(matches!(proxy_error("reading".into(), "/p", "ns", status(404, "x")), Error::NotFound(_)));
    }
}
