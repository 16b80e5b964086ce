//! Code generation for the gRPC APIs, with protox (pure Rust): a bare `cargo build` needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/occ.proto");
    let fds = protox::compile(["proto/occ.proto"], ["proto"])?;
    // The messages also travel as JSON (FairMQ's OCClite plugin): serde with the proto field
    // names (camelCase as declared), every field optional on input (Go's `omitempty` peers),
    // enums as numbers on output and numbers or names on input.
    let lenient_enum =
        |f: &str| format!("#[serde(deserialize_with = \"crate::control::json::{f}\")]");
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .message_attribute(
            ".occ_pb",
            "#[derive(serde::Serialize, serde::Deserialize)] #[serde(rename_all = \"camelCase\", default)]",
        )
        .field_attribute("occ_pb.TransitionReply.trigger", lenient_enum("trigger"))
        .field_attribute("occ_pb.StateStreamReply.type", lenient_enum("state_type"))
        .field_attribute("occ_pb.DeviceEvent.type", lenient_enum("device_event_type"))
        .compile_fds(fds)?;

    // --- daemon API (proto/envbridge.proto), with its descriptor set for gRPC reflection ---
    {
        println!("cargo:rerun-if-changed=proto/envbridge.proto");
        let fds = protox::compile(["proto/envbridge.proto"], ["proto"])?;
        let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
        let mut compiler = protox::Compiler::new(["proto"])?;
        compiler
            .include_imports(true)
            .open_file("envbridge.proto")?;
        std::fs::write(
            out.join("envbridge_descriptor.bin"),
            compiler.encode_file_descriptor_set(),
        )?;
        // A failure is also what the dashboard's JSON shows: one shape for both.
        tonic_prost_build::configure()
            .message_attribute(".envbridge.v1.Failure", "#[derive(serde::Serialize)]")
            .compile_fds(fds)?;
    }

    // --- the anchor's o2control API (proto/o2control.proto and its two imports) and its
    // configuration service (proto/apricot.proto): server and client, with its descriptor set for gRPC reflection on the o2control listener ---
    {
        for f in [
            "o2control.proto",
            "o2control_common.proto",
            "o2control_events.proto",
            "apricot.proto",
        ] {
            println!("cargo:rerun-if-changed=proto/{f}");
        }
        let fds = protox::compile(["proto/o2control.proto", "proto/apricot.proto"], ["proto"])?;
        let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
        let mut compiler = protox::Compiler::new(["proto"])?;
        compiler
            .include_imports(true)
            .open_files(["o2control.proto", "apricot.proto"])?;
        std::fs::write(
            out.join("o2control_descriptor.bin"),
            compiler.encode_file_descriptor_set(),
        )?;
        tonic_prost_build::configure().compile_fds(fds)?;
    }
    Ok(())
}
