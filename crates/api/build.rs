//! Generates the etcd v3 wire types. protoc comes from `protoc-bin-vendored`,
//! so no system package is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY of intent: build scripts are single-threaded; this only affects protoc lookup.
    std::env::set_var("PROTOC", protoc);
    let files = [
        "proto/mvccpb/kv.proto",
        "proto/authpb/auth.proto",
        "proto/etcdserverpb/rpc.proto",
        "proto/v3lockpb/v3lock.proto",
        "proto/v3electionpb/v3election.proto",
        "proto/retcdpb/internal.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .generate_default_stubs(true)
        // keys and values as `Bytes`: a watch event fanned out to many
        // watchers shares its key and value instead of copying them
        .bytes(".mvccpb.KeyValue.key")
        .bytes(".mvccpb.KeyValue.value")
        .compile_protos(&files, &["proto"])?;
    // Methods a later issue fills in answer UNIMPLEMENTED; say so clearly.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    for entry in std::fs::read_dir(&out)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path)?;
            let text = text.replace(
                "\"Not yet implemented\"",
                "\"retcd: this method is not implemented yet\"",
            );
            std::fs::write(&path, text)?;
        }
    }
    Ok(())
}
