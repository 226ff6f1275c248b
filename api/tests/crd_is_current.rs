//! The CRD YAML committed in `crds/` must be what the Rust types generate.

#[test]
fn committed_crds_match_the_rust_types() {
    let generated = sked_api::crd::crd_yaml().expect("the CRD renders");
    for path in [
        concat!(env!("CARGO_MANIFEST_DIR"), "/../crds/sked.schedkit.io_schedulers.yaml"),
        concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/sked/crds/sked.schedkit.io_schedulers.yaml"),
    ] {
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(committed == generated, "{path} is stale: run `make crds` and commit the result");
    }
}
