//! The write-ahead log, modelled on etcd's `wal` package.
//!
//! Raft-independent: entries are opaque bytes with an index and a term, the
//! hard state and the snapshot payload are opaque bytes too; the caller
//! encodes raft types.
//!
//! # Files
//!
//! A WAL directory holds segment files named `{seq:016x}-{first_index:016x}.wal`.
//! `seq` counts up from 0 without gaps; `first_index` is one more than the
//! last entry index saved before the segment was cut, so every live entry of
//! the older segments is below it ([`Wal::release_to`] relies on that). A new
//! segment starts with, in order: a crc record (carrying the running crc at
//! the end of the previous segment, which chains the segments), the metadata
//! record, the latest hard state (if any) and the latest snapshot record (if
//! any); so the oldest segments can be deleted and the log still replays. New
//! segments are written as `*.wal.tmp`, fsynced, renamed and the directory
//! fsynced: a visible segment always has a complete header.
//!
//! Segments are preallocated to the segment size (`fallocate`, as etcd
//! does): records are written at the end of the written part, the rest of
//! the file reads as zeros, and an append changes no file size. Zeros
//! where a record header would start mark the end of the log (a header is
//! never all zeros). Where preallocation is impossible (or the disk is too
//! full for it) a segment grows as written.
//!
//! Better still is a segment whose zeros were really written: on ext4 an
//! fdatasync after an append into a `fallocate`d (unwritten) extent also
//! writes the extent tree, into written zeros only the data (a 4–110 KiB
//! append + fdatasync: p50 0.13–0.17 ms instead of 0.26–0.29 ms on this
//! machine). Once a segment that was not prepared has taken 1 MiB or 1000
//! synced saves, or a prepared one is half written, the next one is
//! prepared on a background thread (`spare.wal.tmp`: zeros written
//! and synced 256 KiB at a time, with `O_DIRECT` where the file system
//! takes it, only with four segments' room free; writes into it are
//! padded with zeros to whole pages, so none reads an uncached page); when
//! it is ready the log moves onto it — at once if the current segment was
//! not such a spare (the old one is cut to its written length, as etcd's
//! cut truncates), else when the current one is full. An idle member
//! prepares nothing; an unfinished spare is removed at the next open.
//! A segment reopened with every block of its tail written (`FIEMAP`:
//! no unwritten extent, no hole) is taken for a prepared one. Appends
//! into a prepared segment are written with `O_DIRECT` where the file
//! system takes it, each rewriting the page the log ends in whole
//! ([`segment::Direct`]): the fdatasync after it has no page to write
//! back.
//!
//! # Records
//!
//! `[len u32][type u8][0u8; 3][crc u32][header_crc u32][payload; len]`, all
//! little endian (see [`record`]). `crc` is a running CRC32 (IEEE polynomial,
//! `crc32fast`) continued from the previous record's `crc` over the type byte
//! and the payload, like etcd's chained crc; `header_crc` guards the first 12
//! header bytes so a damaged length is never trusted. Payloads: crc = u32;
//! metadata and hard state = raw bytes; entry = index u64, term u64, data;
//! snapshot = index u64, term u64, payload.
//!
//! # Torn tail versus corruption
//!
//! `save` appends with one `write_all` and one `fdatasync`. A crash during
//! that write can leave the last segment ending in a partial record, or in a
//! record some of whose bytes never reached disk (they read as zeros, or as
//! stale garbage on some file systems), possibly followed by more zeros or
//! garbage where the file was extended but not filled. Such a tail was never
//! acknowledged, so [`Wal::open`] cuts it off (and fsyncs the truncation),
//! preallocates the segment again and logs a warning. A tail of only zeros
//! is simply the unwritten part of the segment, not a repair. The rule, applied only to the **last** segment: a damaged
//! record (header crc or record crc mismatch, or cut short by EOF) is a torn
//! tail if **no valid record header starts anywhere after it** (a header is
//! valid when its own crc matches; zeros never are). If one does, records
//! were written after the damaged one, so the damaged one had been written
//! completely and may have been acknowledged: that is corruption, and `open`
//! refuses with an error rather than silently dropping data.
//!
//! Worked example, last segment `R0 R1 R2 R3` (R0 = crc record, R1 = metadata,
//! R2, R3 entries):
//!
//! * file ends 10 bytes into R3's payload -> torn: truncated to the end of R2;
//! * R3 complete, then zeros to the end -> the log ends after R3 (no repair);
//! * R3 complete, then 40 random bytes -> torn: the first 16 bytes after R3
//!   fail their header crc and no valid header follows; truncated after R3;
//! * a byte of R3's payload flipped, nothing after R3 -> torn: truncated to
//!   the end of R2 (indistinguishable from a write that never reached disk);
//! * a byte of R2's payload (or header) flipped -> error "wal: crc mismatch
//!   in segment ... at offset ..." because R3's valid header follows;
//! * the same flip in any segment but the last -> error, as are a missing
//!   `seq`, a crc record that does not carry the previous segment's crc, and
//!   a non-last segment cut short.
//!
//! One limitation follows from the rule: a multi-page write where a later
//! page reached disk but an earlier one did not is reported as corruption,
//! not repaired (etcd's zero-sector heuristic is not implemented). Also, an
//! entry whose data happens to contain a valid record header can make a real
//! torn tail look like corruption (refusal, never silent loss).

