//! Fuzz targets for the decoders that read bytes retcd did not write
//! itself in this process: its own WAL segments (after a crash, a bad
//! disk, a hostile copy), etcd's WAL segments and bbolt backend files
//! (`retcdutl migrate`, `snapshot restore` of an etcd snapshot), the
//! HTTP/2 `:authority` repair every client connection goes through, the
//! raft batches of the peer stream, the JSON gateway's request bodies,
//! client tokens (simple and JWT) and the MVCC snapshot a leader sends.
//!
//! A target must return (an error is fine) and never panic, hang or
//! allocate without bound. Each takes the raw bytes; the file-based
//! decoders get them as a file in a per-thread temp dir.
//!
//! Two drivers share these functions: `tests/smoke.rs` (stable, in the
//! test command: the seeds and a fixed number of mutations of them, with a
//! deterministic RNG) and `fuzz/` (cargo-fuzz / libFuzzer, coverage-guided,
//! nightly: `cargo +nightly fuzz run <target>` from `crates/fuzz`; its
//! corpus starts from [`seeds`]). docs/robustness.md has the figures.

use std::path::Path;

thread_local! {
    static DIR: tempfile::TempDir = tempfile::tempdir().expect("fuzz temp dir");
}

fn in_dir<R>(f: impl FnOnce(&Path) -> R) -> R {
    DIR.with(|d| f(d.path()))
}

/// The first segment's name, in retcd's and in etcd's WAL.
pub const FIRST_SEGMENT: &str = "0000000000000000-0000000000000000.wal";

/// A fresh directory `name` under the thread's temp dir holding one file.
fn one_file_dir(root: &Path, name: &str, file: &str, data: &[u8]) -> std::path::PathBuf {
    let dir = root.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("fuzz dir");
    std::fs::write(dir.join(file), data).expect("fuzz file");
    dir
}

/// retcd's WAL: open (scan, CRC chain, torn-tail repair) a directory whose
/// only segment holds `data`.
pub fn wal_segment(data: &[u8]) {
    in_dir(|root| {
        let dir = one_file_dir(root, "wal", FIRST_SEGMENT, data);
        let _ = retcd_storage::wal::Wal::open(&dir);
    })
}

/// etcd's WAL as `retcdutl migrate` reads it.
pub fn etcd_wal_segment(data: &[u8]) {
    in_dir(|root| {
        let dir = one_file_dir(root, "etcd-wal", FIRST_SEGMENT, data);
        let _ = retcd_etcdfmt::wal::read_dir(&dir, &mut |_, _| {});
    })
}

/// An etcd bbolt backend file (an etcd snapshot): its status and every
/// row as `snapshot restore` converts them.
pub fn bolt_backend(data: &[u8]) {
    in_dir(|root| {
        let dir = one_file_dir(root, "bolt", "db", data);
        let Ok(r) = retcd_etcdfmt::bolt::BoltReader::open(&dir.join("db")) else {
            return;
        };
        let _ = retcd_etcdfmt::status(&r);
        let _ = retcd_etcdfmt::read_backend(&r, &mut |_, _, _| Ok(()));
    })
}

/// The `:authority` repair on a client byte stream: `data[0]` picks where
/// the stream is split into two reads (partial frames), the rest is the
/// stream after the HTTP/2 preface.
pub fn h2_authority(data: &[u8]) {
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let mut stream = retcd_server::api::h2_authority::PREFACE.to_vec();
    stream.extend_from_slice(rest);
    let at = (cut as usize * stream.len() / 256).min(stream.len());
    let out = retcd_server::api::h2_authority::repair_stream(&[&stream[..at], &stream[at..]]);
    // A repair only rewrites HEADERS frames; it never loses the preface.
    assert!(out.starts_with(retcd_server::api::h2_authority::PREFACE));
}

