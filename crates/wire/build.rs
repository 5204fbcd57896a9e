//! Compiles proto/reprise/v1/replay.proto (with protox: no protoc needed) into the
//! gRPC client and server code of `reprise_wire::pb`.
fn main() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    println!("cargo:rerun-if-changed={}", root.join("reprise/v1/replay.proto").display());
    let files = protox::compile(["reprise/v1/replay.proto"], [&root]).expect("proto/reprise/v1/replay.proto must compile");
    tonic_prost_build::configure()
        // Step data as `bytes::Bytes`: decoded as slices of the received buffer, not copied.
        .bytes(".")
        // Written by hand (`reprise_wire::sample`): rows are gathered into the message as it is encoded.
        .extern_path(".reprise.v1.SampleResponse", "crate::sample::SampleResponse")
        // prost's codec, reserving each message's length first (`reprise_wire::codec`).
        .codec_path("crate::codec::ReplayCodec")
        .build_client(true)
        .build_server(true)
        .compile_fds(files)
        .expect("generating the gRPC code");
}
