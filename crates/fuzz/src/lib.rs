//! Fuzz targets for the decoders that read bytes retcd did not write
//! itself in this process: its own WAL segments (after a crash, a bad
//! disk, a hostile copy), etcd's WAL segments and bbolt backend files
//! (`retcdutl migrate`, `snapshot restore` of an etcd snapshot), and the
//! HTTP/2 `:authority` repair every client connection goes through.
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

/// The targets by name, for the drivers.
pub const TARGETS: &[(&str, fn(&[u8]))] = &[
    ("wal_segment", wal_segment),
    ("etcd_wal_segment", etcd_wal_segment),
    ("bolt_backend", bolt_backend),
    ("h2_authority", h2_authority),
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
        other => panic!("no target {other}"),
    }
}
