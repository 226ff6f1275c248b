//! Registering the admission webhook with the API server, as the chart does.

use anyhow::Result;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};

/// Registers a validating webhook for Scheduler creates and updates, called at `url` (HTTPS,
/// certificate signed by `ca_pem`), failing closed. The API server applies it shortly after.
pub async fn register_validating_webhook(client: &Client, name: &str, url: &str, ca_pem: Vec<u8>) -> Result<()> {
    use k8s_openapi::api::admissionregistration::v1::{
        RuleWithOperations, ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
    };
    let config = ValidatingWebhookConfiguration {
        metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() },
        webhooks: Some(vec![ValidatingWebhook {
            name: "schedulers.sked.schedkit.io".into(),
            admission_review_versions: vec!["v1".into()],
            side_effects: "None".into(),
            failure_policy: Some("Fail".into()),
            timeout_seconds: Some(15),
            client_config: WebhookClientConfig {
                url: Some(url.into()),
                ca_bundle: Some(k8s_openapi::ByteString(ca_pem)),
                service: None,
            },
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec!["sked.schedkit.io".into()]),
                api_versions: Some(vec!["v1".into()]),
                operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
                resources: Some(vec!["schedulers".into()]),
                scope: Some("Cluster".into()),
            }]),
            ..Default::default()
        }]),
    };
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    api.patch(name, &PatchParams::apply("sked-tests").force(), &Patch::Apply(&config)).await?;
    Ok(())
}

/// Deletes a validating webhook configuration, if it exists.
pub async fn delete_validating_webhook(client: &Client, name: &str) -> Result<()> {
    let api: Api<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration> =
        Api::all(client.clone());
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
