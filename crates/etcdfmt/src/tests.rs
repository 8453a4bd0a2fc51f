//! The writer and the reader against each other; damaged files refused
//! without a panic.

use super::*;
use crate::backend::table;
use prost::Message;
use retcd_api::mvccpb::KeyValue;

fn rev_key(main: i64, sub: i64) -> Vec<u8> {
    let mut k = main.to_be_bytes().to_vec();
    k.push(b'_');
    k.extend_from_slice(&sub.to_be_bytes());
    k
}

/// A backend with `n` revisions, a lease, a user, a role, auth on, an alarm
/// and a member, written by [`BackendWriter`].
fn sample(dir: &Path, n: i64) -> (std::path::PathBuf, Vec<(u8, Vec<u8>, Vec<u8>)>) {
    let path = dir.join("db");
    let mut rows = Vec::new();
    for i in 2..n + 2 {
        let kv = KeyValue {
            key: format!("key/{i:06}").into_bytes().into(),
            create_revision: i,
            mod_revision: i,
            version: 1,
            value: vec![b'v'; (i % 300) as usize].into(),
            lease: 0,
        };
        rows.push((table::KEY, rev_key(i, 0), kv.encode_to_vec()));
    }
    rows.push((
        table::META,
        b"consistent_index".to_vec(),
        77u64.to_be_bytes().to_vec(),
    ));
    rows.push((table::META, b"finishedCompactRev".to_vec(), rev_key(3, 0)));
    rows.push((table::META, b"term".to_vec(), 4u64.to_be_bytes().to_vec()));
    let m = retcd_api::retcdpb::Member {
        id: 0x8e9e05c52164694d,
        name: "m0".into(),
        peer_urls: vec!["http://127.0.0.1:2380".into()],
        client_urls: vec!["http://127.0.0.1:2379".into()],
        is_learner: false,
    };
    rows.push((
        table::MEMBERS,
        m.id.to_be_bytes().to_vec(),
        m.encode_to_vec(),
    ));
    let lease = retcd_api::retcdpb::Lease {
        id: 7,
        ttl: 60,
        remaining_ttl: 0,
    };
    rows.push((
        table::LEASES,
        7i64.to_be_bytes().to_vec(),
        lease.encode_to_vec(),
    ));
    let alarm = retcd_api::etcdserverpb::AlarmMember {
        member_id: 5,
        alarm: 1,
    }
    .encode_to_vec();
    rows.push((table::ALARM, alarm, Vec::new()));
    rows.push((table::AUTH, b"enabled".to_vec(), vec![1]));
    let role = retcd_api::authpb::Role {
        name: b"r1".to_vec(),
        key_permission: vec![],
    };
    rows.push((table::AUTH, b"r/r1".to_vec(), role.encode_to_vec()));
    rows.push((
        table::AUTH,
        b"revision".to_vec(),
        9u64.to_be_bytes().to_vec(),
    ));
    let user = retcd_api::authpb::User {
        name: b"root".to_vec(),
        password: b"$2a$10$x".to_vec(),
        roles: vec!["root".into()],
        options: None,
    };
    rows.push((table::AUTH, b"u/root".to_vec(), user.encode_to_vec()));
    let mut w = BackendWriter::create(&path, "3.5.24").unwrap();
    for (t, k, v) in &rows {
        w.add(*t, k, v).unwrap();
    }
    w.finish().unwrap();
    (path, rows)
}

fn read_all(path: &Path) -> Result<Vec<(u8, Vec<u8>, Vec<u8>)>, FormatError> {
    let r = BoltReader::open(path)?;
    let mut out = Vec::new();
    read_backend(&r, &mut |t, k, v| {
        out.push((t, k.to_vec(), v.to_vec()));
        Ok(())
    })?;
    Ok(out)
}