mod record;
mod segment;
#[cfg(test)]
mod tests;

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use record::{Encoder, Record};
use segment::{io_err, SegmentName};

/// Default size after which a new segment is cut: 64 MiB, as in etcd.
pub const DEFAULT_SEGMENT_SIZE: u64 = 64 * 1024 * 1024;

/// Bytes appended to a segment, or synced saves into it, before the next
/// one is prepared (an idle member prepares none).
const SPARE_AFTER: u64 = 1024 * 1024;
const SPARE_AFTER_SYNCS: u64 = 1000;

/// One log entry. `data` is the caller's encoding of the raft entry.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WalEntry {
    pub index: u64,
    pub term: u64,
    pub data: Vec<u8>,
}

/// A snapshot marker. `payload` is opaque (e.g. the encoded conf state).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WalSnapshot {
    pub index: u64,
    pub term: u64,
    pub payload: Vec<u8>,
}

/// Everything [`Wal::open`] replayed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WalContents {
    /// What `create()` was given.
    pub metadata: Vec<u8>,
    /// The last snapshot record saved.
    pub snapshot: Option<WalSnapshot>,
    /// The last hard state saved.
    pub hard_state: Option<Vec<u8>>,
    /// Entries with index > snapshot index (all if no snapshot), in index
    /// order, after applying overwrites.
    pub entries: Vec<WalEntry>,
}

