use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};

use proptest::prelude::*;

use super::*;

fn ent(index: u64, term: u64) -> WalEntry {
    WalEntry {
        index,
        term,
        data: format!("entry-{index}-{term}").into_bytes(),
    }
}

fn ents(range: std::ops::RangeInclusive<u64>, term: u64) -> Vec<WalEntry> {
    range.map(|i| ent(i, term)).collect()
}

fn segment_paths(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .collect();
    v.sort();
    v
}

fn last_segment(dir: &Path) -> PathBuf {
    segment_paths(dir).pop().unwrap()
}

fn file_len(p: &Path) -> u64 {
    fs::metadata(p).unwrap().len()
}

fn flip_byte(p: &Path, offset: u64) {
    let mut b = fs::read(p).unwrap();
    b[offset as usize] ^= 0x5a;
    fs::write(p, b).unwrap();
}

fn truncate(p: &Path, len: u64) {
    OpenOptions::new()
        .write(true)
        .open(p)
        .unwrap()
        .set_len(len)
        .unwrap();
}

#[test]
fn test_create() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("wal");
    assert!(!Wal::exists(&d));
    let w = Wal::create(&d, b"metadata").unwrap();
    drop(w);
    assert!(Wal::exists(&d));
    let paths = segment_paths(&d);
    assert_eq!(paths.len(), 1);
    assert!(paths[0].ends_with("0000000000000000-0000000000000000.wal"));
    let (_, c) = Wal::open(&d).unwrap();
    assert_eq!(
        c,
        WalContents {
            metadata: b"metadata".to_vec(),
            ..Default::default()
        }
    );
}

#[test]
fn test_new_for_inited_dir() {
    let dir = tempfile::tempdir().unwrap();
    Wal::create(dir.path(), b"m").unwrap();
    let err = Wal::create(dir.path(), b"m").unwrap_err();
    assert!(matches!(err, WalError::AlreadyExists(_)), "{err}");
    let empty = tempfile::tempdir().unwrap();
    let err = Wal::open(empty.path()).unwrap_err();
    assert!(matches!(err, WalError::NotFound(_)), "{err}");
    assert!(err.to_string().starts_with("wal: "));
}

#[test]
fn test_recover() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wal::create(dir.path(), b"cluster-1").unwrap();
    w.save(Some(b"hs-1"), &ents(1..=5, 1)).unwrap();
    w.save_snapshot(&WalSnapshot {
        index: 3,
        term: 1,
        payload: b"conf".to_vec(),
    })
    .unwrap();
    w.save(Some(b"hs-2"), &ents(6..=8, 2)).unwrap();
    w.save(None, &ents(9..=9, 2)).unwrap();
    drop(w);
    let (mut w, c) = Wal::open(dir.path()).unwrap();
    assert_eq!(c.metadata, b"cluster-1");
    assert_eq!(c.hard_state.as_deref(), Some(&b"hs-2"[..]));
    assert_eq!(
        c.snapshot,
        Some(WalSnapshot {
            index: 3,
            term: 1,
            payload: b"conf".to_vec()
        })
    );
    let mut want = ents(4..=5, 1);
    want.extend(ents(6..=9, 2));
    assert_eq!(c.entries, want);
    // Keep appending after recovery.
    w.save(Some(b"hs-3"), &ents(10..=10, 2)).unwrap();
    drop(w);
    let (_, c) = Wal::open(dir.path()).unwrap();
    assert_eq!(c.entries.last(), Some(&ent(10, 2)));
    assert_eq!(c.hard_state.as_deref(), Some(&b"hs-3"[..]));
}

#[test]
fn test_save_empty() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wal::create(dir.path(), b"m").unwrap();
    let len = file_len(&last_segment(dir.path()));
    let syncs = w.sync_count();
    w.save(None, &[]).unwrap();
    assert_eq!(w.sync_count(), syncs);
    assert_eq!(file_len(&last_segment(dir.path())), len);
}

#[test]
fn test_sync_count() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wal::create(dir.path(), b"m").unwrap();
    let base = w.sync_count();
    for i in 1..=10u64 {
        w.save(Some(b"hs"), &ents(i * 10..=i * 10 + 9, 1)).unwrap();
        assert_eq!(w.sync_count(), base + i);
    }
    w.save(Some(b"hs-only"), &[]).unwrap();
    assert_eq!(w.sync_count(), base + 11);
    w.save(None, &ents(200..=200, 1)).unwrap();
    assert_eq!(w.sync_count(), base + 12);
}

#[test]
fn test_unsynced_hard_state_then_synced_save() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wal::create(dir.path(), b"m").unwrap();
    w.save(Some(b"hs-1"), &ents(1..=3, 1)).unwrap();
    let base = w.sync_count();
    // a commit-only hard state: written, not synced
    w.save_opt(Some(b"hs-commit-3"), &[], false).unwrap();
    assert_eq!(w.sync_count(), base);
    drop(w);
    let (mut w, c) = Wal::open(dir.path()).unwrap();
    assert_eq!(c.hard_state.as_deref(), Some(&b"hs-commit-3"[..]));
    assert_eq!(c.entries, ents(1..=3, 1));
    // the next synced save makes it and what follows durable together
    let base = w.sync_count();
    w.save_opt(Some(b"hs-2"), &ents(4..=4, 1), true).unwrap();
    assert_eq!(w.sync_count(), base + 1);
    drop(w);
    let (_, c) = Wal::open(dir.path()).unwrap();
    assert_eq!(c.hard_state.as_deref(), Some(&b"hs-2"[..]));
    assert_eq!(c.entries, ents(1..=4, 1));
}

#[test]
fn test_at_most_one_unsynced_save() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wal::create(dir.path(), b"m").unwrap();
    w.save(Some(b"hs-1"), &ents(1..=1, 1)).unwrap();
    let base = w.sync_count();
    w.save_opt(Some(b"hs-c1"), &[], false).unwrap();
    assert_eq!(w.sync_count(), base, "one unsynced save may be outstanding");
    w.save_opt(Some(b"hs-c2"), &[], false).unwrap();
    assert_eq!(w.sync_count(), base + 1, "a second one syncs both");
    w.save_opt(Some(b"hs-c3"), &[], false).unwrap();
    assert_eq!(w.sync_count(), base + 1);
}

