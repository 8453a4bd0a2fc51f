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
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptors = out.join("descriptors.bin");
    tonic_prost_build::configure()
        .file_descriptor_set_path(&descriptors)
        .build_client(true)
        .build_server(true)
        .generate_default_stubs(true)
        // prost's codec, but each message's buffer is reserved whole before
        // encoding: a 200 MiB RangeResponse is not grown by doubling
        .codec_path("crate::codec::ExactCodec")
        // keys and values as `Bytes`: a watch event fanned out to many
        // watchers shares its key and value instead of copying them
        .bytes(".mvccpb.KeyValue.key")
        .bytes(".mvccpb.KeyValue.value")
        .compile_protos(&files, &["proto"])?;
    // serde for the JSON gateway: the protobuf JSON mapping with the
    // .proto field names, as etcd's grpc-gateway (`OrigName: true`).
    pbjson_build::Builder::new()
        .register_descriptors(&std::fs::read(&descriptors)?)?
        .preserve_proto_field_names()
        // as grpc-gateway: unknown fields in a request are ignored
        .ignore_unknown_fields()
        .build(&[
            ".etcdserverpb",
            ".mvccpb",
            ".authpb",
            ".v3lockpb",
            ".v3electionpb",
        ])?;
    // Methods a later issue fills in answer UNIMPLEMENTED; say so clearly.
    for entry in std::fs::read_dir(&out)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path)?;
            let text = text.replace(
                "\"Not yet implemented\"",
                "\"retcd: this method is not implemented yet\"",
            );
            let text = open_enums(&text);
            std::fs::write(&path, text)?;
        }
    }
    Ok(())
}

/// Enum fields in the JSON gateway as etcd's (`jsonpb`) reads and writes
/// them: a number the enum does not know is kept (`"sort_order": 7`
/// reaches the server, which answers it as etcd does; a role holding a
/// permission of type 7 is shown as `"permType": 7`) instead of refused.
/// pbjson-build reads and writes enum fields through the enum type, which
/// has no room for such a number; this rewrites those places to pbjson's
/// `OpenEnum` / `OpenEnumValue` (retcd's patch, third_party/pbjson). The
/// build fails if pbjson-build's code no longer has the shapes rewritten.
fn open_enums(text: &str) -> String {
    // reading: `map_.next_value::<E>()? as i32` (a field) and
    // `map_.next_value::<Vec<E>>()?.into_iter().map(|x| x as i32)` (repeated)
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        const READ: &str = "map_.next_value::<";
        let Some(at) = line.find(READ) else {
            out.push_str(line);
            continue;
        };
        let (head, ty) = line.split_at(at + READ.len());
        if let Some(ty) = ty.strip_suffix(">()? as i32);\n") {
            out.push_str(&format!("{head}pbjson::private::OpenEnum<{ty}>>()?.0);\n"));
        } else if let Some(ty) = ty
            .strip_suffix(">>()?.into_iter().map(|x| x as i32).collect());\n")
            .and_then(|t| t.strip_prefix("Vec<"))
        {
            out.push_str(&format!(
                "{head}Vec<pbjson::private::OpenEnum<{ty}>>>()?.into_iter().map(|x| x.0).collect());\n"
            ));
        } else {
            out.push_str(line);
        }
    }
    // writing: `E::try_from(x).map_err(|_| ..("Invalid variant {}", x)))`,
    // then `?;` (a field) or `}).collect::<Result<Vec<_>, _>>()?;` (repeated)
    const WRITE: &str = ".map_err(|_| serde::ser::Error::custom(format!(\"Invalid variant {}\", ";
    const COLLECT: &str = "}).collect::<std::result::Result<Vec<_>, _>>()?;";
    let mut text = out;
    while let Some(at) = text.find(WRITE) {
        let x_end = at
            + WRITE.len()
            + text[at + WRITE.len()..]
                .find(")))")
                .expect("pbjson-build's shape");
        let x = text[at + WRITE.len()..x_end].to_string();
        let after = x_end + ")))".len();
        if text[after..].starts_with("?;") {
            let with = format!(
                ".map_err(|_| {x});\n            let v = pbjson::private::OpenEnumValue(v);"
            );
            text.replace_range(at..after + 2, &with);
        } else {
            let collect = after + text[after..].find(COLLECT).expect("pbjson-build's shape");
            text.replace_range(
                collect..collect + COLLECT.len(),
                "}).map(pbjson::private::OpenEnumValue).collect::<Vec<_>>();",
            );
            text.replace_range(at..after, &format!(".map_err(|_| {x})"));
        }
    }
    assert!(
        !text.contains("()? as i32") && !text.contains("Invalid variant"),
        "an enum field pbjson-build reads in a shape open_enums does not know"
    );
    text
}