#[derive(Debug, thiserror::Error)]
pub enum WalError {
    #[error("wal: {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("wal: a write-ahead log already exists in {0}")]
    AlreadyExists(PathBuf),
    #[error("wal: no write-ahead log found in {0}")]
    NotFound(PathBuf),
    #[error("wal: crc mismatch in segment {segment} at offset {offset} ({what})")]
    CrcMismatch {
        segment: String,
        offset: u64,
        what: &'static str,
    },
    #[error("wal: crc chain broken at segment {segment}: previous segment ends with crc {expected:#010x}, segment carries {found:#010x}")]
    ChainMismatch {
        segment: String,
        expected: u32,
        found: u32,
    },
    #[error("wal: unexpected end of segment {segment} at offset {offset}")]
    UnexpectedEof { segment: String, offset: u64 },
    #[error("wal: malformed record in segment {segment} at offset {offset}: {reason}")]
    Malformed {
        segment: String,
        offset: u64,
        reason: &'static str,
    },
    #[error("wal: segment sequence has a gap: expected seq {expected:#x}, found {found}")]
    MissingSegment { expected: u64, found: String },
    #[error("wal: segment {segment} has no {what} record")]
    MissingRecord { segment: String, what: &'static str },
    #[error("wal: entry {found} follows entry {after}: records are missing from the log (refusing to start on a damaged WAL)")]
    IndexGap { after: u64, found: u64 },
    #[error("wal: conflicting metadata in segment {segment}")]
    MetadataConflict { segment: String },
    #[error("wal: record of {len} bytes is too large")]
    RecordTooLarge { len: usize },
    #[error("wal: log is unusable after an earlier write or sync failure; reopen it")]
    Failed,
}

pub type Result<T> = std::result::Result<T, WalError>;

#[derive(Debug, Clone)]
struct SegmentInfo {
    name: SegmentName,
    /// Smallest snapshot index recorded in this segment (header or body).
    min_snapshot: Option<u64>,
}

/// An open write-ahead log, positioned for appending to its last segment.
///
/// Not internally synchronised: the owner (the raft loop) calls it from one
/// thread. Only one process may open a directory at a time; this is not
/// enforced with a file lock.
#[derive(Debug)]
pub struct Wal {
    dir: PathBuf,
    metadata: Vec<u8>,
    /// All segments on disk, oldest first; the last one is `file`.
    segments: Vec<SegmentInfo>,
    file: File,
    /// End of the written part of the last segment (the file beyond it is
    /// preallocated zeros).
    offset: u64,
    enc: Encoder,
    /// Index of the last entry saved (or of the snapshot, if higher).
    last_index: u64,
    hard_state: Option<Vec<u8>>,
    snapshot: Option<WalSnapshot>,
    segment_size: u64,
    sync_count: u64,
    /// The last save was written without an fdatasync.
    unsynced: bool,
    /// `--unsafe-no-fsync`: no fdatasync at all (etcd's `unsafeNoSync`).
    no_fsync: bool,
    /// Set after a failed write or sync: the file state is unknown.
    failed: bool,
    /// The next segment, being prepared (zero-filled) in the background.
    spare: Option<segment::Spare>,
    /// Where the current segment's written zeros end (its length) when it
    /// was a prepared spare, else 0 (see [`Wal::zeroed`]): writes into it
    /// are padded to whole pages up to there (`segment::page_pad`).
    zeros_end: u64,
    /// Appends into the current (prepared) segment with `O_DIRECT`, once
    /// the file system took a first direct write ([`segment::Direct`]).
    direct: Option<segment::Direct>,
    /// The current segment is a prepared one whose direct writing is yet
    /// to be tried (at its first append).
    try_direct: bool,
    /// Bytes this handle appended to the current segment, and the synced
    /// saves among those appends.
    appended: u64,
    appended_syncs: u64,
}

impl Wal {
    /// True if `dir` holds at least one segment file.
    pub fn exists(dir: &Path) -> bool {
        segment::list(dir).map(|s| !s.is_empty()).unwrap_or(false)
    }

    /// Creates a new log in `dir` (created if missing) whose segments all
    /// carry `metadata`. Fails if a log already exists there.
    pub fn create(dir: &Path, metadata: &[u8]) -> Result<Wal> {
        if Wal::exists(dir) {
            return Err(WalError::AlreadyExists(dir.to_path_buf()));
        }
        fs::create_dir_all(dir).map_err(io_err(format!("create directory {}", dir.display())))?;
        let mut enc = Encoder::new(0);
        let mut buf = Vec::new();
        enc.crc_record(&mut buf);
        enc.metadata(&mut buf, metadata)?;
        let name = SegmentName {
            seq: 0,
            first_index: 0,
        };
        let (file, syncs) = segment::create(dir, &name, &buf, prealloc_size(DEFAULT_SEGMENT_SIZE))?;
        Ok(Wal {
            dir: dir.to_path_buf(),
            metadata: metadata.to_vec(),
            segments: vec![SegmentInfo {
                name,
                min_snapshot: None,
            }],
            file,
            offset: buf.len() as u64,
            enc,
            last_index: 0,
            hard_state: None,
            snapshot: None,
            segment_size: DEFAULT_SEGMENT_SIZE,
            sync_count: syncs,
            unsynced: false,
            no_fsync: false,
            failed: false,
            spare: None,
            zeros_end: 0,
            direct: None,
            try_direct: false,
            appended: 0,
            appended_syncs: 0,
        })
    }