#[test]
fn test_written_backend_reads_back_as_written() {
    let dir = tempfile::tempdir().unwrap();
    // Enough rows for several transactions and branch pages.
    let (path, rows) = sample(dir.path(), 60_000);
    let mut got = read_all(&path).unwrap();
    let mut want = rows.clone();
    // Members come back re-encoded from etcd's JSON: equal messages.
    got.sort();
    want.sort();
    assert_eq!(got.len(), want.len());
    assert_eq!(got, want);

    let r = BoltReader::open(&path).unwrap();
    let names: Vec<String> = r
        .buckets()
        .unwrap()
        .into_iter()
        .map(|(n, _)| String::from_utf8(n).unwrap())
        .collect();
    let mut buckets: Vec<String> = BUCKETS.iter().map(|s| s.to_string()).collect();
    buckets.sort();
    assert_eq!(names, buckets);
    let s = status(&r).unwrap();
    assert_eq!(s.revision, 60_001);
    // every row + clusterVersion
    assert_eq!(s.total_keys, rows.len() as u64 + 1);
    assert_eq!(s.total_size % r.page_size(), 0);
    assert!(s.total_size <= r.file_len());
}

#[test]
fn test_bad_rows_are_refused_by_the_converter() {
    assert!(from_etcd(b"key", b"short", b"").is_err());
    assert!(from_etcd(b"key", &rev_key(2, 0), b"\xff\xff\xff").is_err());
    assert!(from_etcd(b"meta", b"consistent_index", b"\x01").is_err());
    assert!(from_etcd(b"lease", b"1234567", b"").is_err());
    assert!(from_etcd(b"members", b"1", b"{not json").is_err());
    assert!(from_etcd(b"meta", b"confState", b"{}").unwrap().is_none());
    assert!(from_etcd(b"somethingelse", b"k", b"v").unwrap().is_none());
}

/// A small xorshift: the damage is the same on every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Flipped bytes, zeroed pages and truncations of a valid file: each is
/// read to the end or refused with an error, never a panic or a hang.
#[test]
fn test_damaged_backend_files_are_refused_without_panic() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = sample(dir.path(), 3_000);
    let good = std::fs::read(&path).unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let bad = dir.path().join("bad");
    let mut refused = 0;
    for round in 0..600 {
        let mut data = good.clone();
        match round % 4 {
            0 => {
                for _ in 0..1 + rng.next() % 8 {
                    let at = (rng.next() % data.len() as u64) as usize;
                    data[at] ^= 1 << (rng.next() % 8);
                }
            }
            1 => {
                let len = (rng.next() % data.len() as u64) as usize;
                data.truncate(len);
            }
            2 => {
                let page = (rng.next() % (data.len() as u64 / 4096)) as usize;
                data[page * 4096..(page + 1) * 4096].fill(0);
            }
            _ => {
                // page headers and element tables: the offsets that matter
                let page = (rng.next() % (data.len() as u64 / 4096)) as usize;
                let at = page * 4096 + (rng.next() % 64) as usize;
                data[at] = rng.next() as u8;
            }
        }
        std::fs::write(&bad, &data).unwrap();
        if read_all(&bad).is_err() {
            refused += 1;
        }
        if let Ok(r) = BoltReader::open(&bad) {
            let _ = status(&r);
        }
    }
    // Most damage is seen (flips inside values are not, as in bbolt).
    assert!(refused > 300, "only {refused} of 600 damaged files refused");
}

#[test]
fn test_not_a_bolt_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x");
    std::fs::write(&p, b"RETCDMVCC1 not bolt").unwrap();
    let e = BoltReader::open(&p).unwrap_err().to_string();
    assert!(e.contains("invalid database"), "{e}");
    std::fs::write(&p, vec![0u8; 16384]).unwrap();
    assert!(BoltReader::open(&p).is_err());
}

