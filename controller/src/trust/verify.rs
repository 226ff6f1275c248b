//! Does an image carry a signature that satisfies its rule? Signature layers come from the
//! `sigstore` crate, which has already checked what it can: certificate chains against the
//! trusted root, transparency-log entries against the log keys, and that each signed payload
//! names the image's digest. This module applies the rule on top.

use base64::Engine;
use sigstore::cosign::SignatureLayer;
use sigstore::cosign::bundle_content::BundleContent;
use sigstore::cosign::signature_layers::CertificateSubject;
use sigstore::crypto::{CosignVerificationKey, Signature};

use super::policy::Requirement;
use sked_core::hashing::sha256_hex;

/// Why no signature satisfied the rule, for messages: what was wanted and what was found.
#[derive(Debug, PartialEq, Eq)]
pub struct Unsatisfied {
    pub wanted: String,
    pub found: Vec<String>,
}

impl std::fmt::Display for Unsatisfied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.found.is_empty() {
            write!(f, "no trusted signature found; wanted {}", self.wanted)
        } else {
            write!(f, "wanted {}; found {}", self.wanted, self.found.join(", "))
        }
    }
}

/// Succeeds when one layer satisfies the requirement.
pub fn satisfies(requirement: &Requirement, layers: &[SignatureLayer]) -> Result<(), Unsatisfied> {
    match requirement {
        Requirement::Unsigned => Ok(()),
        Requirement::PublicKey { pem } => {
            let wanted = "a signature by the rule's public key".to_owned();
            let key = CosignVerificationKey::try_from_pem(pem.as_bytes())
                .map_err(|e| Unsatisfied { wanted: wanted.clone(), found: vec![format!("an unusable key ({e})")] })?;
            if layers.iter().any(|l| signed_by(l, &key)) {
                Ok(())
            } else {
                Err(Unsatisfied { wanted, found: layers.iter().map(describe).collect() })
            }
        }
        Requirement::Keyless { issuer, identity } => {
            let ok = layers.iter().any(|layer| {
                let Some(cert) = &layer.certificate_signature else { return false };
                cert.issuer.as_deref() == Some(issuer.as_str())
                    && identity.matches(subject(&cert.subject))
                    && signed_by(layer, &cert.verification_key)
                    && tlog_entry_covers(layer)
            });
            if ok {
                Ok(())
            } else {
                Err(Unsatisfied {
                    wanted: format!("a certificate for {identity} issued by {issuer:?}"),
                    found: layers.iter().map(describe).collect(),
                })
            }
        }
    }
}

fn subject(s: &CertificateSubject) -> &str {
    match s {
        CertificateSubject::Email(e) => e,
        CertificateSubject::Uri(u) => u,
    }
}

fn signed_by(layer: &SignatureLayer, key: &CosignVerificationKey) -> bool {
    layer
        .signature
        .as_ref()
        .is_some_and(|sig| key.verify_signature(Signature::Base64Encoded(sig.as_bytes()), &layer.raw_data).is_ok())
}

/// A legacy Rekor bundle's SET proves the log saw *its body*; check that the body is this
/// signature over this payload (the sigstore crate checks the SET but not what it covers).
/// Sigstore bundles are checked whole by the crate.
fn tlog_entry_covers(layer: &SignatureLayer) -> bool {
    match &layer.bundle {
        Some(BundleContent::RekorBundle(bundle)) => {
            let Some(signature) = &layer.signature else { return false };
            let Ok(body) = base64::engine::general_purpose::STANDARD.decode(&bundle.payload.body) else {
                return false;
            };
            let Ok(body) = serde_json::from_slice::<serde_json::Value>(&body) else { return false };
            let spec = &body["spec"];
            let digest = sha256_hex(&layer.raw_data);
            spec["signature"]["content"].as_str() == Some(signature.as_str())
                && spec["data"]["hash"]["algorithm"].as_str() == Some("sha256")
                && spec["data"]["hash"]["value"].as_str() == Some(digest.as_str())
        }
        Some(_) => true,
        None => false,
    }
}

/// One signature, as a user would want it described.
fn describe(layer: &SignatureLayer) -> String {
    match &layer.certificate_signature {
        Some(cert) => format!(
            "a certificate for {:?} issued by {:?}",
            subject(&cert.subject),
            cert.issuer.as_deref().unwrap_or("(no issuer)")
        ),
        None => "a signature by another key (or a certificate the trusted root does not vouch for)".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsigned_rules_need_nothing() {
        assert!(satisfies(&Requirement::Unsigned, &[]).is_ok());
    }

    #[test]
    fn no_layers_means_no_trusted_signature() {
        let requirement = Requirement::Keyless {
            issuer: "https://issuer".into(),
            identity: super::super::policy::Identity::Exact("me".into()),
        };
        let err = satisfies(&requirement, &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no trusted signature found; wanted a certificate for identity \"me\" issued by \"https://issuer\""
        );
    }
}