#[test]
fn test_cut_syncs_an_unsynced_tail() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wal::create(dir.path(), b"m").unwrap();
    w.set_segment_size(1024);
    // lengths vary, so which save of the alternation cuts varies too
    let hs =
        |i: u64| format!("hs-commit-{i:040}{}", "x".repeat((i % 13 * 7) as usize)).into_bytes();
    // Syncs of a synced save that cuts: its own + the new segment's.
    let mut i = 0u64;
    let synced_cut = loop {
        let (segs, base) = (w.segments.len(), w.sync_count());
        w.save(Some(&hs(i)), &[]).unwrap();
        i += 1;
        if w.segments.len() > segs {
            break w.sync_count() - base;
        }
    };
    // An unsynced save that cuts must sync the old tail: as many syncs.
    let mut checked = 0;
    for _ in 0..100_000 {
        if checked == 3 {
            break;
        }
        let (segs, base, was_unsynced) = (w.segments.len(), w.sync_count(), w.unsynced);
        w.save_opt(Some(&hs(i)), &[], false).unwrap();
        i += 1;
        if w.segments.len() > segs && !was_unsynced {
            assert_eq!(
                w.sync_count() - base,
                synced_cut,
                "a cut after an unsynced save left the old tail unsynced"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 3, "no cut happened on an unsynced save");
    w.save(Some(b"hs-2"), &ents(1..=1, 1)).unwrap();
    drop(w);
    let (_, c) = Wal::open(dir.path()).unwrap();
    assert_eq!(c.entries, ents(1..=1, 1));
    assert_eq!(c.hard_state.as_deref(), Some(&b"hs-2"[..]));
}

#[test]
fn test_unsynced_hard_state_torn_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wal::create(dir.path(), b"m").unwrap();
    w.save(Some(b"hs-1"), &ents(1..=3, 1)).unwrap();
    let synced_end = w.offset;
    w.save_opt(Some(b"hs-commit-3-with-some-length"), &[], false)
        .unwrap();
    let unsynced_end = w.offset;
    drop(w);
    // a crash wrote only part of the unsynced record: zero its second half
    let p = last_segment(dir.path());
    let mut b = fs::read(&p).unwrap();
    let mid = ((synced_end + unsynced_end) / 2) as usize;
    for x in &mut b[mid..unsynced_end as usize] {
        *x = 0;
    }
    fs::write(&p, b).unwrap();
    let (mut w, c) = Wal::open(dir.path()).unwrap();
    // back to the last synced state; the log goes on from there
    assert_eq!(c.hard_state.as_deref(), Some(&b"hs-1"[..]));
    assert_eq!(c.entries, ents(1..=3, 1));
    w.save(Some(b"hs-2"), &ents(4..=4, 1)).unwrap();
    drop(w);
    let (_, c) = Wal::open(dir.path()).unwrap();
    assert_eq!(c.entries, ents(1..=4, 1));
    assert_eq!(c.hard_state.as_deref(), Some(&b"hs-2"[..]));
}

#[test]
fn test_overwrite_on_replay() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wal::create(dir.path(), b"m").unwrap();
    w.save(Some(b"t1"), &ents(1..=10, 1)).unwrap();
    // Leader change: entries from 6 on are replaced by term 2.
    w.save(Some(b"t2"), &ents(6..=7, 2)).unwrap();
    // Another change rewrites 7 only.
    w.save(Some(b"t3"), &ents(7..=8, 3)).unwrap();
    drop(w);
    let (_, c) = Wal::open(dir.path()).unwrap();
    let mut want = ents(1..=5, 1);
    want.push(ent(6, 2));
    want.extend(ents(7..=8, 3));
    assert_eq!(c.entries, want);
    assert_eq!(c.hard_state.as_deref(), Some(&b"t3"[..]));
}

#[test]
fn test_entries_before_snapshot_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wal::create(dir.path(), b"m").unwrap();
    w.save(None, &ents(1..=10, 1)).unwrap();
    w.save_snapshot(&WalSnapshot {
        index: 4,
        term: 1,
        payload: vec![],
    })
    .unwrap();
    w.save_snapshot(&WalSnapshot {
        index: 7,
        term: 1,
        payload: vec![1],
    })
    .unwrap();
    drop(w);
    let (mut w, c) = Wal::open(dir.path()).unwrap();
    assert_eq!(c.snapshot.as_ref().map(|s| s.index), Some(7));
    assert_eq!(c.entries, ents(8..=10, 1));
    // A snapshot beyond the last entry (installed from the leader) empties the log.
    w.save_snapshot(&WalSnapshot {
        index: 50,
        term: 3,
        payload: vec![],
    })
    .unwrap();
    drop(w);
    let (_, c) = Wal::open(dir.path()).unwrap();
    assert!(c.entries.is_empty());
}

/// Writes 100 entries of ~100 bytes in batches of 5 with 1 KiB segments.
fn write_cut_log(dir: &Path) -> Wal {
    let mut w = Wal::create(dir, b"meta").unwrap();
    w.set_segment_size(1024);
    for b in 0..20u64 {
        let batch: Vec<WalEntry> = (b * 5 + 1..=b * 5 + 5)
            .map(|i| WalEntry {
                index: i,
                term: 1,
                data: vec![i as u8; 100],
            })
            .collect();
        w.save(Some(format!("hs-{b}").as_bytes()), &batch).unwrap();
    }
    w
}

#[test]
fn test_save_with_cut() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = write_cut_log(dir.path());
    let paths = segment_paths(dir.path());
    assert!(
        paths.len() >= 5,
        "expected several segments, got {}",
        paths.len()
    );
    for (i, p) in paths.iter().enumerate() {
        let n = p.file_name().unwrap().to_str().unwrap();
        let parsed = segment::SegmentName::parse(n).unwrap();
        assert_eq!(parsed.seq, i as u64);
    }
    // A new segment's name carries the index of the next entry.
    let n1 = segment::SegmentName::parse(paths[1].file_name().unwrap().to_str().unwrap()).unwrap();
    assert_eq!(n1.first_index % 5, 1);
    w.save(None, &ents(101..=101, 1)).unwrap();
    drop(w);

    // test_recover_after_cut
    let (mut w, c) = Wal::open(dir.path()).unwrap();
    assert_eq!(c.metadata, b"meta");
    assert_eq!(c.hard_state.as_deref(), Some(&b"hs-19"[..]));
    assert_eq!(c.entries.len(), 101);
    assert!(c
        .entries
        .iter()
        .enumerate()
        .all(|(i, e)| e.index == i as u64 + 1));
    w.set_segment_size(1024);
    w.save(None, &ents(102..=120, 1)).unwrap();
    drop(w);
    let (_, c) = Wal::open(dir.path()).unwrap();
    assert_eq!(c.entries.len(), 120);
}