    /// Replays every segment, repairs a torn tail of the last one (see the
    /// module docs) and returns the log ready to append, with its contents.
    pub fn open(dir: &Path) -> Result<(Wal, WalContents)> {
        let names = segment::list(dir)?;
        if names.is_empty() {
            return Err(WalError::NotFound(dir.to_path_buf()));
        }
        segment::remove_temp_files(dir)?;
        for (i, n) in names.iter().enumerate().skip(1) {
            let expected = names[i - 1].seq.wrapping_add(1);
            if n.seq != expected {
                return Err(WalError::MissingSegment {
                    expected,
                    found: n.file_name(),
                });
            }
        }

        let mut metadata: Option<Vec<u8>> = None;
        let mut entries: Vec<WalEntry> = Vec::new();
        let mut hard_state = None;
        let mut snapshot: Option<WalSnapshot> = None;
        let mut segments = Vec::with_capacity(names.len());
        let mut chain = None;
        let mut sync_count = 0;
        let mut last_end = 0;
        for (i, name) in names.iter().enumerate() {
            let file_name = name.file_name();
            let path = dir.join(&file_name);
            let is_last = i + 1 == names.len();
            let buf = fs::read(&path).map_err(io_err(format!("read {}", path.display())))?;
            let scan = record::scan(&buf, &file_name, chain, is_last)?;
            drop(buf);
            if scan.records.is_empty() {
                return Err(WalError::MissingRecord {
                    segment: file_name,
                    what: "crc",
                });
            }
            let mut min_snapshot: Option<u64> = None;
            let mut seg_metadata = false;
            for rec in scan.records {
                match rec {
                    Record::Crc(_) => {}
                    Record::Metadata(m) => {
                        seg_metadata = true;
                        match &metadata {
                            Some(prev) if *prev != m => {
                                return Err(WalError::MetadataConflict { segment: file_name });
                            }
                            Some(_) => {}
                            None => metadata = Some(m),
                        }
                    }
                    Record::HardState(hs) => hard_state = Some(hs),
                    Record::Snapshot(s) => {
                        min_snapshot = Some(min_snapshot.map_or(s.index, |m| m.min(s.index)));
                        snapshot = Some(s);
                    }
                    Record::Entry(e) => {
                        // Raft overwrite: an index at or below the last one
                        // replaces that entry and everything after it.
                        if entries.last().is_some_and(|l| e.index <= l.index) {
                            let pos = entries.partition_point(|x| x.index < e.index);
                            entries.truncate(pos);
                        }
                        entries.push(e);
                    }
                }
            }
            if !seg_metadata && !is_last {
                return Err(WalError::MissingRecord {
                    segment: file_name,
                    what: "metadata",
                });
            }
            if let Some(reason) = scan.torn {
                let dropped = file_len(&path)?.saturating_sub(scan.end);
                tracing::warn!(
                    segment = %file_name,
                    offset = scan.end,
                    dropped_bytes = dropped,
                    reason,
                    "wal: repairing torn tail of the last segment"
                );
                let f = OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(io_err(format!("open {}", path.display())))?;
                f.set_len(scan.end)
                    .map_err(io_err(format!("truncate {}", path.display())))?;
                f.sync_all()
                    .map_err(io_err(format!("fsync {}", path.display())))?;
                sync_count += 1;
            }
            chain = Some(scan.crc);
            last_end = scan.end;
            segments.push(SegmentInfo {
                name: name.clone(),
                min_snapshot,
            });
        }
        let Some(metadata) = metadata else {
            let segment = names[0].file_name();
            return Err(WalError::MissingRecord {
                segment,
                what: "metadata",
            });
        };

        let last = names.last().map(|n| n.file_name()).unwrap_or_default();
        let path = dir.join(&last);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_err(format!("open {}", path.display())))?;
        // A segment written before preallocation (or whose torn tail was
        // cut) gets its room back.
        segment::preallocate(&file, prealloc_size(DEFAULT_SEGMENT_SIZE), &path);
        // A prepared spare stays one across a restart: its writes are
        // padded, and no early spare replaces it.
        let zeros_end = file
            .metadata()
            .map_or(0, |m| segment::written_zeros_end(&file, last_end, m.len()));

        let snap_index = snapshot.as_ref().map_or(0, |s| s.index);
        let last_index = entries.last().map_or(0, |e| e.index).max(snap_index);
        entries.retain(|e| e.index > snap_index);
        // The log must go on from the snapshot with no hole: a CRC-valid
        // file can still miss records (a segment deleted by hand, a bad
        // copy), and raft would then read wrong terms.
        let mut prev = match (&snapshot, entries.first()) {
            (Some(s), _) => s.index,
            (None, Some(e)) => e.index - 1,
            (None, None) => 0,
        };
        for e in &entries {
            if e.index != prev + 1 {
                return Err(WalError::IndexGap {
                    after: prev,
                    found: e.index,
                });
            }
            prev = e.index;
        }
        let wal = Wal {
            dir: dir.to_path_buf(),
            metadata: metadata.clone(),
            segments,
            file,
            offset: last_end,
            enc: Encoder::new(chain.unwrap_or(0)),
            last_index,
            hard_state: hard_state.clone(),
            snapshot: snapshot.clone(),
            segment_size: DEFAULT_SEGMENT_SIZE,
            sync_count,
            unsynced: false,
            no_fsync: false,
            failed: false,
            spare: None,
            zeros_end,
            direct: None,
            try_direct: zeros_end > 0,
            appended: 0,
            appended_syncs: 0,
        };
        Ok((
            wal,
            WalContents {
                metadata,
                snapshot,
                hard_state,
                entries,
            },
        ))
    }

