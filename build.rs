//! Code generation for the gRPC APIs, with protox (pure Rust: no system `protoc` needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // --- daemon API (proto/envbridge.proto) ---
    {
        println!("cargo:rerun-if-changed=proto/envbridge.proto");
        let fds = protox::compile(["proto/envbridge.proto"], ["proto"])?;
        let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
        // Served by gRPC reflection.
        let mut compiler = protox::Compiler::new(["proto"])?;
        compiler
            .include_imports(true)
            .open_file("envbridge.proto")?;
        std::fs::write(
            out.join("envbridge_descriptor.bin"),
            compiler.encode_file_descriptor_set(),
        )?;
        tonic_prost_build::configure().compile_fds(fds)?;
    }
    Ok(())
}
