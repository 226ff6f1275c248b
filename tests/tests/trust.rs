//! Image trust end to end, with real parts on 127.0.0.1: an OCI registry (Debian's
//! docker-registry), images pushed by crane, signatures made by the cosign CLI (a key pair, and
//! keyless-style certificates from a test CA checked against a custom trusted root), the
//! controller's admission webhook registered with the test API server and exercised through
//! `kubectl apply`.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow};
use kube::api::{Patch, PatchParams};
use serde_json::json;
use sked_controller::Scheduler;
use sked_controller::config::ControllerFlags;
use sked_tests::cluster::free_port;
use sked_tests::pki::{IssuedCert, TestCa};
use sked_tests::registry::{Cosign, KeyPairFiles, TestLog, TestRegistry, trusted_root_json};
use sked_tests::{Fixture, has_condition, spec_on, wait_for};

const ISSUER: &str = "https://token.actions.githubusercontent.com";
const GOOD_IDENTITY: &str = "https://github.com/schedkit/scx-images/.github/workflows/publish.yml@refs/tags/v1.0.0";
const EVIL_IDENTITY: &str = "https://github.com/evil/scx-images/.github/workflows/publish.yml@refs/tags/v1.0.0";
const WEBHOOK: &str = "sked-test-validation";
const POOL: (&str, &str) = ("pool", "trust");

/// What every test shares: the registry, the signers and the trust material.
struct World {
    registry: Mutex<TestRegistry>,
    host: String,
    cosign: Cosign,
    key: KeyPairFiles,
    other_key: KeyPairFiles,
    ca: TestCa,
    good_cert: IssuedCert,
    evil_cert: IssuedCert,
    tlog: TestLog,
    dir: tempfile::TempDir,
}

fn world() -> Result<&'static World> {
    static WORLD: OnceLock<std::result::Result<World, String>> = OnceLock::new();
    WORLD
        .get_or_init(|| build_world().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow!("setting up the registry and signers: {e}"))
}

fn build_world() -> Result<World> {
    let registry = TestRegistry::start()?;
    let host = registry.host.clone();
    let cosign = Cosign::new()?;
    let key = cosign.generate_key_pair("publisher")?;
    let other_key = cosign.generate_key_pair("someone-else")?;
    let ca = TestCa::new("sked test fulcio")?;
    let good_cert = ca.code_signing(GOOD_IDENTITY, ISSUER)?;
    let evil_cert = ca.code_signing(EVIL_IDENTITY, ISSUER)?;
    let tlog = TestLog { key: cosign.generate_key_pair("transparency-log")? };
    let dir = tempfile::Builder::new().prefix("sked-trust-").tempdir()?;
    std::fs::write(dir.path().join("trusted_root.json"), trusted_root_json(&ca, &tlog)?)?;
    let world =
        World { registry: Mutex::new(registry), host, cosign, key, other_key, ca, good_cert, evil_cert, tlog, dir };
    std::fs::write(world.dir.path().join("policy.yaml"), world.policy(&world.key.public_pem))?;
    Ok(world)
}

impl World {
    fn registry(&self) -> MutexGuard<'_, TestRegistry> {
        self.registry.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `keyed/*` needs a signature by `key`; `keyless/*` a certificate for a schedkit
    /// workflow; nothing else is allowed.
    fn policy(&self, key_pem: &str) -> String {
        let key = key_pem.lines().map(|l| format!("      {l}\n")).collect::<String>();
        format!(
            "rules:\n  - repository: {host}/keyed/*\n    publicKey: |\n{key}  - repository: {host}/keyless/*\n    keyless:\n      issuer: {ISSUER}\n      identityRegExp: ^https://github\\.com/schedkit/.+$\n",
            host = self.host
        )
    }

    /// Pushes an image and returns `host/repo@digest`.
    fn push(&self, repository: &str, tag: &str, content: &str) -> Result<String> {
        let digest = self.registry().push(repository, tag, content)?;
        Ok(format!("{}/{repository}@{digest}", self.host))
    }

    fn sign_with_key(&self, pinned: &str) -> Result<()> {
        self.cosign.sign_with_key(pinned, &self.key.key)
    }

    fn sign_keyless(&self, pinned: &str, cert: &IssuedCert) -> Result<()> {
        self.cosign.sign_keyless_style(pinned, cert, &self.ca, &self.tlog)
    }
}