    /// Appends `entries` then `hard_state` with one write and exactly one
    /// fdatasync (none if both are empty). Afterwards, if the segment has
    /// reached the segment size, cuts a new one (which syncs more).
    ///
    /// An `Err` does not mean nothing reached disk; after a write or sync
    /// failure every further call fails with [`WalError::Failed`].
    pub fn save(&mut self, hard_state: Option<&[u8]>, entries: &[WalEntry]) -> Result<()> {
        self.save_opt(hard_state, entries, true)
    }

    /// [`Wal::save`], with the fdatasync only if `sync` (etcd's `MustSync`:
    /// a hard state whose term and vote did not change, with no entries,
    /// only moved the commit index, which raft keeps volatile). An unsynced
    /// record becomes durable with the next synced save; a crash before it
    /// may leave it torn at the tail, which [`Wal::open`] cuts as usual.
    /// At most one unsynced save is outstanding (the next one syncs even
    /// when `sync` is false), so a crash can tear only the last one or two
    /// writes, as before unsynced saves existed; cutting a segment syncs
    /// the old one first.
    pub fn save_opt(
        &mut self,
        hard_state: Option<&[u8]>,
        entries: &[WalEntry],
        sync: bool,
    ) -> Result<()> {
        self.check_usable()?;
        if hard_state.is_none() && entries.is_empty() {
            return Ok(());
        }
        let mut enc = self.enc.clone();
        let size: usize = entries.iter().map(|e| e.data.len() + 32).sum::<usize>()
            + hard_state.map_or(0, |h| h.len() + 16);
        let mut buf = Vec::with_capacity(size);
        for e in entries {
            enc.entry(&mut buf, e)?;
        }
        if let Some(hs) = hard_state {
            enc.hard_state(&mut buf, hs)?;
        }
        let sync = sync || self.unsynced;
        self.append(&buf, enc, sync)?;
        if let Some(e) = entries.last() {
            self.last_index = e.index;
        }
        if let Some(hs) = hard_state {
            self.hard_state = Some(hs.to_vec());
        }
        self.maybe_cut()
    }

    /// Appends a snapshot record and fdatasyncs.
    pub fn save_snapshot(&mut self, snap: &WalSnapshot) -> Result<()> {
        self.check_usable()?;
        let mut enc = self.enc.clone();
        let mut buf = Vec::with_capacity(snap.payload.len() + 32);
        enc.snapshot(&mut buf, snap)?;
        self.append(&buf, enc, true)?;
        self.last_index = self.last_index.max(snap.index);
        if let Some(seg) = self.segments.last_mut() {
            seg.min_snapshot = Some(seg.min_snapshot.map_or(snap.index, |m| m.min(snap.index)));
        }
        self.snapshot = Some(snap.clone());
        self.maybe_cut()
    }

    /// After an append: cuts a new segment when this one is full, or
    /// early onto a prepared (zero-filled) spare when this one was not
    /// prepared; starts preparing the next spare once a segment that was
    /// not prepared has taken [`SPARE_AFTER`] bytes or
    /// [`SPARE_AFTER_SYNCS`] synced saves (so an idle member writes none),
    /// or once a prepared one is half written (its successor is needed
    /// only when it is full: started after its first MiB, a fresh member
    /// zeroed 128 MiB for a run that wrote 20 MB of log).
    fn maybe_cut(&mut self) -> Result<()> {
        let prealloc = prealloc_size(self.segment_size);
        let busy = if self.zeroed() {
            // (the zeros end at the preallocated length: the segment size,
            // or less in unit tests)
            self.offset >= prealloc / 2
        } else {
            self.appended >= SPARE_AFTER || self.appended_syncs >= SPARE_AFTER_SYNCS
        };
        if prealloc > 0 && self.spare.is_none() && busy {
            self.spare = Some(segment::Spare::start(&self.dir, prealloc));
        }
        let early = !self.zeroed() && self.spare.as_mut().is_some_and(|s| s.is_ready());
        if self.offset >= self.segment_size || early {
            self.cut()?;
        }
        Ok(())
    }