/// What a peer stream carries: a `RaftBatch` (prost) whose messages and
/// fragments are reassembled and parsed as raft messages (rust-protobuf),
/// as the peer service does before it steps the node.
pub fn peer_batch(data: &[u8]) {
    use prost::Message as _;
    use protobuf::Message as _;
    let Ok(batch) = retcd_api::retcdpb::RaftBatch::decode(data) else {
        return;
    };
    let mut msgs = batch.msgs;
    let mut r = retcd_server::raft::transport::Reassembly::default();
    // the fragment twice: a whole message split in two, or a second one
    for last in [false, batch.last_fragment] {
        if let Ok(Some(whole)) = r.push(&batch.fragment, last) {
            msgs.push(whole);
        }
    }
    for m in msgs {
        let _ = raft::eraftpb::Message::parse_from_bytes(&m);
    }
}

/// A JSON gateway body: `data[0]` picks the request type, the rest is the
/// body, decoded as one request (unary routes) and as the stream of
/// requests a streaming route reads.
pub fn gateway_json(data: &[u8]) {
    use retcd_api::etcdserverpb as pb;
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    fn one<T: serde::de::DeserializeOwned>(body: &[u8]) {
        let _ = serde_json::from_slice::<T>(body);
        for r in serde_json::Deserializer::from_slice(body).into_iter::<T>() {
            if r.is_err() {
                break;
            }
        }
    }
    match kind % 8 {
        0 => one::<pb::RangeRequest>(body),
        1 => one::<pb::PutRequest>(body),
        2 => one::<pb::TxnRequest>(body),
        3 => one::<pb::WatchRequest>(body),
        4 => one::<pb::LeaseKeepAliveRequest>(body),
        5 => one::<pb::AuthUserAddRequest>(body),
        6 => one::<pb::AuthRoleGrantPermissionRequest>(body),
        _ => one::<pb::MemberAddRequest>(body),
    }
}

/// The HS256 secret of [`auth_token`]'s JWT provider.
pub const JWT_SECRET: &[u8] = b"retcd fuzz secret";
/// The one token [`auth_token`]'s simple provider has registered.
pub const SIMPLE_TOKEN: &str = "fuzzsimpletoken.7";

thread_local! {
    static TOKENS: (retcd_server::auth::simple_token::SimpleTokens, retcd_server::auth::jwt::Jwt) = {
        let simple = retcd_server::auth::simple_token::SimpleTokens::new(std::time::Duration::from_secs(300));
        simple.register(SIMPLE_TOKEN.into(), "root");
        let dir = tempfile::tempdir().expect("jwt key dir");
        let key = dir.path().join("secret");
        std::fs::write(&key, JWT_SECRET).expect("jwt secret");
        let key = key.display().to_string();
        let opts = std::collections::HashMap::from([("sign-method", "HS256"), ("priv-key", key.as_str())]);
        let jwt = retcd_server::auth::jwt::Jwt::from_opts(&opts).expect("jwt provider");
        (simple, jwt)
    };
}

/// A token from a client's `token`/`Authorization` metadata, checked by
/// both providers: simple (a registered token) and JWT (HS256; the
/// signature, algorithm and expiry checks on hostile headers and claims).
pub fn auth_token(data: &[u8]) {
    let t = String::from_utf8_lossy(data);
    TOKENS.with(|(simple, jwt)| {
        let _ = simple.user(&t);
        let _ = jwt.verify(&t);
    })
}

thread_local! {
    static STORE: (tempfile::TempDir, retcd_mvcc::KvStore) = {
        let dir = tempfile::tempdir().expect("store dir");
        let backend = retcd_storage::backend::Backend::open(&dir.path().join("db")).expect("backend");
        let store = retcd_mvcc::KvStore::open(std::sync::Arc::new(backend)).expect("store");
        (dir, store)
    };
}

