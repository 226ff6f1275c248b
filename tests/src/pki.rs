//! Throwaway certificate authorities: the API server's PKI, serving certificates for the
//! reports server and webhook, and Fulcio-shaped code-signing certificates.

use anyhow::Result;
use rcgen::{
    BasicConstraints, CertificateParams, CustomExtension, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// A throwaway certificate authority for tests.
pub struct TestCa {
    cert_pem: String,
    cert_der: Vec<u8>,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its key, PEM-encoded.
pub struct IssuedCert {
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestCa {
    pub fn new(name: &str) -> Result<Self> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key)?;
        let (cert_pem, cert_der) = (cert.pem(), cert.der().to_vec());
        Ok(Self { cert_pem, cert_der, issuer: Issuer::new(params, key) })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn cert_der(&self) -> &[u8] {
        &self.cert_der
    }

    /// A code-signing certificate shaped like one Fulcio issues for a keyless signature: the
    /// identity as a URI SAN and the OIDC issuer in Sigstore's issuer extension
    /// (1.3.6.1.4.1.57264.1.1).
    pub fn code_signing(&self, identity: &str, oidc_issuer: &str) -> Result<IssuedCert> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.subject_alt_names.push(SanType::URI(identity.try_into()?));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::CodeSigning];
        params
            .custom_extensions
            .push(CustomExtension::from_oid_content(&[1, 3, 6, 1, 4, 1, 57264, 1, 1], oidc_issuer.as_bytes().to_vec()));
        self.issue(params)
    }

    /// A serving certificate for `dns` names and `ips`.
    pub fn server(&self, common_name: &str, dns: &[&str], ips: &[&str]) -> Result<IssuedCert> {
        let mut params = CertificateParams::new(dns.iter().map(|d| d.to_string()).collect::<Vec<_>>())?;
        for ip in ips {
            params.subject_alt_names.push(SanType::IpAddress(ip.parse()?));
        }
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params)
    }

    /// A client certificate with a common name and organisation (Kubernetes user and group).
    pub fn client(&self, common_name: &str, organization: &str) -> Result<IssuedCert> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.distinguished_name.push(DnType::OrganizationName, organization);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params)
    }

    fn issue(&self, params: CertificateParams) -> Result<IssuedCert> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(IssuedCert { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }
}