#[test]
fn test_release_lock_to() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = write_cut_log(dir.path());
    let before = segment_paths(dir.path()).len();
    w.save_snapshot(&WalSnapshot {
        index: 60,
        term: 1,
        payload: b"cs".to_vec(),
    })
    .unwrap();
    w.release_to(60).unwrap();
    let after = segment_paths(dir.path());
    assert!(after.len() < before, "{} -> {}", before, after.len());
    // The first remaining segment must still hold entry 61 onwards.
    w.save(None, &ents(101..=101, 1)).unwrap();
    drop(w);
    let (mut w, c) = Wal::open(dir.path()).unwrap();
    assert_eq!(c.snapshot.as_ref().map(|s| s.index), Some(60));
    assert_eq!(c.hard_state.as_deref(), Some(&b"hs-19"[..]));
    assert_eq!(c.entries.first().map(|e| e.index), Some(61));
    assert_eq!(c.entries.last().map(|e| e.index), Some(101));
    assert_eq!(c.entries.len(), 41);
    // Never deletes the segment being written (after a snapshot at the
    // last entry, so what stays is a log without holes).
    w.save_snapshot(&WalSnapshot {
        index: 101,
        term: 1,
        payload: b"cs".to_vec(),
    })
    .unwrap();
    w.release_to(u64::MAX).unwrap();
    assert!(!segment_paths(dir.path()).is_empty());
    drop(w);
    let (_, c) = Wal::open(dir.path()).unwrap();
    assert_eq!(c.metadata, b"meta");
}

#[test]
fn test_release_keeps_segment_with_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = write_cut_log(dir.path());
    let before = segment_paths(dir.path()).len();
    // No snapshot at or below 60 exists, so nothing may go.
    w.release_to(60).unwrap();
    assert_eq!(segment_paths(dir.path()).len(), before);
}

#[test]
fn test_open_on_torn_write() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wal::create(dir.path(), b"m").unwrap();
    let mut lens = Vec::new();
    for i in 1..=10u64 {
        w.save(Some(format!("hs{i}").as_bytes()), &ents(i..=i, 1))
            .unwrap();
        lens.push(file_len(&last_segment(dir.path())));
    }
    drop(w);
    let p = last_segment(dir.path());
    // Cut in the middle of the 8th save's entry record.
    truncate(&p, lens[6] + 20);
    let (mut w, c) = Wal::open(dir.path()).unwrap();
    assert_eq!(c.entries, ents(1..=7, 1));
    assert_eq!(c.hard_state.as_deref(), Some(&b"hs7"[..]));
    assert_eq!(file_len(&p), lens[6], "torn tail truncated on disk");
    w.save(Some(b"again"), &ents(8..=9, 2)).unwrap();
    drop(w);
    let (_, c) = Wal::open(dir.path()).unwrap();
    let mut want = ents(1..=7, 1);
    want.extend(ents(8..=9, 2));
    assert_eq!(c.entries, want);
    assert_eq!(c.hard_state.as_deref(), Some(&b"again"[..]));
}

#[test]
fn test_tail_zeros_end_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wal::create(dir.path(), b"m").unwrap();
    w.save(Some(b"hs"), &ents(1..=5, 1)).unwrap();
    drop(w);
    let p = last_segment(dir.path());
    let len = file_len(&p);
    // Zeros after the last record are the unwritten part of a
    // preallocated segment: the log ends there, nothing is cut.
    let mut zeros_total = 0;
    for zeros in [3usize, 16, 4096] {
        let mut f = OpenOptions::new().append(true).open(&p).unwrap();
        std::io::Write::write_all(&mut f, &vec![0u8; zeros]).unwrap();
        drop(f);
        zeros_total += zeros as u64;
        let (w, c) = Wal::open(dir.path()).unwrap();
        assert_eq!(c.entries, ents(1..=5, 1));
        assert_eq!(c.hard_state.as_deref(), Some(&b"hs"[..]));
        assert_eq!(file_len(&p), len + zeros_total);
        drop(w);
    }
    truncate(&p, len);
    // Last record damaged and followed by zeros: torn, only it is dropped.
    flip_byte(&p, len - 1);
    let mut f = OpenOptions::new().append(true).open(&p).unwrap();
    std::io::Write::write_all(&mut f, &[0u8; 100]).unwrap();
    drop(f);
    let (mut w, c) = Wal::open(dir.path()).unwrap();
    assert_eq!(c.entries, ents(1..=5, 1));
    assert_eq!(
        c.hard_state, None,
        "the damaged hard state record was the tail"
    );
    w.save(Some(b"hs2"), &ents(6..=6, 1)).unwrap();
    drop(w);
    let (_, c) = Wal::open(dir.path()).unwrap();
    assert_eq!(c.entries, ents(1..=6, 1));
}

/// Runs `f` with segments preallocated to `bytes` (capped at the segment
/// size), as the server does with 64 MiB.
fn with_prealloc<R>(bytes: u64, f: impl FnOnce() -> R) -> R {
    super::TEST_PREALLOC.with(|p| p.set(Some(bytes)));
    let r = f();
    super::TEST_PREALLOC.with(|p| p.set(None));
    r
}

const PREALLOC: u64 = 256 * 1024;