    /// Deletes the oldest segment files whose live entries are all below
    /// `index`. Never deletes the segment being written, nor the newest
    /// segment holding a snapshot record with index <= `index`, nor anything
    /// after a segment that must be kept; so if no snapshot <= `index` was
    /// ever saved, nothing is deleted. Purely space reclamation: call it with
    /// the index of the last saved snapshot.
    pub fn release_to(&mut self, index: u64) -> Result<()> {
        self.release_keeping(index, 1)
    }

    /// [`Wal::release_to`], keeping at least `keep` segment files (etcd's
    /// `--max-wals`; 0 keeps every file).
    pub fn release_keeping(&mut self, index: u64, keep: usize) -> Result<()> {
        self.check_usable()?;
        if keep == 0 {
            return Ok(());
        }
        let segs = &self.segments;
        // Without a snapshot at or below `index` the entries are the only
        // copy of the state, so nothing may go.
        let snap_seg = segs
            .iter()
            .rposition(|s| s.min_snapshot.is_some_and(|m| m <= index));
        let keep_from = snap_seg.unwrap_or(0).min(segs.len().saturating_sub(1));
        // Segment j holds only entries < segs[j + 1].first_index.
        let n = (0..keep_from)
            .take_while(|&j| segs[j + 1].name.first_index <= index)
            .count()
            .min(segs.len().saturating_sub(keep));
        if n == 0 {
            return Ok(());
        }
        for (removed, seg) in self.segments[..n].iter().enumerate() {
            let path = self.dir.join(seg.name.file_name());
            if let Err(e) = fs::remove_file(&path) {
                self.segments.drain(..removed);
                return Err(io_err(format!("remove {}", path.display()))(e));
            }
        }
        self.segments.drain(..n);
        segment::sync_dir(&self.dir)?;
        self.sync_count += 1;
        Ok(())
    }

    /// Size in bytes after which `save` cuts a new segment.
    pub fn set_segment_size(&mut self, bytes: u64) {
        self.segment_size = bytes;
    }

    /// Whether the current segment was a prepared spare (its zeros are
    /// written).
    fn zeroed(&self) -> bool {
        self.zeros_end > 0
    }

    /// Number of fsync/fdatasync calls this handle has issued (saves, segment
    /// cuts, directory syncs, torn-tail repair).
    pub fn sync_count(&self) -> u64 {
        self.sync_count
    }

    fn check_usable(&self) -> Result<()> {
        if self.failed {
            Err(WalError::Failed)
        } else {
            Ok(())
        }
    }

    /// Writes `buf` at the end of the log, then fdatasyncs if `sync`.
    fn append(&mut self, buf: &[u8], enc: Encoder, sync: bool) -> Result<()> {
        // error messages are formatted only on error (formatting the
        // segment's name for both calls was 6 % of a lone put's
        // instructions)
        if std::mem::take(&mut self.try_direct) {
            self.direct = segment::Direct::start(&self.file, self.offset, self.zeros_end);
        }
        let res = match &mut self.direct {
            Some(d) if segment::Direct::fits(self.offset, buf.len(), self.zeros_end) => {
                d.write(&self.file, buf, self.offset)
            }
            // past the prepared zeros (the segment's last append): through
            // the page cache from here on
            Some(_) => {
                self.direct = None;
                segment::Direct::stop(&self.file).and_then(|()| self.write_buffered(buf))
            }
            None => self.write_buffered(buf),
        };
        let res = res.map_err(|e| io_err(format!("write {}", self.current_name()))(e));
        let res = res.and_then(|()| if sync { self.sync_file() } else { Ok(()) });
        if res.is_err() {
            self.failed = true;
        }
        res?;
        self.offset += buf.len() as u64;
        self.appended += buf.len() as u64;
        self.appended_syncs += sync as u64;
        self.enc = enc;
        self.unsynced = !sync;
        Ok(())
    }