/// A raft snapshot from the leader (retcd's MVCC dump): the input is its
/// records (after the magic, before the CRC), given the right CRC so the
/// decoder and the restore — rows into the tables, the index rebuilt from
/// them — see every mutation, not only the checksum's refusal.
pub fn mvcc_snapshot(data: &[u8]) {
    let mut dump = retcd_mvcc::kvstore::DUMP_MAGIC.to_vec();
    dump.extend_from_slice(data);
    let crc = retcd_mvcc::hash::Crc32c::checksum(&dump);
    dump.extend_from_slice(&crc.to_be_bytes());
    if retcd_mvcc::kvstore::parse_dump(&dump).is_err() {
        return;
    }
    STORE.with(|(_, store)| {
        let _ = store.restore_from(&dump);
    })
}

/// The targets by name, for the drivers.
pub const TARGETS: &[(&str, fn(&[u8]))] = &[
    ("wal_segment", wal_segment),
    ("etcd_wal_segment", etcd_wal_segment),
    ("bolt_backend", bolt_backend),
    ("h2_authority", h2_authority),
    ("peer_batch", peer_batch),
    ("gateway_json", gateway_json),
    ("auth_token", auth_token),
    ("mvcc_snapshot", mvcc_snapshot),
];

/// Valid inputs to start from, per target: a real retcd WAL segment
/// (metadata, hard states, entries, a snapshot record), an etcd-layout
/// bbolt file as `retcdutl` writes it, a HEADERS frame with an
/// `:authority` to repair. etcd's WAL starts from retcd's (same framing,
/// other record types) and from nothing.
pub fn seeds(target: &str) -> Vec<Vec<u8>> {
    let tmp = tempfile::tempdir().expect("seed dir");
    match target {
        "wal_segment" | "etcd_wal_segment" => {
            use retcd_storage::wal::{Wal, WalEntry, WalSnapshot};
            let dir = tmp.path().join("wal");
            let mut w = Wal::create(&dir, b"seed metadata").expect("create seed WAL");
            let entries: Vec<WalEntry> = (1..=5)
                .map(|i| WalEntry {
                    index: i,
                    term: 1,
                    data: format!("entry {i}").into_bytes(),
                })
                .collect();
            w.save(Some(b"hard state 1"), &entries).expect("save");
            w.save_snapshot(&WalSnapshot {
                index: 3,
                term: 1,
                ..Default::default()
            })
            .expect("snapshot record");
            w.save(Some(b"hard state 2"), &[]).expect("save");
            drop(w);
            let mut seg = std::fs::read(dir.join(FIRST_SEGMENT)).expect("read seed segment");
            // the preallocated zeros after the last record
            while seg.last() == Some(&0) {
                seg.pop();
            }
            seg.resize(seg.len().div_ceil(8) * 8, 0);
            vec![seg, Vec::new()]
        }
        "bolt_backend" => {
            let path = tmp.path().join("db");
            retcd_etcdfmt::BackendWriter::create(&path, "3.5.0")
                .and_then(|w| w.finish())
                .expect("seed bbolt file");
            vec![std::fs::read(&path).expect("read seed bbolt file")]
        }
        "h2_authority" => {
            // the split byte, SETTINGS (empty), then HEADERS (END_HEADERS)
            // with the literal `:authority` etcdctl 3.4 sends
            let mut s = vec![0x80, 0, 0, 0, 0x04, 0, 0, 0, 0, 0];
            let block: Vec<u8> = [
                &[0x82u8, 0x86, 0x41][..],
                &[21],
                b"http://127.0.0.1:2379",
                &[0x84],
            ]
            .concat();
            s.extend_from_slice(&(block.len() as u32).to_be_bytes()[1..]);
            s.extend_from_slice(&[0x01, 0x04, 0, 0, 0, 1]);
            s.extend_from_slice(&block);
            vec![s]
        }
        "peer_batch" => {
            use prost::Message as _;
            use protobuf::Message as _;
            let mut m = raft::eraftpb::Message::default();
            m.set_msg_type(raft::eraftpb::MessageType::MsgAppend);
            m.to = 2;
            m.from = 1;
            m.term = 3;
            m.index = 7;
            m.log_term = 3;
            m.commit = 7;
            let e = raft::eraftpb::Entry {
                index: 8,
                term: 3,
                data: b"entry".to_vec().into(),
                ..Default::default()
            };
            m.entries = vec![e].into();
            let bytes = m.write_to_bytes().expect("encode seed message");
            let (a, b) = bytes.split_at(bytes.len() / 2);
            let whole = retcd_api::retcdpb::RaftBatch {
                from: 1,
                msgs: vec![bytes.clone()],
                ..Default::default()
            };
            let fragment = retcd_api::retcdpb::RaftBatch {
                from: 1,
                fragment: [a, b].concat(),
                last_fragment: true,
                ..Default::default()
            };
            vec![whole.encode_to_vec(), fragment.encode_to_vec()]
        }
        "gateway_json" => [
            (0u8, r#"{"key":"Zm9v","range_end":"Zm9w","limit":"10","revision":"3","sort_order":"DESCEND"}"#),
            (1, r#"{"key":"Zm9v","value":"YmFy","lease":"7","prev_kv":true}"#),
            (2, r#"{"compare":[{"result":"EQUAL","target":"VALUE","key":"Zm9v","value":"YmFy"}],"success":[{"request_put":{"key":"Zm9v","value":"Yg=="}}],"failure":[{"request_range":{"key":"Zm9v"}}]}"#),
            (3, r#"{"create_request":{"key":"Zm9v","start_revision":"2","filters":["NOPUT"]}}{"cancel_request":{"watch_id":"0"}}"#),
            (4, r#"{"ID":"7"}{"ID":"8"}"#),
            (5, r#"{"name":"u","password":"p","options":{"no_password":false}}"#),
            (6, r#"{"name":"r","perm":{"permType":"READWRITE","key":"YQ==","range_end":"Yg=="}}"#),
            (7, r#"{"peerURLs":["http://127.0.0.1:2380"],"isLearner":true}"#),
        ]
        .iter()
        .map(|(k, b)| [&[*k][..], b.as_bytes()].concat())
        .collect(),
        "auth_token" => {
            let claims = serde_json::json!({"username": "root", "revision": 1, "exp": 4102444800i64});
            let jwt = jsonwebtoken::encode(
                &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
                &claims,
                &jsonwebtoken::EncodingKey::from_secret(JWT_SECRET),
            )
            .expect("seed jwt");
            vec![jwt.into_bytes(), SIMPLE_TOKEN.as_bytes().to_vec()]
        }
        "mvcc_snapshot" => {
            let dir = tmp.path().join("store");
            std::fs::create_dir_all(&dir).expect("seed store dir");
            let backend = retcd_storage::backend::Backend::open(&dir.join("db")).expect("seed backend");
            let store = retcd_mvcc::KvStore::open(std::sync::Arc::new(backend)).expect("seed store");
            use retcd_api::etcdserverpb::{DeleteRangeRequest, PutRequest};
            let mut b = store.begin_batch().expect("seed batch");
            for (k, v) in [("a", "1"), ("b", "2"), ("a", "3")] {
                let put = PutRequest {
                    key: k.into(),
                    value: v.into(),
                    ..Default::default()
                };
                b.put(&put, &retcd_mvcc::NoLeases).expect("seed put");
            }
            let del = DeleteRangeRequest {
                key: b"b".to_vec(),
                ..Default::default()
            };
            b.delete_range(&del).expect("seed delete");
            b.commit(true).expect("seed commit");
            let dump = store.dump().expect("seed dump");
            let magic = retcd_mvcc::kvstore::DUMP_MAGIC.len();
            vec![dump[magic..dump.len() - 4].to_vec()]
        }
        other => panic!("no target {other}"),
    }
}