#[test]
fn test_preallocated_segments_replay_and_cut() {
    with_prealloc(PREALLOC, || {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Wal::create(dir.path(), b"m").unwrap();
        let p0 = last_segment(dir.path());
        assert_eq!(file_len(&p0), PREALLOC, "first segment preallocated");
        for i in 1..=10u64 {
            w.save(Some(format!("hs{i}").as_bytes()), &ents(i..=i, 1))
                .unwrap();
        }
        assert_eq!(
            file_len(&p0),
            PREALLOC,
            "appends stay inside the allocation"
        );
        drop(w);
        let (mut w, c) = Wal::open(dir.path()).unwrap();
        assert_eq!(c.entries, ents(1..=10, 1));
        assert_eq!(c.hard_state.as_deref(), Some(&b"hs10"[..]));
        // Appending after a reopen writes after the last record, not at
        // the end of the file.
        w.set_segment_size(4096);
        for i in 11..=60u64 {
            w.save(
                None,
                &[WalEntry {
                    index: i,
                    term: 2,
                    data: vec![i as u8; 200],
                }],
            )
            .unwrap();
        }
        drop(w);
        let segs = segment_paths(dir.path());
        assert!(segs.len() > 2, "segments were cut: {segs:?}");
        for p in &segs[1..] {
            assert!(file_len(p) >= 4096, "{} preallocated", p.display());
        }
        let (_, c) = Wal::open(dir.path()).unwrap();
        assert_eq!(c.entries.len(), 60);
        assert_eq!(c.entries.last().unwrap().index, 60);
    });
}

#[test]
fn test_preallocated_torn_tail_repaired() {
    with_prealloc(PREALLOC, || {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Wal::create(dir.path(), b"m").unwrap();
        let mut ends = Vec::new();
        for i in 1..=10u64 {
            w.save(Some(format!("hs{i}").as_bytes()), &ents(i..=i, 1))
                .unwrap();
            ends.push(w.offset);
        }
        drop(w);
        let p = last_segment(dir.path());
        // The 8th save only partly reached disk: its bytes from 20 on, and
        // all later ones, read as the preallocated zeros.
        let mut b = fs::read(&p).unwrap();
        for x in &mut b[(ends[6] + 20) as usize..ends[9] as usize] {
            *x = 0;
        }
        fs::write(&p, &b).unwrap();
        let (mut w, c) = Wal::open(dir.path()).unwrap();
        assert_eq!(c.entries, ents(1..=7, 1));
        assert_eq!(c.hard_state.as_deref(), Some(&b"hs7"[..]));
        assert_eq!(w.offset, ends[6]);
        assert_eq!(file_len(&p), PREALLOC, "room given back after the cut");
        w.save(Some(b"again"), &ents(8..=9, 2)).unwrap();
        drop(w);
        let (_, c) = Wal::open(dir.path()).unwrap();
        let mut want = ents(1..=7, 1);
        want.extend(ents(8..=9, 2));
        assert_eq!(c.entries, want);

        // A valid record header far into the zeros means records were
        // written after a damaged one: corruption, refused.
        let mut b = fs::read(&p).unwrap();
        let rec = b[ends[0] as usize..ends[1] as usize].to_vec();
        let at = (PREALLOC / 2) as usize;
        b[at..at + rec.len()].copy_from_slice(&rec);
        let damaged = ends[3] as usize + 3;
        b[damaged] ^= 0xFF;
        fs::write(&p, &b).unwrap();
        let err = Wal::open(dir.path()).unwrap_err();
        assert!(err.to_string().contains("crc"), "{err}");
    });
}

#[test]
fn test_garbage_tail_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wal::create(dir.path(), b"m").unwrap();
    w.save(Some(b"hs"), &ents(1..=5, 1)).unwrap();
    drop(w);
    let p = last_segment(dir.path());
    let len = file_len(&p);
    // An unfinished write that left a bogus length word and random bytes
    // (what etcd-style harnesses write to simulate a torn sector).
    let mut junk = 4096u64.to_le_bytes().to_vec();
    junk.extend((0..37u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8));
    let mut f = OpenOptions::new().append(true).open(&p).unwrap();
    std::io::Write::write_all(&mut f, &junk).unwrap();
    drop(f);
    let (mut w, c) = Wal::open(dir.path()).unwrap();
    assert_eq!(c.entries, ents(1..=5, 1));
    assert_eq!(file_len(&p), len);
    w.save(None, &ents(6..=6, 1)).unwrap();
    drop(w);
    assert_eq!(Wal::open(dir.path()).unwrap().1.entries, ents(1..=6, 1));
}

#[test]
fn test_corrupt_middle_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wal::create(dir.path(), b"m").unwrap();
    for i in 1..=20u64 {
        w.save(None, &ents(i..=i, 1)).unwrap();
    }
    drop(w);
    let p = last_segment(dir.path());
    let len = file_len(&p);
    for off in [len / 2, len / 3, len / 2 + 7, len - 60] {
        let orig = fs::read(&p).unwrap();
        flip_byte(&p, off);
        let err = Wal::open(dir.path()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("wal: ") && msg.contains("crc"),
            "offset {off}: {msg}"
        );
        assert!(
            msg.contains("0000000000000000-0000000000000000.wal"),
            "{msg}"
        );
        fs::write(&p, orig).unwrap();
    }
    assert_eq!(Wal::open(dir.path()).unwrap().1.entries.len(), 20);
}

#[test]
fn test_corrupt_non_last_segment_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(write_cut_log(dir.path()));
    let paths = segment_paths(dir.path());
    // The very last byte of segment 1: a torn tail if it were the last segment.
    let p = &paths[1];
    flip_byte(p, file_len(p) - 1);
    let err = Wal::open(dir.path()).unwrap_err();
    assert!(err.to_string().contains("crc"), "{err}");
    flip_byte(p, file_len(p) - 1);
    // Truncating a non-last segment is refused too.
    truncate(p, file_len(p) - 3);
    let err = Wal::open(dir.path()).unwrap_err();
    assert!(matches!(err, WalError::UnexpectedEof { .. }), "{err}");
}

#[test]
fn test_missing_segment_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(write_cut_log(dir.path()));
    let paths = segment_paths(dir.path());
    fs::remove_file(&paths[2]).unwrap();
    let err = Wal::open(dir.path()).unwrap_err();
    assert!(matches!(err, WalError::MissingSegment { .. }), "{err}");
}