/// A WAL segment as etcd writes one: crc record, metadata, snapshot mark,
/// entries (one overwritten by a later term), hard states; a torn record at
/// the end of the last segment is dropped.
#[test]
fn test_wal_segments_read_as_etcd_writes_them() {
    fn frame(out: &mut Vec<u8>, crc: &mut u32, t: i64, data: Vec<u8>) {
        let rec_crc = if t == 4 {
            *crc
        } else {
            *crc = crc32c::crc32c_append(*crc, &data);
            *crc
        };
        let rec = wal_record(t, rec_crc, data);
        let pad = (8 - rec.len() % 8) % 8;
        let mut len = rec.len() as u64;
        if pad != 0 {
            len |= (0x80 | pad as u64) << 56;
        }
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&rec);
        out.extend(std::iter::repeat_n(0u8, pad));
    }
    fn wal_record(t: i64, crc: u32, data: Vec<u8>) -> Vec<u8> {
        #[derive(Clone, PartialEq, prost::Message)]
        struct R {
            #[prost(int64, tag = "1")]
            t: i64,
            #[prost(uint32, tag = "2")]
            crc: u32,
            #[prost(bytes = "vec", tag = "3")]
            data: Vec<u8>,
        }
        R { t, crc, data }.encode_to_vec()
    }
    let entry = |index, term, data: &[u8]| {
        wal::Entry {
            term,
            index,
            r#type: 0,
            data: data.to_vec(),
        }
        .encode_to_vec()
    };
    let dir = tempfile::tempdir().unwrap();
    let mut crc = 0;
    let mut seg = Vec::new();
    frame(&mut seg, &mut crc, 4, vec![]);
    frame(&mut seg, &mut crc, 1, b"meta".to_vec());
    frame(
        &mut seg,
        &mut crc,
        5,
        wal::SnapshotMark { index: 0, term: 0 }.encode_to_vec(),
    );
    for i in 1..=5 {
        frame(&mut seg, &mut crc, 2, entry(i, 1, b"a"));
    }
    // a new leader overwrites 4 and 5
    frame(&mut seg, &mut crc, 2, entry(4, 2, b"b"));
    frame(
        &mut seg,
        &mut crc,
        3,
        wal::HardState {
            term: 2,
            vote: 1,
            commit: 4,
        }
        .encode_to_vec(),
    );
    std::fs::write(
        dir.path().join("0000000000000000-0000000000000000.wal"),
        &seg,
    )
    .unwrap();
    let mut seg2 = Vec::new();
    frame(&mut seg2, &mut crc, 4, vec![]);
    frame(&mut seg2, &mut crc, 2, entry(5, 2, b"c"));
    let whole = seg2.len();
    frame(&mut seg2, &mut crc, 2, entry(6, 2, b"torn"));
    seg2.truncate(whole + 10);
    seg2.resize(whole + 4096, 0);
    std::fs::write(
        dir.path().join("0000000000000001-0000000000000005.wal"),
        &seg2,
    )
    .unwrap();
    let w = wal::read_dir(dir.path(), &mut |_, _| {}).unwrap();
    let got: Vec<(u64, u64, Vec<u8>)> = w
        .entries
        .iter()
        .map(|e| (e.index, e.term, e.data.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, 1, b"a".to_vec()),
            (2, 1, b"a".to_vec()),
            (3, 1, b"a".to_vec()),
            (4, 2, b"b".to_vec()),
            (5, 2, b"c".to_vec()),
        ]
    );
    assert_eq!(w.hard_state.commit, 4);
    assert!(w.torn_tail);
    // Damage in a segment that is not the last is an error.
    let mut bad = seg.clone();
    let n = bad.len();
    bad[n - 3] ^= 0xff;
    std::fs::write(
        dir.path().join("0000000000000000-0000000000000000.wal"),
        &bad,
    )
    .unwrap();
    assert!(wal::read_dir(dir.path(), &mut |_, _| {}).is_err());

    // Random damage to either segment: read or refused, never a panic.
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for round in 0..2000 {
        let (name, good) = if round % 2 == 0 {
            ("0000000000000000-0000000000000000.wal", &seg)
        } else {
            ("0000000000000001-0000000000000005.wal", &seg2)
        };
        let mut data = good.clone();
        for _ in 0..1 + rng.next() % 4 {
            let at = (rng.next() % data.len() as u64) as usize;
            data[at] = rng.next() as u8;
        }
        if rng.next().is_multiple_of(3) {
            data.truncate((rng.next() % data.len() as u64) as usize);
        }
        std::fs::write(dir.path().join(name), &data).unwrap();
        let _ = wal::read_dir(dir.path(), &mut |_, _| {});
        std::fs::write(dir.path().join(name), good).unwrap();
    }
    // ... and random entry data through the request translation.
    for _ in 0..5000 {
        let n = (rng.next() % 64) as usize;
        let data: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
        let _ = wal::to_retcd(&data, &|p| Ok(p.as_bytes().to_vec()));
    }
}
