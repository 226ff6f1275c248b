//! Compiles agent.proto with protox (pure Rust, no protoc needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "sked/agent/v1/agent.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["."])?;
    // Small stream buffers: see src/codec.rs.
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .codec_path("crate::codec::SmallCodec")
        // The service needs tonic: only with the `grpc` feature.
        .client_mod_attribute(".", r#"#[cfg(feature = "grpc")]"#)
        .server_mod_attribute(".", r#"#[cfg(feature = "grpc")]"#)
        .compile_fds(descriptors)?;
    Ok(())
}