#[test]
fn test_chain_mismatch_refused() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    for (dir, byte) in [(a.path(), 1u8), (b.path(), 2u8)] {
        let mut w = Wal::create(dir, b"m").unwrap();
        w.set_segment_size(1);
        w.save(
            None,
            &[WalEntry {
                index: 1,
                term: 1,
                data: vec![byte],
            }],
        )
        .unwrap();
        w.save(None, &ents(2..=2, 1)).unwrap();
    }
    // Same names, different contents of segment 0: segment 1 of b does not
    // chain onto segment 0 of a.
    let pa = segment_paths(a.path());
    let pb = segment_paths(b.path());
    assert_eq!(pa[1].file_name(), pb[1].file_name());
    fs::copy(&pb[1], &pa[1]).unwrap();
    let err = Wal::open(a.path()).unwrap_err();
    assert!(matches!(err, WalError::ChainMismatch { .. }), "{err}");
    assert!(err.to_string().contains("crc"), "{err}");
}

#[test]
fn test_leftover_tmp_removed() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wal::create(dir.path(), b"m").unwrap();
    w.save(None, &ents(1..=3, 1)).unwrap();
    drop(w);
    let tmp = dir.path().join("0000000000000001-0000000000000004.wal.tmp");
    fs::write(&tmp, b"half a header").unwrap();
    let (_, c) = Wal::open(dir.path()).unwrap();
    assert_eq!(c.entries.len(), 3);
    assert!(!tmp.exists());
}

#[derive(Debug, Clone)]
struct Batch {
    back: u64,
    count: u64,
    data_len: usize,
    hard_state: Option<Vec<u8>>,
}

fn batch() -> impl Strategy<Value = Batch> {
    (
        0u64..3,
        0u64..5,
        0usize..40,
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..8)),
    )
        .prop_map(|(back, count, data_len, hard_state)| Batch {
            back,
            count,
            data_len,
            hard_state,
        })
}

/// The entries of batch `n`, given the last index before it.
fn batch_entries(b: &Batch, n: usize, last: u64) -> Vec<WalEntry> {
    let start = (last + 1).saturating_sub(b.back).max(1);
    (start..start + b.count)
        .map(|i| WalEntry {
            index: i,
            term: n as u64 + 1,
            data: vec![i as u8; b.data_len],
        })
        .collect()
}

fn model_apply(log: &mut Vec<WalEntry>, e: &WalEntry) {
    log.retain(|x| x.index < e.index);
    log.push(e.clone());
}

/// Saves every batch; returns the end of the written part after each save
/// and each save's entries.
fn save_batches(w: &mut Wal, batches: &[Batch]) -> (Vec<u64>, Vec<Vec<WalEntry>>) {
    let mut ends = Vec::new();
    let mut all = Vec::new();
    let mut last = 0u64;
    for (n, b) in batches.iter().enumerate() {
        let es = batch_entries(b, n, last);
        if let Some(e) = es.last() {
            last = e.index;
        }
        w.save(b.hard_state.as_deref(), &es).unwrap();
        ends.push(w.offset);
        all.push(es);
    }
    (ends, all)
}

/// The log replayed after damage at `t`: every save that ended at or before
/// `t`, plus possibly a prefix of the one torn. Returns (the synced model,
/// whether `replayed` is one of the allowed outcomes).
fn synced_prefix_ok(
    replayed: &[WalEntry],
    ends: &[u64],
    all: &[Vec<WalEntry>],
    t: u64,
) -> (Vec<WalEntry>, bool) {
    let m = ends.iter().take_while(|&&l| l <= t).count();
    let mut model = Vec::new();
    for es in all.iter().take(m) {
        for e in es {
            model_apply(&mut model, e);
        }
    }
    let mut candidate = model.clone();
    let mut ok = candidate == replayed;
    for e in all.get(m).into_iter().flatten() {
        model_apply(&mut candidate, e);
        ok |= candidate == replayed;
    }
    (model, ok)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn prop_torn_truncation_yields_synced_prefix(
        batches in proptest::collection::vec(batch(), 1..12),
        cut in 0.0f64..=1.0,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Wal::create(dir.path(), b"meta").unwrap();
        let p = last_segment(dir.path());
        let header_end = file_len(&p);
        let (lens, all) = save_batches(&mut w, &batches);
        drop(w);
        let total = file_len(&p);
        let t = ((total as f64) * cut) as u64;
        truncate(&p, t);
        let res = Wal::open(dir.path());
        if t < header_end {
            prop_assert!(res.is_err());
            return Ok(());
        }
        let (mut w, c) = res.unwrap();
        // Saves whose sync completed before the cut are all there, plus
        // possibly a prefix of the save that was torn.
        let m = lens.iter().take_while(|&&l| l <= t).count();
        let hs = batches[..m].iter().rev().find_map(|b| b.hard_state.clone());
        prop_assert_eq!(&c.metadata, b"meta");
        prop_assert_eq!(&c.hard_state, &hs);
        let (model, ok) = synced_prefix_ok(&c.entries, &lens, &all, t);
        prop_assert!(ok, "replayed {:?}\nmodel {:?}", c.entries, model);

        // The repaired log accepts more and replays them.
        let next = c.entries.last().map_or(1, |e| e.index + 1);
        w.save(Some(b"after"), &ents(next..=next + 2, 99)).unwrap();
        drop(w);
        let (_, c2) = Wal::open(dir.path()).unwrap();
        prop_assert_eq!(c2.hard_state.as_deref(), Some(&b"after"[..]));
        let mut want = c.entries.clone();
        want.extend(ents(next..=next + 2, 99));
        prop_assert_eq!(c2.entries, want);
    }

    #[test]
    fn prop_torn_zeroed_tail_in_preallocated_segment(
        batches in proptest::collection::vec(batch(), 1..12),
        cut in 0.0f64..=1.0,
    ) {
        with_prealloc(PREALLOC, || -> std::result::Result<(), TestCaseError> {
            let dir = tempfile::tempdir().unwrap();
            let mut w = Wal::create(dir.path(), b"meta").unwrap();
            let header_end = w.offset;
            let (ends, all) = save_batches(&mut w, &batches);
            let total = w.offset;
            drop(w);
            let p = last_segment(dir.path());
            let t = header_end + (((total - header_end) as f64) * cut) as u64;
            let mut b = fs::read(&p).unwrap();
            for x in &mut b[t as usize..total as usize] { *x = 0; }
            fs::write(&p, &b).unwrap();
            let (mut w, c) = Wal::open(dir.path()).unwrap();
            let (model, ok) = synced_prefix_ok(&c.entries, &ends, &all, t);
            prop_assert!(ok, "replayed {:?}\nmodel {:?}", c.entries, model);
            let next = c.entries.last().map_or(1, |e| e.index + 1);
            w.save(Some(b"after"), &ents(next..=next, 99)).unwrap();
            drop(w);
            let (_, c2) = Wal::open(dir.path()).unwrap();
            prop_assert_eq!(c2.hard_state.as_deref(), Some(&b"after"[..]));
            prop_assert_eq!(c2.entries.last(), Some(&ent(next, 99)));
            Ok(())
        })?;
    }

    #[test]
    fn prop_open_random_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("0000000000000000-0000000000000000.wal"), &bytes).unwrap();
        let _ = Wal::open(dir.path());
    }

    #[test]
    fn prop_open_mutated_log_never_panics(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 0..4),
        cut in proptest::option::of(any::<prop::sample::Index>()),
        tail in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Wal::create(dir.path(), b"meta").unwrap();
        w.save(Some(b"hs"), &ents(1..=4, 1)).unwrap();
        w.save_snapshot(&WalSnapshot { index: 2, term: 1, payload: vec![7; 9] }).unwrap();
        w.save(Some(b"hs2"), &ents(3..=6, 2)).unwrap();
        drop(w);
        let p = last_segment(dir.path());
        let mut b = fs::read(&p).unwrap();
        for (i, x) in &flips {
            let at = i.index(b.len());
            b[at] ^= x;
        }
        if let Some(c) = cut {
            b.truncate(c.index(b.len() + 1));
        }
        b.extend_from_slice(&tail);
        fs::write(&p, &b).unwrap();
        if let Ok((mut w, c)) = Wal::open(dir.path()) {
            // Whatever survived must be appendable and replay again.
            let next = c.entries.last().map_or(7, |e| e.index + 1);
            w.save(None, &ents(next..=next, 3)).unwrap();
            drop(w);
            let (_, c2) = Wal::open(dir.path()).unwrap();
            prop_assert_eq!(c2.entries.last(), Some(&ent(next, 3)));
        }
    }
}