/// Controller flags for these tests: the world's policy (copied, so a test may edit it), the
/// custom trusted root, the plain-HTTP registry, the webhook on a free port.
fn flags(world: &World, test_dir: &Path) -> Result<ControllerFlags> {
    let policy = test_dir.join("policy.yaml");
    std::fs::copy(world.dir.path().join("policy.yaml"), &policy)?;
    let webhook_cert = TestCa::new("sked webhook ca")?;
    let serving = webhook_cert.server("sked-webhook", &["localhost"], &["127.0.0.1"])?;
    std::fs::write(test_dir.join("tls.crt"), &serving.cert_pem)?;
    std::fs::write(test_dir.join("tls.key"), &serving.key_pem)?;
    std::fs::write(test_dir.join("ca.crt"), webhook_cert.cert_pem())?;
    Ok(ControllerFlags {
        trust_policy: Some(policy),
        trust_policy_poll_interval: Duration::from_millis(200),
        trusted_root: Some(world.dir.path().join("trusted_root.json")),
        insecure_registries: vec![world.host.clone()],
        registry_timeout: Duration::from_secs(3),
        image_recheck_interval: Duration::from_secs(1),
        webhook_bind_address: ([127, 0, 0, 1], free_port()?).into(),
        webhook_cert_dir: Some(test_dir.to_path_buf()),
        ..ControllerFlags::default()
    })
}

/// Registers the controller's webhook with the API server and waits until it is in force.
async fn register_webhook(fx: &Fixture, flags: &ControllerFlags, test_dir: &Path) -> Result<()> {
    let ca = std::fs::read(test_dir.join("ca.crt"))?;
    let url = format!("https://{}{}", flags.webhook_bind_address, sked_controller::webhook::VALIDATE_PATH);
    sked_tests::register_validating_webhook(&fx.client, WEBHOOK, &url, ca).await?;
    // The API server picks webhook configurations up asynchronously: wait until a server-side
    // dry run of a disallowed image is refused by it.
    let probe = scheduler_yaml("webhook-probe", "registry.invalid/not/allowed:v1");
    wait_for("the webhook to be in force", || {
        let out = dry_run(fx, &probe);
        async move {
            let out = out?;
            let stderr = String::from_utf8_lossy(&out.stderr);
            if !out.status.success() && stderr.contains("not allowed") {
                Ok(Some(()))
            } else {
                Err(anyhow!("dry run: {stderr}"))
            }
        }
    })
    .await
}

async fn unregister_webhook(fx: &Fixture) -> Result<()> {
    sked_tests::delete_validating_webhook(&fx.client, WEBHOOK).await?;
    // Until the API server forgets it, a dry run would still be refused.
    let probe = scheduler_yaml("webhook-probe", "registry.invalid/not/allowed:v1");
    wait_for("the webhook to be gone", || {
        let out = dry_run(fx, &probe);
        async move { Ok(out?.status.success().then_some(())) }
    })
    .await
}

fn dry_run(fx: &Fixture, yaml: &str) -> Result<std::process::Output> {
    tokio::task::block_in_place(|| fx.kubectl_apply_with(yaml, &["--dry-run=server"]))
}

fn scheduler_yaml(name: &str, image: &str) -> String {
    scheduler_yaml_on(name, image, POOL.1)
}

fn scheduler_yaml_on(name: &str, image: &str, pool: &str) -> String {
    format!(
        "apiVersion: sked.schedkit.io/v1\nkind: Scheduler\nmetadata:\n  name: {name}\nspec:\n  sched: {image}\n  nodeSelector:\n    {}: {pool}\n",
        POOL.0
    )
}

/// Starts a fixture with the trust flags, one node in the pool, and the webhook registered.
async fn start(with_webhook: bool) -> Result<(Fixture, &'static World, tempfile::TempDir, ControllerFlags)> {
    let world = world()?;
    world.registry().resume()?;
    let dir = tempfile::Builder::new().prefix("sked-trust-test-").tempdir()?;
    let flags = flags(world, dir.path())?;
    let fx = Fixture::start_with(flags.clone()).await?;
    fx.create_node("trust-node", &[POOL]).await?;
    if with_webhook {
        register_webhook(&fx, &flags, dir.path()).await?;
    } else {
        unregister_webhook(&fx).await?;
    }
    Ok((fx, world, dir, flags))
}

