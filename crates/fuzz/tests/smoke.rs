//! The fuzz targets on stable, bounded, in the test command: every seed,
//! then `RETCD_FUZZ_ITERS` (default 3000) mutations of the seeds and
//! random buffers per target, from a fixed RNG seed (`RETCD_FUZZ_SEED`
//! picks another). A panic fails the test and prints the input (hex) to
//! reproduce it. Coverage-guided runs: cargo-fuzz, see the crate docs.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn iters() -> usize {
    std::env::var("RETCD_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000)
}

fn rng_seed() -> u64 {
    std::env::var("RETCD_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed)
}

/// One structural mutation of `b` (libFuzzer's usual kinds).
fn mutate(rng: &mut StdRng, b: &mut Vec<u8>) {
    const EDGES: [u64; 8] = [0, 1, 0x7f, 0x80, 0xff, 0x7fff_ffff, 0xffff_ffff, u64::MAX];
    match rng.random_range(0..8) {
        0 if !b.is_empty() => {
            let i = rng.random_range(0..b.len());
            b[i] ^= 1 << rng.random_range(0..8);
        }
        1 if !b.is_empty() => {
            let i = rng.random_range(0..b.len());
            b[i] = rng.random();
        }
        2 if !b.is_empty() => {
            let n = rng.random_range(0..=b.len());
            b.truncate(n);
        }
        3 => {
            let i = rng.random_range(0..=b.len());
            let n = rng.random_range(1..64);
            let ins: Vec<u8> = (0..n).map(|_| rng.random()).collect();
            b.splice(i..i, ins);
        }
        4 if b.len() >= 8 => {
            // a length, an offset or a count at a random place
            let i = rng.random_range(0..=b.len() - 8);
            let v = EDGES[rng.random_range(0..EDGES.len())];
            let bytes = if rng.random() {
                v.to_le_bytes()
            } else {
                v.to_be_bytes()
            };
            let w = [1, 2, 4, 8][rng.random_range(0..4)];
            b[i..i + w].copy_from_slice(&bytes[..w]);
        }
        5 if b.len() >= 2 => {
            // a chunk repeated elsewhere
            let a = rng.random_range(0..b.len());
            let n = rng.random_range(1..=(b.len() - a).min(256));
            let chunk = b[a..a + n].to_vec();
            let at = rng.random_range(0..=b.len());
            b.splice(at..at, chunk);
        }
        6 if !b.is_empty() => {
            let a = rng.random_range(0..b.len());
            let n = rng.random_range(1..=(b.len() - a).min(64));
            b.drain(a..a + n);
        }
        _ => {
            let i = rng.random_range(0..=b.len());
            b.insert(i, EDGES[rng.random_range(0..EDGES.len())] as u8);
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn run(target: &str, f: fn(&[u8])) {
    let seeds = retcd_fuzz::seeds(target);
    assert!(!seeds.is_empty());
    let mut rng = StdRng::seed_from_u64(rng_seed() ^ target.len() as u64);
    let check = |input: &[u8]| {
        let res = std::panic::catch_unwind(|| f(input));
        assert!(
            res.is_ok(),
            "{target} panicked on an input of {} bytes: {}",
            input.len(),
            hex(&input[..input.len().min(4096)])
        );
    };
    for s in &seeds {
        check(s);
    }
    let started = std::time::Instant::now();
    let n = iters();
    for i in 0..n {
        let mut b = if i % 10 == 9 {
            let len = rng.random_range(0..512);
            (0..len).map(|_| rng.random()).collect()
        } else {
            seeds[rng.random_range(0..seeds.len())].clone()
        };
        for _ in 0..rng.random_range(1..=4) {
            mutate(&mut rng, &mut b);
        }
        check(&b);
    }
    eprintln!(
        "fuzz {target}: {} seeds + {n} mutated inputs in {:?}",
        seeds.len(),
        started.elapsed()
    );
}

#[test]
fn fuzz_targets_survive_mutated_seeds() {
    for (name, f) in retcd_fuzz::TARGETS {
        run(name, *f);
    }
}

/// The seeds are valid inputs: each decodes (not only fails early), so
/// the mutations start from the interesting paths.
#[test]
fn seeds_are_valid() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("wal");
    std::fs::create_dir_all(&dir).unwrap();
    let seg = &retcd_fuzz::seeds("wal_segment")[0];
    std::fs::write(dir.join(retcd_fuzz::FIRST_SEGMENT), seg).unwrap();
    let (_, contents) = retcd_storage::wal::Wal::open(&dir).expect("the WAL seed opens");
    // entries after the snapshot record at 3, and the last hard state
    assert_eq!(contents.entries.len(), 2, "{contents:?}");
    assert_eq!(contents.snapshot.as_ref().map(|s| s.index), Some(3));
    assert_eq!(contents.hard_state.as_deref(), Some(&b"hard state 2"[..]));
    let db = tmp.path().join("db");
    std::fs::write(&db, &retcd_fuzz::seeds("bolt_backend")[0]).unwrap();
    let r = retcd_etcdfmt::BoltReader::open(&db).expect("the bbolt seed opens");
    assert!(r.buckets().unwrap().len() >= 5);
    let h2 = &retcd_fuzz::seeds("h2_authority")[0];
    let mut stream = retcd_server::api::h2_authority::PREFACE.to_vec();
    stream.extend_from_slice(&h2[1..]);
    let out = retcd_server::api::h2_authority::repair_stream(&[&stream]);
    assert_ne!(out, stream, "the HEADERS seed is repaired");
}

/// The new targets' seeds decode too: a raft message out of both batches,
/// every gateway body, both tokens, and the MVCC dump restores.
#[test]
fn seeds_of_the_decoders_are_valid() {
    use prost::Message as _;
    use protobuf::Message as _;
    for b in retcd_fuzz::seeds("peer_batch") {
        let batch = retcd_api::retcdpb::RaftBatch::decode(&b[..]).expect("a batch");
        let bytes = batch.msgs.first().cloned().unwrap_or(batch.fragment);
        let m = raft::eraftpb::Message::parse_from_bytes(&bytes).expect("a raft message");
        assert_eq!(m.entries.len(), 1);
    }
    for b in retcd_fuzz::seeds("gateway_json") {
        let first = serde_json::Deserializer::from_slice(&b[1..])
            .into_iter::<serde_json::Value>()
            .next();
        assert!(
            matches!(first, Some(Ok(_))),
            "{:?}",
            String::from_utf8_lossy(&b)
        );
    }
    let put: retcd_api::etcdserverpb::PutRequest =
        serde_json::from_slice(&retcd_fuzz::seeds("gateway_json")[1][1..]).expect("a put body");
    assert_eq!((put.key.as_slice(), put.lease), (&b"foo"[..], 7));
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("secret");
    std::fs::write(&key, retcd_fuzz::JWT_SECRET).unwrap();
    let key = key.display().to_string();
    let opts =
        std::collections::HashMap::from([("sign-method", "HS256"), ("priv-key", key.as_str())]);
    let jwt = retcd_server::auth::jwt::Jwt::from_opts(&opts).unwrap();
    let token = String::from_utf8(retcd_fuzz::seeds("auth_token")[0].clone()).unwrap();
    assert_eq!(jwt.verify(&token).map(|a| a.username), Some("root".into()));
    let body = &retcd_fuzz::seeds("mvcc_snapshot")[0];
    let mut dump = retcd_mvcc::kvstore::DUMP_MAGIC.to_vec();
    dump.extend_from_slice(body);
    dump.extend_from_slice(&retcd_mvcc::hash::Crc32c::checksum(&dump).to_be_bytes());
    let records = retcd_mvcc::kvstore::parse_dump(&dump).expect("the dump seed parses");
    assert!(records.len() >= 4, "{}", records.len());
}

/// Found by `mvcc_snapshot`: a snapshot row (CRC right) whose revision key
/// has a negative main revision sorts after the others; the index rebuild
/// took it for a put older than the key's last one and panicked. It is now
/// refused as a damaged snapshot.
#[test]
fn regression_snapshot_row_out_of_revision_order() {
    let hex = "010000001100000000000000025f00000000000000000000000c0a01611002180220012a0131010000001100000000000000035f00000000000000000000000c0a01621003180320012a01320100000011ff000000000000045f00000000000000000000000c0a01611002180420022a0133010000001200000000000000055f000000000000000074000000030a016200";
    let body: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    retcd_fuzz::mvcc_snapshot(&body);
    let mut dump = retcd_mvcc::kvstore::DUMP_MAGIC.to_vec();
    dump.extend_from_slice(&body);
    dump.extend_from_slice(&retcd_mvcc::hash::Crc32c::checksum(&dump).to_be_bytes());
    let dir = tempfile::tempdir().unwrap();
    let backend = retcd_storage::backend::Backend::open(&dir.path().join("db")).unwrap();
    let store = retcd_mvcc::KvStore::open(std::sync::Arc::new(backend)).unwrap();
    let e = store.restore_from(&dump).expect_err("a damaged snapshot");
    assert!(e.to_string().contains("invalid revision key"), "{e}");
}