#[test]
fn test_index_gap_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wal::create(dir.path(), b"m").unwrap();
    w.save_snapshot(&WalSnapshot {
        index: 1,
        term: 1,
        payload: vec![],
    })
    .unwrap();
    // CRC-valid records, but entry 4 is missing
    w.save(None, &ents(2..=3, 1)).unwrap();
    w.save(None, &ents(5..=6, 1)).unwrap();
    drop(w);
    match Wal::open(dir.path()) {
        Err(WalError::IndexGap { after: 3, found: 5 }) => {}
        other => panic!(
            "expected an index gap, got {:?}",
            other.map(|(_, c)| c.entries)
        ),
    }
    // a log that skips right after the snapshot too
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wal::create(dir.path(), b"m").unwrap();
    w.save_snapshot(&WalSnapshot {
        index: 1,
        term: 1,
        payload: vec![],
    })
    .unwrap();
    w.save(None, &ents(3..=4, 1)).unwrap();
    drop(w);
    assert!(matches!(
        Wal::open(dir.path()),
        Err(WalError::IndexGap { after: 1, found: 3 })
    ));
}

fn big_ent(index: u64) -> WalEntry {
    WalEntry {
        index,
        term: 1,
        data: vec![index as u8; 4096],
    }
}

/// Once a segment has taken a MiB, a zero-filled spare is prepared in the
/// background; when it is ready the log moves onto it at once (the old
/// segment cut to its written length), and everything replays.
#[test]
fn test_log_moves_onto_a_prepared_spare() {
    with_prealloc(4 << 20, || {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Wal::create(dir.path(), b"m").unwrap();
        let mut i = 0;
        // 1.2 MiB: past the point where the spare is started
        while i < 300 {
            i += 1;
            w.save(None, &[big_ent(i)]).unwrap();
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while segment_paths(dir.path()).len() < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "no switch to the spare"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
            i += 1;
            w.save(None, &[big_ent(i)]).unwrap();
        }
        let segs = segment_paths(dir.path());
        assert!(w.zeroed(), "the current segment is the prepared spare");
        assert_eq!(file_len(&segs[1]), 4 << 20, "the spare is the whole size");
        assert!(
            file_len(&segs[0]) < 4 << 20 && file_len(&segs[0]) > i * 4096 / 2,
            "the old segment is cut to what was written: {}",
            file_len(&segs[0])
        );
        assert!(!dir.path().join(segment::SPARE_NAME).exists());
        for _ in 0..10 {
            i += 1;
            w.save(Some(b"hs"), &[big_ent(i)]).unwrap();
        }
        drop(w);
        let (_, c) = Wal::open(dir.path()).unwrap();
        assert_eq!(c.entries, (1..=i).map(big_ent).collect::<Vec<_>>());
        assert_eq!(c.hard_state.as_deref(), Some(&b"hs"[..]));
    });
}