/// Replaces a file at once (write, then rename), as the kubelet updates a mounted ConfigMap.
fn replace_file(path: &Path, contents: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Pushes an image signed with the world's key, runs Scheduler `name` on it by tag, and waits
/// until its DaemonSet runs the digest; returns `host/repository@digest`.
async fn run_signed(
    fx: &Fixture,
    world: &World,
    name: &str,
    repository: &str,
    tag: &str,
    content: &str,
) -> Result<String> {
    let pinned = world.push(repository, tag, content)?;
    world.sign_with_key(&pinned)?;
    fx.create_scheduler(name, spec_on(&format!("{}/{repository}:{tag}", world.host), &[POOL])).await?;
    wait_daemonset_image(fx, name, &pinned).await?;
    Ok(pinned)
}

/// Waits until the Scheduler reports its image refused (Degraded, ImageVerificationFailed).
async fn wait_image_refused(fx: &Fixture, name: &str, what: &str) -> Result<Scheduler> {
    fx.wait_scheduler(name, what, |s| has_condition(s, "Degraded", "True", "ImageVerificationFailed")).await
}

fn apply_ok(fx: &Fixture, yaml: &str) -> Result<()> {
    let out = tokio::task::block_in_place(|| fx.kubectl_apply(yaml))?;
    anyhow::ensure!(out.status.success(), "kubectl apply refused: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}

/// `kubectl apply` must fail; returns what it printed.
fn apply_refused(fx: &Fixture, yaml: &str) -> Result<String> {
    let out = tokio::task::block_in_place(|| fx.kubectl_apply(yaml))?;
    anyhow::ensure!(!out.status.success(), "kubectl apply was accepted: {}", String::from_utf8_lossy(&out.stdout));
    Ok(String::from_utf8_lossy(&out.stderr).into_owned())
}

async fn daemonset_image(fx: &Fixture, name: &str) -> Result<Option<String>> {
    Ok(fx
        .daemonsets()
        .get_opt(name)
        .await?
        .and_then(|ds| ds.spec.template.spec?.containers.into_iter().find(|c| c.name == "scx").and_then(|c| c.image)))
}

async fn wait_daemonset_image(fx: &Fixture, name: &str, image: &str) -> Result<()> {
    wait_for(&format!("DaemonSet {name} to run {image}"), || async {
        if daemonset_image(fx, name).await?.as_deref() == Some(image) {
            return Ok(Some(()));
        }
        // Say why in the timeout message.
        let degraded = fx
            .schedulers()
            .get_opt(name)
            .await?
            .as_ref()
            .and_then(|s| sked_tests::condition(s, "Degraded").map(|c| c.message.clone()));
        Err(anyhow!("Scheduler {name} Degraded: {degraded:?}"))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_images_are_deployed_by_digest() -> Result<()> {
    let (fx, world, _dir, _) = start(true).await?;
    // (a) a key pair.
    let keyed = world.push("keyed/canary", "v1", "keyed v1")?;
    world.sign_with_key(&keyed)?;
    apply_ok(&fx, &scheduler_yaml("keyed", &format!("{}/keyed/canary:v1", world.host)))?;
    wait_daemonset_image(&fx, "keyed", &keyed).await?;
    let s = fx.wait_scheduler("keyed", "resolvedImage", |s| {
        s.status.as_ref().and_then(|st| st.resolved_image.as_deref()) == Some(keyed.as_str())
    });
    s.await?;

    // (b) keyless-style: a certificate for a schedkit workflow, chained to the trusted root.
    // Each Scheduler gets a node of its own (they would conflict over one).
    fx.create_node("trust-node-keyless", &[(POOL.0, "keyless")]).await?;
    fx.create_node("trust-node-pinned", &[(POOL.0, "pinned")]).await?;
    let keyless = world.push("keyless/canary", "v1", "keyless v1")?;
    world.sign_keyless(&keyless, &world.good_cert)?;
    apply_ok(&fx, &scheduler_yaml_on("keyless", &format!("{}/keyless/canary:v1", world.host), "keyless"))?;
    wait_daemonset_image(&fx, "keyless", &keyless).await?;

    // An explicit digest is verified too, and deployed as it is.
    apply_ok(&fx, &scheduler_yaml_on("pinned", &keyless, "pinned"))?;
    wait_daemonset_image(&fx, "pinned", &keyless).await?;
    let metrics = fx.scrape_metrics().await?;
    assert!(metrics.contains(r#"sked_image_verifications_total{caller="webhook",outcome="verified"}"#), "{metrics}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cosign_v3_bundle_is_found_through_referrers_and_verified() -> Result<()> {
    let (fx, world, _dir, _) = start(true).await?;
    // Only a Sigstore bundle (no `.sig` tag): found through the referrers tag schema, since
    // this registry has no referrers API.
    let bundled = world.push("keyless/bundled", "v1", "signed with a bundle")?;
    world.cosign.sign_keyless_bundle(&bundled, &world.good_cert, &world.tlog)?;
    let tags = world.registry().tags("keyless/bundled")?;
    let digest_tag = bundled.rsplit_once('@').map(|(_, d)| d.replace(':', "-")).unwrap_or_default();
    assert!(tags.contains(&digest_tag), "the referrers index tag: {tags:?}");
    assert!(!tags.iter().any(|t| t.ends_with(".sig")), "no legacy signature: {tags:?}");
    apply_ok(&fx, &scheduler_yaml("bundled", &format!("{}/keyless/bundled:v1", world.host)))?;
    wait_daemonset_image(&fx, "bundled", &bundled).await?;

    // The same kind of bundle for the wrong identity is refused, naming what it found.
    let evil = world.push("keyless/bundled-evil", "v1", "bundle for the wrong workflow")?;
    world.cosign.sign_keyless_bundle(&evil, &world.evil_cert, &world.tlog)?;
    let err = apply_refused(&fx, &scheduler_yaml("bundled-evil", &evil))?;
    assert!(err.contains(EVIL_IDENTITY), "{err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_refuses_what_the_policy_does_not_allow() -> Result<()> {
    let (fx, world, _dir, _) = start(true).await?;
    let unsigned = world.push("keyed/unsigned", "v1", "nobody signed this")?;
    let err = apply_refused(&fx, &scheduler_yaml("unsigned", &unsigned))?;
    assert!(err.contains("signature of image") && err.contains(&unsigned), "{err}");
    assert!(err.contains("no trusted signature found"), "{err}");

    let evil = world.push("keyless/evil", "v1", "signed by the wrong workflow")?;
    world.sign_keyless(&evil, &world.evil_cert)?;
    let err = apply_refused(&fx, &scheduler_yaml("evil", &format!("{}/keyless/evil:v1", world.host)))?;
    assert!(err.contains(EVIL_IDENTITY) && err.contains("wanted a certificate for identity matching"), "{err}");

    let other = world.push("keyed/other-signer", "v1", "signed with another key")?;
    world.cosign.sign_with_key(&other, &world.other_key.key)?;
    let err = apply_refused(&fx, &scheduler_yaml("other", &other))?;
    assert!(err.contains("wanted a signature by the rule's public key"), "{err}");

    let err = apply_refused(&fx, &scheduler_yaml("elsewhere", &format!("{}/elsewhere/x:v1", world.host)))?;
    assert!(err.contains("is not allowed") && err.contains("add a rule"), "{err}");

    let err = apply_refused(&fx, &scheduler_yaml("missing", &format!("{}/keyed/missing:v1", world.host)))?;
    assert!(err.contains("was not found in registry"), "{err}");

    let mut invalid = scheduler_yaml("twice", &unsigned);
    invalid.push_str("  env:\n  - name: A\n    value: \"1\"\n  - name: A\n    value: \"2\"\n");
    let err = apply_refused(&fx, &invalid)?;
    assert!(err.contains("spec.env") && err.contains("set twice"), "{err}");

    for name in ["unsigned", "evil", "other", "elsewhere", "missing", "twice"] {
        assert!(fx.schedulers().get_opt(name).await?.is_none(), "{name} must not exist");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsigned_image_that_gets_in_is_reported_and_never_deployed() -> Result<()> {
    let (fx, world, _dir, _) = start(false).await?;
    let unsigned = world.push("keyed/sneaky", "v1", "got in while the webhook was off")?;
    fx.create_scheduler("sneaky", spec_on(&unsigned, &[POOL])).await?;
    let s = wait_image_refused(&fx, "sneaky", "Degraded ImageVerificationFailed").await?;
    let message = sked_tests::condition(&s, "Degraded").map(|c| c.message.clone()).unwrap_or_default();
    assert!(message.contains(&unsigned) && message.contains("no trusted signature"), "{message}");
    fx.wait_event("sneaky", "Warning", "ImageVerificationFailed", 1).await?;
    assert!(fx.daemonsets().get_opt("sneaky").await?.is_none(), "an unverified image must not be deployed");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tag_moved_to_an_unsigned_image_keeps_the_old_daemonset() -> Result<()> {
    let (fx, world, _dir, _) = start(false).await?;
    let first = run_signed(&fx, world, "moving", "keyed/moving", "stable", "release 1").await?;
    let generation = fx.daemonsets().get("moving").await?.metadata.generation;

    // The tag moves to an image nobody signed: reported, and the DaemonSet is left alone.
    let second = world.push("keyed/moving", "stable", "release 2, unsigned")?;
    let s = wait_image_refused(&fx, "moving", "ImageVerificationFailed after the tag moved").await?;
    assert_eq!(s.status.as_ref().and_then(|st| st.resolved_image.clone()), Some(first.clone()));
    let ds = fx.daemonsets().get("moving").await?;
    assert_eq!(ds.metadata.generation, generation, "the DaemonSet must not change");
    assert_eq!(daemonset_image(&fx, "moving").await?, Some(first.clone()));

    // Once the new digest is signed, the tag is followed.
    world.sign_with_key(&second)?;
    wait_daemonset_image(&fx, "moving", &second).await?;
    fx.wait_scheduler("moving", "Degraded cleared", |s| has_condition(s, "Degraded", "False", "AsExpected")).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_registry_keeps_the_verified_digest_without_degrading() -> Result<()> {
    let (mut fx, world, _dir, flags) = start(true).await?;
    let image = world.push("keyed/steady", "v1", "steady")?;
    world.sign_with_key(&image)?;
    apply_ok(&fx, &scheduler_yaml("steady", &format!("{}/keyed/steady:v1", world.host)))?;
    wait_daemonset_image(&fx, "steady", &image).await?;

    world.registry().stop();
    // An edit that leaves the image alone passes the webhook without the registry...
    let patch = json!({"spec": {"args": ["--slice-us=5000"]}});
    fx.schedulers().patch("steady", &PatchParams::default(), &Patch::Merge(&patch)).await?;
    // ...and the reconciler, which cannot resolve the tag again, keeps the digest it verified
    // (the edit goes out with it) and does not call the Scheduler degraded. The failed recheck
    // is counted apart from refusals.
    wait_for("the edit deployed with the verified digest", || async {
        let ds = fx.daemonsets().get("steady").await?;
        let scx = ds.spec.template.spec.and_then(|p| p.containers.into_iter().find(|c| c.name == "scx"));
        let deployed = scx.as_ref().and_then(|c| c.image.clone());
        let args = scx.and_then(|c| c.args).unwrap_or_default();
        Ok((args == ["--slice-us=5000"] && deployed.as_deref() == Some(image.as_str())).then_some(()))
    })
    .await?;
    let kept = "sked_image_verifications_total{caller=\"reconcile\",outcome=\"kept_registry_unreachable\"}";
    let counted = |metrics: &str| metrics.lines().any(|l| l.starts_with(kept) && !l.ends_with(" 0"));
    wait_for("a failed recheck counted", || async { Ok(counted(&fx.scrape_metrics().await?).then_some(())) }).await?;
    let s = fx.schedulers().get("steady").await?;
    assert!(has_condition(&s, "Degraded", "False", "AsExpected"), "{:?}", s.status);

    // A new leader (a restarted controller) has verified nothing itself, and the registry is
    // still down: the DaemonSet says its digest was admitted for this image, these pull secrets
    // and this policy rule, so that digest stays and the Scheduler is not degraded either.
    let generation = fx.daemonsets().get("steady").await?.metadata.generation;
    fx.stop_controller().await?;
    fx.start_controller(flags)?;
    // The recheck is counted during the reconcile, before its status write: read the status
    // once a reconcile of the new controller (its counters start at zero) has ended.
    wait_for("the new controller's recheck kept the digest, its reconcile ended", || async {
        let counts = counted(&fx.scrape_metrics().await?) && fx.metric_total("sked_reconciles_total").await? > 0;
        Ok(counts.then_some(()))
    })
    .await?;
    let s = fx.schedulers().get("steady").await?;
    assert!(has_condition(&s, "Degraded", "False", "AsExpected"), "{:?}", s.status);
    assert_eq!(s.status.as_ref().and_then(|st| st.resolved_image.clone()), Some(image.clone()));
    assert_eq!(fx.daemonsets().get("steady").await?.metadata.generation, generation, "the DaemonSet is unchanged");
    assert_eq!(daemonset_image(&fx, "steady").await?, Some(image.clone()));
    // A new Scheduler is refused with the registry named, not called unsigned.
    let err = apply_refused(&fx, &scheduler_yaml("newcomer", &format!("{}/keyed/steady:v1", world.host)))?;
    assert!(err.contains("cannot reach the registry") && !err.contains("signature"), "{err}");
    world.registry().resume()?;
    Ok(())
}

/// A `kubernetes.io/dockerconfigjson` Secret for `host` in the workload namespace.
async fn pull_secret(fx: &Fixture, name: &str, host: &str, user: &str, password: &str) -> Result<()> {
    use base64::Engine;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let config = format!(r#"{{"auths":{{"{host}":{{"auth":"{auth}"}}}}}}"#);
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
        "metadata": {"name": name},
        "stringData": {".dockerconfigjson": config},
    }))?;
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(fx.client.clone(), &fx.namespace);
    secrets.patch(name, &PatchParams::apply("sked-tests").force(), &Patch::Apply(&secret)).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_credentials_belong_to_one_scheduler_and_follow_rotation() -> Result<()> {
    let world = world()?;
    world.registry().resume()?;
    let private = TestRegistry::start_private("team", "s3cret")?;
    let dir = tempfile::Builder::new().prefix("sked-trust-test-").tempdir()?;
    let mut flags = flags(world, dir.path())?;
    flags.insecure_registries.push(private.host.clone());
    // The private registry's images need the world's key too.
    let key = world.key.public_pem.lines().map(|l| format!("      {l}\n")).collect::<String>();
    let policy = format!(
        "{}  - repository: {}/team/*\n    publicKey: |\n{key}",
        world.policy(&world.key.public_pem),
        private.host
    );
    std::fs::write(dir.path().join("policy.yaml"), policy)?;
    let fx = Fixture::start_with(flags).await?;
    fx.create_node("trust-node", &[POOL]).await?;
    unregister_webhook(&fx).await?;

    // A signed image, copied with its signature into the private registry.
    let pinned = world.push("keyed/private-source", "v1", "private")?;
    world.sign_with_key(&pinned)?;
    let digest = pinned.rsplit('@').next().context("digest")?.to_owned();
    private.copy_signed(&world.host, "keyed/private-source", &digest, "team/private", "v1")?;
    let image = format!("{}/team/private:v1", private.host);
    let deployed = format!("{}/team/private@{digest}", private.host);

    // With the team's pull secret: verified and deployed.
    pull_secret(&fx, "team-cred", &private.host, "team", "s3cret").await?;
    let mut with_creds = spec_on(&image, &[POOL]);
    with_creds.image_pull_secrets = vec![k8s_openapi::api::core::v1::LocalObjectReference { name: "team-cred".into() }];
    fx.create_scheduler("a-with-creds", with_creds).await?;
    wait_daemonset_image(&fx, "a-with-creds", &deployed).await?;

    // Another Scheduler without credentials, same image, after the first was verified, on a
    // node of its own (so only its image can keep it from being deployed): it borrows nothing,
    // and the verified digest does not let it in.
    let own_pool = ("pool", "trust-b");
    fx.create_node("trust-node-b", &[own_pool]).await?;
    fx.create_scheduler("b-no-creds", spec_on(&image, &[own_pool])).await?;
    let s = wait_image_refused(&fx, "b-no-creds", "refused without credentials").await?;
    let message = sked_tests::condition(&s, "Degraded").map(|c| c.message.clone()).unwrap_or_default();
    assert!(message.contains("refused access") && message.contains("imagePullSecrets"), "{message}");
    assert_eq!(daemonset_image(&fx, "b-no-creds").await?, None, "never deployed");
    // The positive control: given its own secret for the same registry, it is deployed there
    // (so the node was its own, and the missing credentials alone kept it out).
    pull_secret(&fx, "b-cred", &private.host, "team", "s3cret").await?;
    let patch = json!({"spec": {"imagePullSecrets": [{"name": "b-cred"}]}});
    fx.schedulers().patch("b-no-creds", &PatchParams::default(), &Patch::Merge(&patch)).await?;
    wait_daemonset_image(&fx, "b-no-creds", &deployed).await?;

    // The team's secret is rotated to a wrong password: the next check uses it at once.
    pull_secret(&fx, "team-cred", &private.host, "team", "wrong").await?;
    let s = wait_image_refused(&fx, "a-with-creds", "refused with the rotated secret").await?;
    let message = sked_tests::condition(&s, "Degraded").map(|c| c.message.clone()).unwrap_or_default();
    assert!(message.contains("refused access"), "{message}");
    assert_eq!(daemonset_image(&fx, "a-with-creds").await?, Some(deployed), "the running DaemonSet is kept");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_change_reverifies_and_a_broken_policy_is_ignored() -> Result<()> {
    let (fx, world, dir, flags) = start(false).await?;
    let image = run_signed(&fx, world, "policy", "keyed/policy", "v1", "policy test").await?;
    let policy_path: PathBuf = flags.trust_policy.clone().context("policy path")?;

    // A policy that does not parse is refused (and counted); the last good one stays.
    replace_file(&policy_path, "rules:\n  - repository: x\n    unsigned: maybe\n")?;
    wait_for("the broken policy to be refused", || async {
        Ok(fx.scrape_metrics().await?.contains(r#"sked_trust_policy_reloads_total{result="refused"} 1"#).then_some(()))
    })
    .await?;
    let signed_again = world.push("keyed/policy-2", "v1", "admitted under the last good policy")?;
    world.sign_with_key(&signed_again)?;
    fx.create_scheduler("policy-2", spec_on(&signed_again, &[("pool", "nowhere")])).await?;
    fx.wait_scheduler("policy-2", "admitted", |s| {
        s.status.as_ref().and_then(|st| st.resolved_image.as_deref()) == Some(signed_again.as_str())
    })
    .await?;

    // The last good policy, not a broken one that admits anything: an unsigned image and one
    // signed by another key are still refused.
    let unsigned = world.push("keyed/policy-3", "v1", "unsigned, under the last good policy")?;
    fx.create_scheduler("policy-3", spec_on(&unsigned, &[("pool", "nowhere")])).await?;
    wait_image_refused(&fx, "policy-3", "the unsigned image refused under the last good policy").await?;
    let foreign = world.push("keyed/policy-4", "v1", "signed by another key, under the last good policy")?;
    world.cosign.sign_with_key(&foreign, &world.other_key.key)?;
    fx.create_scheduler("policy-4", spec_on(&foreign, &[("pool", "nowhere")])).await?;
    wait_image_refused(&fx, "policy-4", "the image signed by another key refused under the last good policy").await?;

    // A policy that trusts another key re-verifies the running Scheduler, which now fails; its
    // DaemonSet is kept.
    replace_file(&policy_path, &world.policy(&world.other_key.public_pem))?;
    wait_image_refused(&fx, "policy", "ImageVerificationFailed under the new policy").await?;
    assert_eq!(daemonset_image(&fx, "policy").await?, Some(image.clone()));
    drop(dir);
    Ok(())
}

/// `kubectl apply` of `yaml` as `user` in `groups`; what it printed, and whether it went through.
fn apply_as(fx: &Fixture, yaml: &str, user: &str, groups: &[&str]) -> Result<(bool, String)> {
    let mut flags = vec![format!("--as={user}")];
    flags.extend(groups.iter().map(|g| format!("--as-group={g}")));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let out = tokio::task::block_in_place(|| fx.kubectl_apply_with(yaml, &flags))?;
    let printed = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Ok((out.status.success(), printed))
}

/// RBAC lets every member of group `editors` create, change and delete Schedulers.
const EDITORS_RBAC: &str = "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: trust-test-scheduler-editor}
rules:
  - apiGroups: [sked.schedkit.io]
    resources: [schedulers]
    verbs: [get, list, watch, create, update, patch, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: trust-test-scheduler-editors}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: trust-test-scheduler-editor}
subjects:
  - {apiGroup: rbac.authorization.k8s.io, kind: Group, name: editors}
";

#[tokio::test(flavor = "multi_thread")]
async fn the_webhook_answers_while_peers_stall_inside_their_hello() -> Result<()> {
    let (fx, world, dir, flags) = start(true).await?;
    let flood = sked_tests::agents::stalled_hello_flood(flags.webhook_bind_address.port(), 1500, 200);

    let dropped = r#"sked_tls_connections_dropped_total{port="webhook",reason="incomplete_hello"}"#;
    wait_for("the flood to be met at the webhook's door", || async {
        let metrics = fx.scrape_metrics().await?;
        let n = metrics.lines().find_map(|l| l.strip_prefix(dropped)).and_then(|n| n.trim().parse::<f64>().ok());
        Ok(n.is_some_and(|n| n >= 1500.0).then_some(()))
    })
    .await?;
    // The API server calls the webhook for a dry run, and gets its answer (a refusal of an
    // image no rule names, from the webhook itself: not a call that failed or timed out).
    let started = std::time::Instant::now();
    let yaml = scheduler_yaml("flooded-probe", &format!("{}/nowhere/lavd:v1", world.host));
    let out = tokio::task::block_in_place(|| fx.kubectl_apply_with(&yaml, &["--dry-run=server"]))?;
    let took = started.elapsed();
    eprintln!("measured: a dry run the webhook judged, during the flood: {took:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("denied the request") && said.contains("no rule of the trust policy matches"), "{said}");
    assert!(took < std::time::Duration::from_secs(5), "the webhook answered after {took:?}");
    drop(flood);
    drop(dir);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_callers_the_policy_names_may_deploy_and_anyone_may_delete() -> Result<()> {
    let (fx, world, dir, flags) = start(true).await?;
    apply_ok(&fx, EDITORS_RBAC)?;
    let host = &world.host;
    // Team A's CI may deploy team A's repository; only the platform group may deploy the rest.
    let policy = format!(
        "callers:\n  groups: [platform]\nrules:\n  - repository: {host}/team-a/**\n    callers:\n      serviceAccounts: [team-a:ci]\n    unsigned: allow\n  - repository: {host}/**\n    unsigned: allow\n"
    );
    replace_file(&flags.trust_policy.clone().context("policy path")?, &policy)?;
    let other = format!("{host}/other/lavd:v1");
    let team = format!("{host}/team-a/rusty:v1");
    let bob = ("bob", &["editors"][..]);
    let ci = ("system:serviceaccount:team-a:ci", &["editors"][..]);
    let alice = ("alice", &["editors", "platform"][..]);
    // Wait until the new policy is in force: bob's dry run refused for who he is.
    wait_for("the policy with callers in force", || async {
        let yaml = scheduler_yaml("callers-probe", &other);
        let out = tokio::task::block_in_place(|| {
            fx.kubectl_apply_with(&yaml, &["--dry-run=server", "--as=bob", "--as-group=editors"])
        })?;
        // Refused for who asks, not for an image the old policy does not allow.
        Ok(String::from_utf8_lossy(&out.stderr).contains("may not create or change").then_some(()))
    })
    .await?;

    let (ok, printed) = apply_as(&fx, &scheduler_yaml("callers-bob", &other), bob.0, bob.1)?;
    assert!(!ok, "bob is in no list: {printed}");
    assert!(printed.contains("user \"bob\" (groups: editors"), "{printed}");
    assert!(
        printed.contains(&format!("may not create or change Schedulers that run images of {host}/other/lavd: the trust policy allows for every image: groups platform (line 2)")),
        "{printed}"
    );
    assert!(printed.contains("added to `callers`"), "{printed}");

    let (ok, printed) = apply_as(&fx, &scheduler_yaml("callers-ci", &team), ci.0, ci.1)?;
    assert!(ok, "team A's CI deploys team A's repository: {printed}");
    let (ok, printed) = apply_as(&fx, &scheduler_yaml("callers-ci-other", &other), ci.0, ci.1)?;
    assert!(!ok, "but not another: {printed}");
    assert!(printed.contains("service account team-a:ci (groups: editors"), "{printed}");

    // A change is judged as a creation is: bob may not change team A's Scheduler's spec, nor
    // pause its rollout; a label or an annotation alone is RBAC's business. Counted from here,
    // so no dry-run probe makes up the refusals.
    let refused_before = caller_refusals(&fx).await?;
    let patch_as = |(user, groups): (&str, &[&str]), body: &str| -> Result<(bool, String)> {
        let mut args = vec![format!("--as={user}")];
        args.extend(groups.iter().map(|g| format!("--as-group={g}")));
        args.extend(["patch", "scheduler", "callers-ci", "--type=merge", "-p", body].map(str::to_owned));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = tokio::task::block_in_place(|| fx.cluster.kubectl(&args))?;
        Ok((
            out.status.success(),
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
        ))
    };
    for change in [r#"{"spec":{"args":["--slice-us","1000"]}}"#, r#"{"spec":{"rollout":{"paused":true}}}"#] {
        let (ok, printed) = patch_as(bob, change)?;
        assert!(!ok && printed.contains("may not create or change"), "bob changed {change}: {printed}");
    }
    let (ok, printed) = patch_as(bob, r#"{"metadata":{"labels":{"team":"a"},"annotations":{"note":"bob was here"}}}"#)?;
    assert!(ok, "labels and annotations alone are RBAC's business: {printed}");
    assert_eq!(caller_refusals(&fx).await? - refused_before, 2, "each refused change counted");

    let (ok, printed) = apply_as(&fx, &scheduler_yaml("callers-alice", &other), alice.0, alice.1)?;
    assert!(ok, "the platform group deploys anything allowed: {printed}");
    // The controller's own status writes go through: team A's Scheduler runs its image; Alice's
    // has its status too, though it may own no node (created in a later second than team A's, it
    // loses the node to the older one, and without a DaemonSet no image is resolved).
    fx.wait_scheduler("callers-ci", "its image resolved in its status", |s| {
        s.status.as_ref().is_some_and(|st| st.resolved_image.is_some())
    })
    .await?;
    fx.wait_scheduler("callers-alice", "its status written", |s| {
        s.status.as_ref().is_some_and(|st| st.observed_generation == s.metadata.generation)
    })
    .await?;
    // Bob may not deploy, but he may stop a Scheduler.
    let out = fx.cluster.kubectl(&["--as=bob", "--as-group=editors", "delete", "scheduler", "callers-alice"])?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(caller_refusals(&fx).await? >= 4, "the refused creations counted too");
    drop(dir);
    Ok(())
}

/// How many changes the webhook refused for who asked (its metric).
async fn caller_refusals(fx: &Fixture) -> Result<u64> {
    let metrics = fx.scrape_metrics().await?;
    let refusals = r#"sked_image_verifications_total{caller="webhook",outcome="caller_not_allowed"}"#;
    Ok(metrics.lines().find_map(|l| l.strip_prefix(refusals)).and_then(|n| n.trim().parse::<u64>().ok()).unwrap_or(0))
}
