//! A real OCI registry on 127.0.0.1 (Debian's `docker-registry`, the CNCF distribution
//! server), images pushed to it with `crane`, and signatures made with the real `cosign` CLI.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;

use crate::cluster::{self, tools_dir};
use crate::command::run_command as run;
use crate::pki::{IssuedCert, TestCa};

/// A registry process with its storage in a temporary directory.
pub struct TestRegistry {
    /// `127.0.0.1:<port>`.
    pub host: String,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl TestRegistry {
    /// A registry anyone may read and write.
    pub fn start() -> Result<Self> {
        Self::start_inner(None)
    }

    /// A registry that answers only to `user` with `password` (htpasswd, bcrypt), for reads and
    /// writes alike. `crane` pushes to it with those credentials ([`TestRegistry::docker_config`]).
    pub fn start_private(user: &str, password: &str) -> Result<Self> {
        Self::start_inner(Some((user, password)))
    }

    fn start_inner(credentials: Option<(&str, &str)>) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("sked-registry-").tempdir()?;
        let host = format!("127.0.0.1:{}", cluster::free_port()?);
        let mut config = format!(
            "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {host}\n  secret: sked-test\n",
            dir.path().join("data").display()
        );
        if let Some((user, password)) = credentials {
            let hash = bcrypt::hash(password, 4)?;
            std::fs::write(dir.path().join("htpasswd"), format!("{user}:{hash}\n"))?;
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: sked-test\n    path: {}\n",
                dir.path().join("htpasswd").display()
            ));
            // crane reads credentials from $DOCKER_CONFIG/config.json.
            let auth = B64.encode(format!("{user}:{password}"));
            let docker = format!(r#"{{"auths":{{"{host}":{{"auth":"{auth}"}}}}}}"#);
            std::fs::create_dir_all(dir.path().join("docker"))?;
            std::fs::write(dir.path().join("docker/config.json"), docker)?;
        }
        std::fs::write(dir.path().join("config.yml"), config)?;
        let mut registry = Self { host, dir, child: None };
        registry.resume()?;
        Ok(registry)
    }

    /// The `DOCKER_CONFIG` directory holding this registry's credentials (empty for an open one).
    pub fn docker_config(&self) -> PathBuf {
        self.dir.path().join("docker")
    }

    /// `crane` with this registry's credentials.
    fn crane(&self) -> Command {
        let mut cmd = Command::new(tool("crane"));
        cmd.env("DOCKER_CONFIG", self.docker_config());
        cmd
    }

    /// Copies `source_host/source_repository@digest` (readable anonymously) to `repository:tag`
    /// here, with the cosign signature tag of that digest (`sha256-<hex>.sig`).
    pub fn copy_signed(
        &self,
        source_host: &str,
        source_repository: &str,
        digest: &str,
        repository: &str,
        tag: &str,
    ) -> Result<()> {
        let from = format!("{source_host}/{source_repository}@{digest}");
        let to = format!("{}/{repository}:{tag}", self.host);
        run(self.crane().args(["copy", "--insecure", &from, &to]))?;
        let sig_tag = format!("{}.sig", digest.replace(':', "-"));
        let sig_from = format!("{source_host}/{source_repository}:{sig_tag}");
        let sig_to = format!("{}/{repository}:{sig_tag}", self.host);
        run(self.crane().args(["copy", "--insecure", &sig_from, &sig_to]))?;
        Ok(())
    }

    /// Stops the registry (its storage stays), as if it went down.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the registry again on the same address and storage.
    pub fn resume(&mut self) -> Result<()> {
        if self.child.is_some() {
            return Ok(());
        }
        let binary = std::env::var("SKED_DOCKER_REGISTRY").unwrap_or_else(|_| "docker-registry".into());
        let mut cmd = Command::new(&binary);
        cmd.arg("serve")
            .arg(self.dir.path().join("config.yml"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.path().join("registry.log"))?);
        let child = cluster::spawn(cmd)
            .with_context(|| format!("starting {binary} (install Debian's docker-registry package)"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(mut s) = std::net::TcpStream::connect(&self.host) {
                use std::io::Write;
                let _ = write!(s, "GET /v2/ HTTP/1.0\r\nHost: {}\r\n\r\n", self.host);
                let mut answer = String::new();
                let _ = s.read_to_string(&mut answer);
                // 401: a private registry is up and asks for credentials.
                let up = ["HTTP/1.0 200", "HTTP/1.1 200", "HTTP/1.0 401", "HTTP/1.1 401"];
                if up.iter().any(|status| answer.starts_with(status)) {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!("registry on {} did not answer /v2/ within 20 s", self.host);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Pushes a one-layer image whose only file holds `content`; returns its digest.
    pub fn push(&self, repository: &str, tag: &str, content: &str) -> Result<String> {
        let work = tempfile::tempdir()?;
        let file = work.path().join("content.txt");
        std::fs::write(&file, content)?;
        let layer = work.path().join("layer.tar");
        run(Command::new("tar").arg("-C").arg(work.path()).arg("-cf").arg(&layer).arg("content.txt"))?;
        let reference = format!("{}/{repository}:{tag}", self.host);
        run(Command::new(tool("crane")).args(["append", "--insecure", "-f"]).arg(&layer).args(["-t", &reference]))?;
        let digest = run(Command::new(tool("crane")).args(["digest", "--insecure", &reference]))?;
        Ok(digest.trim().to_owned())
    }
}

impl TestRegistry {
    /// Requests the registry has answered so far (its log's `response completed` lines).
    pub fn requests(&self) -> usize {
        let log = std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default();
        log.lines().filter(|l| l.contains("response completed")).count()
    }

    /// Requests answered so far for the registry path `path` (e.g. `/v2/<repository>/manifests/<tag>`).
    pub fn requests_to(&self, path: &str) -> usize {
        let log = std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default();
        // The registry logs the path unquoted: `http.request.uri=/v2/... http.request.useragent=...`.
        let uri = format!("http.request.uri={path} ");
        log.lines().filter(|l| l.contains("response completed") && l.contains(&uri)).count()
    }

    /// Tags of a repository.
    pub fn tags(&self, repository: &str) -> Result<Vec<String>> {
        let out = run(Command::new(tool("crane")).args(["ls", "--insecure", &format!("{}/{repository}", self.host)]))?;
        Ok(out.lines().map(str::to_owned).collect())
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        self.stop();
    }
}

fn tool(name: &str) -> PathBuf {
    tools_dir().join(name)
}

/// The real cosign CLI, isolated from the user's home and from Sigstore's public services.
pub struct Cosign {
    home: tempfile::TempDir,
}

/// A cosign key pair (`cosign generate-key-pair`, empty password).
pub struct KeyPairFiles {
    pub key: PathBuf,
    pub public_pem: String,
}

impl Cosign {
    pub fn new() -> Result<Self> {
        Ok(Self { home: tempfile::Builder::new().prefix("sked-cosign-").tempdir()? })
    }

    fn cmd(&self) -> Command {
        let mut cmd = Command::new(tool("cosign"));
        cmd.env("HOME", self.home.path())
            .env("TUF_ROOT", self.home.path().join("tuf"))
            .env("COSIGN_PASSWORD", "")
            .env("COSIGN_YES", "true")
            .current_dir(self.home.path());
        cmd
    }

    fn dir(&self, name: &str) -> Result<PathBuf> {
        let dir = self.home.path().join(name);
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }

    pub fn generate_key_pair(&self, name: &str) -> Result<KeyPairFiles> {
        let dir = self.dir(name)?;
        run(self.cmd().current_dir(&dir).arg("generate-key-pair"))?;
        Ok(KeyPairFiles { key: dir.join("cosign.key"), public_pem: std::fs::read_to_string(dir.join("cosign.pub"))? })
    }

    /// Imports a PEM private key (a certificate's) as a cosign key.
    pub fn import_key(&self, name: &str, key_pem: &str) -> Result<KeyPairFiles> {
        let dir = self.dir(name)?;
        std::fs::write(dir.join("input.pem"), key_pem)?;
        run(self.cmd().current_dir(&dir).args([
            "import-key-pair",
            "--key",
            "input.pem",
            "--output-key-prefix",
            "import",
        ]))?;
        Ok(KeyPairFiles { key: dir.join("import.key"), public_pem: std::fs::read_to_string(dir.join("import.pub"))? })
    }

    /// `cosign sign --key`: a legacy `.sig` signature, no transparency log (offline).
    pub fn sign_with_key(&self, image: &str, key: &Path) -> Result<()> {
        run(self.cmd().args(["sign", "--key"]).arg(key).args(offline_flags()).args([
            "--allow-http-registry",
            "--allow-insecure-registry",
            image,
        ]))?;
        Ok(())
    }

    /// Signs a blob; returns the base64 signature.
    pub fn sign_blob(&self, blob: &Path, key: &Path) -> Result<String> {
        let out = run(self.cmd().args(["sign-blob", "--key"]).arg(key).args(offline_flags()).arg(blob))?;
        Ok(out.trim().to_owned())
    }

    /// A keyless-style signature: the payload signed with a code-signing certificate's key,
    /// the certificate and its chain attached, and a transparency-log entry signed by `tlog`
    /// (the test's stand-in for Rekor, trusted through the custom trusted root).
    pub fn sign_keyless_style(&self, image: &str, cert: &IssuedCert, ca: &TestCa, tlog: &TestLog) -> Result<()> {
        let dir = tempfile::tempdir_in(self.home.path())?;
        let payload = run(self.cmd().args(["generate", "--allow-http-registry", "--allow-insecure-registry", image]))?;
        let payload_path = dir.path().join("payload.json");
        std::fs::write(&payload_path, &payload)?;
        let name = dir.path().file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let leaf = self.import_key(&format!("{name}-leaf"), &cert.key_pem)?;
        let signature = self.sign_blob(&payload_path, &leaf.key)?;

        // The hashedrekord entry a Rekor would log for this signature, and its SET.
        let body = serde_json::json!({
            "apiVersion": "0.0.1",
            "kind": "hashedrekord",
            "spec": {
                "data": {"hash": {"algorithm": "sha256", "value": sha256_hex(payload.as_bytes())}},
                "signature": {"content": signature, "publicKey": {"content": B64.encode(&cert.cert_pem)}},
            },
        });
        let entry = serde_json::json!({
            "body": B64.encode(serde_json::to_vec(&body)?),
            "integratedTime": jiff::Timestamp::now().as_second(),
            "logID": tlog.log_id_hex(),
            "logIndex": 1,
        });
        // serde_json's maps are sorted and compact: the canonical JSON of this entry.
        let entry_path = dir.path().join("entry.json");
        std::fs::write(&entry_path, serde_json::to_vec(&entry)?)?;
        let set = self.sign_blob(&entry_path, &tlog.key.key)?;
        let rekor = serde_json::json!({
            "base64Signature": signature,
            "cert": cert.cert_pem,
            "rekorBundle": {"SignedEntryTimestamp": set, "Payload": entry},
        });
        let rekor_path = dir.path().join("rekor.json");
        std::fs::write(&rekor_path, serde_json::to_vec(&rekor)?)?;
        let signature_path = dir.path().join("signature");
        std::fs::write(&signature_path, &signature)?;
        let cert_path = dir.path().join("cert.pem");
        std::fs::write(&cert_path, &cert.cert_pem)?;
        let chain_path = dir.path().join("chain.pem");
        std::fs::write(&chain_path, ca.cert_pem())?;
        run(self
            .cmd()
            .args(["attach", "signature", "--payload"])
            .arg(&payload_path)
            .arg("--signature")
            .arg(&signature_path)
            .arg("--certificate")
            .arg(&cert_path)
            .arg("--certificate-chain")
            .arg(&chain_path)
            .arg("--rekor-response")
            .arg(&rekor_path)
            .args(["--allow-http-registry", "--allow-insecure-registry", image]))?;
        Ok(())
    }
}

impl Cosign {
    /// A keyless-style signature in cosign v3's format: a Sigstore bundle (v0.3, a DSSE envelope
    /// over an in-toto statement naming the digest) attached to the image as an OCI referrer.
    /// The bundle's transparency-log entry is the test log's: a one-leaf Merkle tree whose
    /// checkpoint and entry timestamp `tlog` signs. Every signature is made by `cosign sign-blob`.
    pub fn sign_keyless_bundle(&self, pinned: &str, cert: &IssuedCert, tlog: &TestLog) -> Result<()> {
        let (repository, digest) = pinned.split_once("@sha256:").ok_or_else(|| anyhow!("{pinned} is not pinned"))?;
        let dir = tempfile::tempdir_in(self.home.path())?;
        let name = dir.path().file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let leaf = self.import_key(&format!("{name}-leaf"), &cert.key_pem)?;
        // The DSSE envelope is signed with the certificate's key, the log's statements with the log's.
        let sign = |file: &str, data: &[u8], key: &KeyPairFiles| -> Result<String> {
            let path = dir.path().join(file);
            std::fs::write(&path, data)?;
            self.sign_blob(&path, &key.key)
        };

        let statement = serde_json::to_vec(&serde_json::json!({
            "_type": "https://in-toto.io/Statement/v1",
            "subject": [{"name": repository, "digest": {"sha256": digest}}],
            "predicateType": "https://sigstore.dev/cosign/sign/v1",
            "predicate": {},
        }))?;
        let payload_type = "application/vnd.in-toto+json";
        let mut pae = format!("DSSEv1 {} {payload_type} {} ", payload_type.len(), statement.len()).into_bytes();
        pae.extend_from_slice(&statement);
        let signature = sign("pae", &pae, &leaf)?;
        let envelope = serde_json::json!({
            "payload": B64.encode(&statement),
            "payloadType": payload_type,
            "signatures": [{"sig": signature}],
        });
        // The envelope's hash as the sigstore crate computes it: its protobuf JSON form.
        let proto: sigstore_protobuf_specs::io::intoto::Envelope = serde_json::from_value(envelope.clone())?;
        let envelope_hash = sha256_hex(&serde_json::to_vec(&proto)?);

        let body = serde_json::to_vec(&serde_json::json!({
            "apiVersion": "0.0.1",
            "kind": "dsse",
            "spec": {
                "envelopeHash": {"algorithm": "sha256", "value": envelope_hash},
                "payloadHash": {"algorithm": "sha256", "value": sha256_hex(&statement)},
                "signatures": [{"signature": signature, "verifier": B64.encode(&cert.cert_pem)}],
            },
        }))?;
        // A tree of one leaf: its root is the leaf hash (RFC 6962: SHA-256 of 0x00 || entry).
        let root = sha256(&[&[0u8][..], &body].concat());
        let note = format!("rekor.sked.test - 1\n1\n{}\n", B64.encode(&root));
        let note_signature = B64.decode(sign("checkpoint", note.as_bytes(), &tlog.key)?)?;
        let checkpoint =
            format!("{note}\n\u{2014} rekor.sked.test {}\n", B64.encode([&[0u8; 4][..], &note_signature].concat()));
        let integrated_time = jiff::Timestamp::now().as_second();
        let entry = serde_json::json!({
            "body": B64.encode(&body),
            "integratedTime": integrated_time,
            "logID": tlog.log_id_hex(),
            "logIndex": 0,
        });
        let set = sign("entry", &serde_json::to_vec(&entry)?, &tlog.key)?;
        let bundle = serde_json::json!({
            "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
            "verificationMaterial": {
                "certificate": {"rawBytes": B64.encode(pem_body(&cert.cert_pem)?)},
                "tlogEntries": [{
                    "logIndex": "0",
                    "logId": {"keyId": B64.encode(tlog.log_id())},
                    "kindVersion": {"kind": "dsse", "version": "0.0.1"},
                    "integratedTime": integrated_time.to_string(),
                    "inclusionPromise": {"signedEntryTimestamp": set},
                    "inclusionProof": {
                        "logIndex": "0",
                        "rootHash": B64.encode(&root),
                        "treeSize": "1",
                        "hashes": [],
                        "checkpoint": {"envelope": checkpoint},
                    },
                    "canonicalizedBody": B64.encode(&body),
                }],
            },
            "dsseEnvelope": envelope,
        });
        let bundle_path = dir.path().join("bundle.json");
        std::fs::write(&bundle_path, serde_json::to_vec_pretty(&bundle)?)?;
        run(self.cmd().args(["attach", "signature", "--payload"]).arg(&bundle_path).args([
            "--allow-http-registry",
            "--allow-insecure-registry",
            pinned,
        ]))?;
        Ok(())
    }
}

fn offline_flags() -> [&'static str; 3] {
    ["--tlog-upload=false", "--new-bundle-format=false", "--use-signing-config=false"]
}

/// The test's transparency log: a key whose signed entry timestamps the trusted root vouches for.
pub struct TestLog {
    pub key: KeyPairFiles,
}

impl TestLog {
    pub fn public_der(&self) -> Result<Vec<u8>> {
        pem_body(&self.key.public_pem)
    }

    pub fn log_id(&self) -> Vec<u8> {
        self.public_der().map(|der| sha256(&der)).unwrap_or_default()
    }

    pub fn log_id_hex(&self) -> String {
        self.log_id().iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// A Sigstore `trusted_root.json` naming the test CA (as Fulcio) and the test log (as Rekor).
pub fn trusted_root_json(ca: &TestCa, tlog: &TestLog) -> Result<String> {
    let valid = serde_json::json!({"start": "2020-01-01T00:00:00Z"});
    let root = serde_json::json!({
        "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
        "tlogs": [{
            "baseUrl": "https://rekor.sked.test",
            "hashAlgorithm": "SHA2_256",
            "publicKey": {"rawBytes": B64.encode(tlog.public_der()?), "keyDetails": "PKIX_ECDSA_P256_SHA_256", "validFor": valid},
            "logId": {"keyId": B64.encode(tlog.log_id())},
        }],
        "certificateAuthorities": [{
            "subject": {"organization": "sked tests", "commonName": "sked test fulcio"},
            "uri": "https://fulcio.sked.test",
            "certChain": {"certificates": [{"rawBytes": B64.encode(ca.cert_der())}]},
            "validFor": valid,
        }],
        "ctlogs": [],
        "timestampAuthorities": [],
    });
    Ok(serde_json::to_string_pretty(&root)?)
}

fn pem_body(pem: &str) -> Result<Vec<u8>> {
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    B64.decode(body.trim()).map_err(|e| anyhow!("not PEM: {e}"))
}

fn sha256(data: &[u8]) -> Vec<u8> {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, data).as_ref().to_vec()
}

/// SHA-256 of `data`, as hex.
pub fn sha256_hex(data: &[u8]) -> String {
    sha256(data).iter().map(|b| format!("{b:02x}")).collect()
}