/// Saves 4 KiB entries 1, 2, ... until the log has moved onto a prepared
/// spare (pausing once the spare is due, so its thread gets to write it).
/// Returns the last index saved.
fn save_until_on_a_spare(w: &mut Wal) -> u64 {
    let mut i = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !w.zeroed() {
        assert!(
            std::time::Instant::now() < deadline,
            "no switch to the spare"
        );
        i += 1;
        w.save(None, &[big_ent(i)]).unwrap();
        if i > 300 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
    i
}

/// On a prepared segment the next spare is started only once the segment
/// is half written (it is needed when the segment is full), not after its
/// first MiB.
#[test]
fn test_next_spare_waits_for_half_of_a_prepared_segment() {
    with_prealloc(8 << 20, || {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Wal::create(dir.path(), b"m").unwrap();
        let mut i = save_until_on_a_spare(&mut w);
        assert!(w.spare.is_none(), "the spare in use is not a next one");
        // 2 MiB into the 8 MiB prepared segment: past SPARE_AFTER, short of half
        for _ in 0..512 {
            i += 1;
            w.save(None, &[big_ent(i)]).unwrap();
        }
        assert!(w.offset < 4 << 20, "offset {}", w.offset);
        assert!(w.spare.is_none(), "a spare started before half the segment");
        while w.offset < 4 << 20 {
            i += 1;
            w.save(None, &[big_ent(i)]).unwrap();
        }
        assert!(
            w.spare.is_some(),
            "no spare once half the segment is written"
        );
        drop(w);
        let (_, c) = Wal::open(dir.path()).unwrap();
        assert_eq!(c.entries, (1..=i).map(big_ent).collect::<Vec<_>>());
    });
}

/// Only a tail whose every block is written counts as prepared zeros:
/// not one preallocated with `fallocate`, nor a sparse one.
#[test]
fn test_written_zeros_end() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let open = |name: &str| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(dir.path().join(name))
            .unwrap()
    };
    let len = 1u64 << 20;
    let written = open("written");
    written.write_all_at(&vec![0u8; len as usize], 0).unwrap();
    written.sync_all().unwrap();
    assert_eq!(segment::written_zeros_end(&written, 5000, len), len);
    assert_eq!(segment::written_zeros_end(&written, 0, len), len);
    assert_eq!(segment::written_zeros_end(&written, len, len), 0);

    let sparse = open("sparse");
    sparse.write_all_at(&[1u8; 8192], 0).unwrap();
    sparse.set_len(len).unwrap();
    sparse.sync_all().unwrap();
    assert_eq!(segment::written_zeros_end(&sparse, 8192, len), 0);

    let allocated = open("allocated");
    allocated.write_all_at(&[1u8; 8192], 0).unwrap();
    segment::preallocate(&allocated, len, &dir.path().join("allocated"));
    allocated.sync_all().unwrap();
    assert_eq!(allocated.metadata().unwrap().len(), len);
    assert_eq!(segment::written_zeros_end(&allocated, 8192, len), 0);
    // its written head alone is not a tail of zeros to the end
    assert_eq!(segment::written_zeros_end(&allocated, 100, len), 0);
}

/// A log reopened on a prepared segment knows it is one (its tail's
/// blocks are written, not only preallocated): no early spare replaces
/// it, and its next spare waits for half the segment, as before the
/// restart. (Its appends read nothing from the disk either way: open
/// reads the whole segment into the page cache.) A reopened segment that
/// was only preallocated is not taken for a prepared one.
#[test]
fn test_reopened_prepared_segment_is_known_as_prepared() {
    with_prealloc(8 << 20, || {
        let dir = tempfile::tempdir().unwrap();
        drop(Wal::create(dir.path(), b"m").unwrap());
        let (mut w, _) = Wal::open(dir.path()).unwrap();
        assert!(
            !w.zeroed(),
            "a preallocated segment taken for a prepared one"
        );
        let mut i = save_until_on_a_spare(&mut w);
        for _ in 0..10 {
            i += 1;
            w.save(Some(b"hs"), &[big_ent(i)]).unwrap();
        }
        drop(w);
        let (mut w, c) = Wal::open(dir.path()).unwrap();
        assert_eq!(c.entries.len() as u64, i);
        assert!(
            w.zeroed(),
            "the reopened prepared segment is not known as one"
        );
        assert_eq!(w.zeros_end, 8 << 20);
        let put = |i: u64| WalEntry {
            index: i,
            term: 1,
            data: vec![i as u8; 300],
        };
        let start = w.offset;
        for _ in 0..SPARE_AFTER_SYNCS + 10 {
            i += 1;
            w.save(Some(b"hs"), &[put(i)]).unwrap();
        }
        assert!(w.offset - start > SPARE_AFTER / 4);
        assert!(w.offset < 4 << 20);
        assert_eq!(
            segment_paths(dir.path()).len(),
            2,
            "no cut after the reopen"
        );
        assert!(
            w.spare.is_none(),
            "a spare started before half the reopened prepared segment"
        );
        drop(w);
        let (_, c) = Wal::open(dir.path()).unwrap();
        assert_eq!(c.entries.len() as u64, i);
        assert_eq!(c.entries.last().unwrap(), &put(i));
    });
}

/// A log dropped while its spare is prepared: the next open removes the
/// unfinished spare and replays everything.
#[test]
fn test_unfinished_spare_is_removed_at_open() {
    with_prealloc(64 << 20, || {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Wal::create(dir.path(), b"m").unwrap();
        for i in 1..=300 {
            w.save(None, &[big_ent(i)]).unwrap();
        }
        assert!(w.spare.is_some(), "the spare is being prepared");
        drop(w);
        let (_, c) = Wal::open(dir.path()).unwrap();
        assert_eq!(c.entries, (1..=300).map(big_ent).collect::<Vec<_>>());
        assert!(!dir.path().join(segment::SPARE_NAME).exists());
        assert_eq!(segment_paths(dir.path()).len(), 1);
    });
}

/// Bytes this thread has had read from the disk (not from the page cache).
fn thread_read_bytes() -> u64 {
    let io = fs::read_to_string("/proc/thread-self/io").unwrap();
    io.lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

/// Whether the file system under `dir` takes `O_DIRECT` writes.
fn takes_direct_io(dir: &Path) -> bool {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let p = dir.join("direct-probe");
    let ok = OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_DIRECT)
        .open(&p)
        .and_then(|f| {
            let v = vec![0u8; 2 * segment::PAGE];
            let a = &v[v.as_ptr().align_offset(segment::PAGE)..][..segment::PAGE];
            f.write_all_at(a, 0)
        })
        .is_ok();
    let _ = fs::remove_file(&p);
    ok
}

#[test]
fn test_page_pad() {
    let page = segment::PAGE as u64;
    // to the end of the page the write ends in, not past the zeros
    assert_eq!(segment::page_pad(1, 4 * page), segment::PAGE - 1);
    assert_eq!(segment::page_pad(page + 300, 4 * page), segment::PAGE - 300);
    assert_eq!(segment::page_pad(page, 4 * page), 0);
    assert_eq!(segment::page_pad(3 * page + 10, 3 * page + 100), 90);
    assert_eq!(segment::page_pad(4 * page, 4 * page), 0);
    assert_eq!(segment::page_pad(5 * page + 1, 4 * page), 0);
}

#[test]
fn test_write_padded_writes_the_bytes_then_zeros() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(dir.path().join("f"))
        .unwrap();
    f.write_all_at(&[0xee; 3 * segment::PAGE], 0).unwrap();
    segment::write_padded(&f, &[7; 300], 100, 10).unwrap();
    segment::write_padded(&f, &[], 5, 2000).unwrap();
    segment::write_padded(&f, &[9; 3], 0, 2010).unwrap();
    let mut got = vec![0u8; 3 * segment::PAGE];
    f.read_exact_at(&mut got, 0).unwrap();
    let mut want = vec![0xeeu8; 3 * segment::PAGE];
    want[10..310].fill(7);
    want[310..410].fill(0);
    want[2000..2005].fill(0);
    want[2010..2013].fill(9);
    assert_eq!(got, want);
}