    /// Writes `buf` at the end of the log through the page cache (into a
    /// prepared segment padded to its page's end: `segment::page_pad`).
    fn write_buffered(&self, buf: &[u8]) -> std::io::Result<()> {
        if self.zeroed() {
            let pad = segment::page_pad(self.offset + buf.len() as u64, self.zeros_end);
            segment::write_padded(&self.file, buf, pad, self.offset)
        } else {
            self.file.write_all_at(buf, self.offset)
        }
    }

    /// `--unsafe-no-fsync`: from now on nothing is fdatasynced (a crash or
    /// power loss loses what the disk had not written by itself).
    pub fn set_unsafe_no_fsync(&mut self, on: bool) {
        self.no_fsync = on;
    }

    /// fdatasyncs the current segment (counted in `sync_count`).
    fn sync_file(&mut self) -> Result<()> {
        if self.no_fsync {
            return Ok(());
        }
        self.sync_count += 1;
        self.file
            .sync_data()
            .map_err(|e| io_err(format!("fdatasync {}", self.current_name()))(e))
    }

    fn current_name(&self) -> String {
        self.segments
            .last()
            .map(|s| s.name.file_name())
            .unwrap_or_default()
    }

    /// Starts a new segment: crc record, metadata, latest hard state and
    /// latest snapshot. On failure the log is marked unusable.
    fn cut(&mut self) -> Result<()> {
        let res = self.try_cut();
        if res.is_err() {
            self.failed = true;
        }
        res
    }

    fn try_cut(&mut self) -> Result<()> {
        if self.unsynced {
            // the new segment's crc record chains over the old segment's
            // last record: that record must be durable first (etcd's cut
            // syncs the old tail too)
            self.sync_file()?;
            self.unsynced = false;
        }
        let seq = self.segments.last().map_or(0, |s| s.name.seq + 1);
        let name = SegmentName {
            seq,
            first_index: self.last_index.saturating_add(1),
        };
        let mut enc = self.enc.clone();
        let mut buf = Vec::new();
        enc.crc_record(&mut buf);
        enc.metadata(&mut buf, &self.metadata)?;
        if let Some(hs) = &self.hard_state {
            enc.hard_state(&mut buf, hs)?;
        }
        if let Some(s) = &self.snapshot {
            enc.snapshot(&mut buf, s)?;
        }
        // An early cut leaves the old segment's preallocated tail: cut it
        // off (as etcd's cut truncates), so it takes no disk.
        let len = self
            .file
            .metadata()
            .map_err(io_err(format!("stat {}", self.current_name())))?
            .len();
        if len > self.offset {
            self.file
                .set_len(self.offset)
                .and_then(|()| self.file.sync_data())
                .map_err(io_err(format!("truncate {}", self.current_name())))?;
            self.sync_count += 1;
        }
        let spare = self.spare.as_mut().and_then(|s| s.take());
        let (file, syncs, zeros_end) = match spare {
            Some(f) => {
                let (syncs, len) = segment::install_spare(&self.dir, &f, &name, &buf)?;
                (f, syncs, len)
            }
            None => {
                let prealloc = prealloc_size(self.segment_size);
                let (f, syncs) = segment::create(&self.dir, &name, &buf, prealloc)?;
                (f, syncs, 0)
            }
        };
        if self.spare.as_mut().is_some_and(|s| s.finished()) {
            self.spare = None;
        }
        self.sync_count += syncs;
        self.file = file;
        self.zeros_end = zeros_end;
        self.direct = None;
        self.try_direct = zeros_end > 0;
        self.appended = 0;
        self.appended_syncs = 0;
        self.offset = buf.len() as u64;
        self.enc = enc;
        let min_snapshot = self.snapshot.as_ref().map(|s| s.index);
        self.segments.push(SegmentInfo { name, min_snapshot });
        Ok(())
    }
}

/// How far a new segment is preallocated: the segment size. Unit tests
/// choose per thread (0 = grow as written, the layout most of them
/// inspect by file length).
#[cfg(not(test))]
fn prealloc_size(segment_size: u64) -> u64 {
    segment_size
}

#[cfg(test)]
thread_local! {
    pub(crate) static TEST_PREALLOC: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

#[cfg(test)]
fn prealloc_size(segment_size: u64) -> u64 {
    TEST_PREALLOC
        .with(|p| p.get())
        .map_or(0, |p| p.min(segment_size))
}

fn file_len(path: &Path) -> Result<u64> {
    fs::metadata(path)
        .map(|m| m.len())
        .map_err(io_err(format!("stat {}", path.display())))
}