/// Moves a log onto a prepared spare, appends small synced saves over a
/// dozen fresh pages of it (asserting that they read nothing from the
/// disk), checks its far end is zeros and that everything replays.
/// Returns the bytes read from the disk to read that far end (256 KiB).
fn spare_appends_then_tail_reads() -> u64 {
    use std::os::unix::fs::FileExt;
    with_prealloc(4 << 20, || {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Wal::create(dir.path(), b"m").unwrap();
        let mut i = save_until_on_a_spare(&mut w);
        let seg = last_segment(dir.path());
        assert_eq!(file_len(&seg), 4 << 20);
        let start = w.offset;
        let before = thread_read_bytes();
        let put = |i: u64| WalEntry {
            index: i,
            term: 1,
            data: vec![i as u8; 300],
        };
        for _ in 0..200 {
            i += 1;
            w.save(Some(b"hs"), &[put(i)]).unwrap();
        }
        assert!(w.offset - start > 12 * segment::PAGE as u64);
        assert_eq!(
            thread_read_bytes() - before,
            0,
            "appends into the prepared segment read pages from the disk"
        );
        // every block of it written (no hole left by a step)
        let blocks = std::os::unix::fs::MetadataExt::blocks(&fs::metadata(&seg).unwrap());
        assert!(blocks * 512 >= 4 << 20, "the prepared segment has holes");
        let f = fs::File::open(&seg).unwrap();
        const TAIL: usize = 256 * 1024;
        let mut tail = vec![1u8; TAIL];
        let before = thread_read_bytes();
        f.read_exact_at(&mut tail, (4 << 20) - TAIL as u64).unwrap();
        assert!(tail.iter().all(|&b| b == 0));
        let read = thread_read_bytes() - before;
        drop(w);
        let (_, c) = Wal::open(dir.path()).unwrap();
        assert_eq!(c.entries.len() as u64, i);
        assert_eq!(c.entries.last().unwrap(), &put(i));
        assert_eq!(c.hard_state.as_deref(), Some(&b"hs"[..]));
        read
    })
}

/// A prepared spare's zeros reach the disk past the page cache (where the
/// file system takes `O_DIRECT`), and the log writes each page of it whole
/// the first time, so its small appends read nothing from the disk (a
/// partial write into an uncached written block reads the block first).
/// Where `O_DIRECT` writes are refused (EINVAL), the spare is written the
/// usual way, through the page cache. (One test: the refusal is global to
/// the process's spares.)
#[test]
fn test_spare_zeros_skip_the_page_cache_and_appends_read_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let direct = takes_direct_io(dir.path());
    let read = spare_appends_then_tail_reads();
    if direct {
        assert!(
            read >= 256 * 1024,
            "the spare's zeros were in the page cache ({read} bytes read from the disk)"
        );
    }
    struct Allow;
    impl Drop for Allow {
        fn drop(&mut self) {
            segment::REFUSE_DIRECT.store(false, std::sync::atomic::Ordering::Relaxed);
        }
    }
    segment::REFUSE_DIRECT.store(true, std::sync::atomic::Ordering::Relaxed);
    let _allow = Allow;
    let read = spare_appends_then_tail_reads();
    assert_eq!(
        read, 0,
        "with direct writes refused the zeros did not go through the page cache"
    );
}

/// Appends into a prepared segment go past the page cache (`O_DIRECT`,
/// each rewriting the page the log ends in) where the file system takes
/// it: appends of every size around a page, a large one, with and
/// without a sync, replay whole; so do appends after a reopen (the
/// partial last page read back first), and an append that would go past
/// the prepared zeros is written through the page cache instead.
#[test]
fn test_appends_into_a_prepared_segment_are_written_directly() {
    with_prealloc(1 << 20, || {
        let dir = tempfile::tempdir().unwrap();
        let direct = takes_direct_io(dir.path());
        let mut w = Wal::create(dir.path(), b"m").unwrap();
        let mut i = save_until_on_a_spare(&mut w);
        let ent = |i: u64, len: usize| WalEntry {
            index: i,
            term: 2,
            data: (0..len).map(|b| (b as u64 ^ i) as u8).collect(),
        };
        let mut want: Vec<WalEntry> = (1..=i).map(big_ent).collect();
        let sizes = [1, 300, 4095, 4096, 4097, 5000, 0, 100_000, 17];
        for (n, &len) in sizes.iter().enumerate() {
            i += 1;
            let e = ent(i, len);
            if n % 2 == 0 {
                w.save(Some(b"hs1"), std::slice::from_ref(&e)).unwrap();
            } else {
                w.save_opt(None, std::slice::from_ref(&e), false).unwrap();
            }
            want.push(e);
        }
        assert_eq!(w.direct.is_some(), direct, "direct writes where taken");
        drop(w);
        let (mut w, c) = Wal::open(dir.path()).unwrap();
        assert_eq!(c.entries, want);
        assert_eq!(c.hard_state.as_deref(), Some(&b"hs1"[..]));
        assert!(w.zeroed());
        // after the reopen, then on past the prepared zeros (1 MiB)
        let segs = segment_paths(dir.path()).len();
        let mut crossed = false;
        while w.offset < (1 << 20) + 8192 {
            i += 1;
            let e = ent(i, 3000 + (i as usize % 5000));
            w.save(Some(b"hs2"), std::slice::from_ref(&e)).unwrap();
            want.push(e);
            if w.offset > w.zeros_end {
                crossed = true;
                assert!(w.direct.is_none(), "a direct write past the zeros");
            } else {
                assert_eq!(w.direct.is_some(), direct, "after the reopen");
            }
        }
        assert!(crossed);
        assert_eq!(segment_paths(dir.path()).len(), segs, "no cut meanwhile");
        drop(w);
        let (_, c) = Wal::open(dir.path()).unwrap();
        assert_eq!(c.entries, want);
        assert_eq!(c.hard_state.as_deref(), Some(&b"hs2"[..]));
    });
}
