//! WAL file surgery for crash/corruption tests.
//!
//! The layout relied on is etcd's: segments `<data-dir>/member/wal/*.wal`
//! (names sort in log order), backend at `<data-dir>/member/snap/db`.
//!
//! Inside a segment the helpers understand etcd's record framing — each
//! record is a little-endian u64 length word (low 56 bits: length; if the
//! top bit is set, bits 56..59 give the padding count) followed by the
//! `walpb.Record` protobuf (whose first byte is `0x08`, the `type` tag) and
//! padding to 8 bytes; a zero length word marks the end of the written part
//! of a preallocated segment. They understand retcd's framing too (a 16-byte
//! header, zeros after the last record). When a file parses neither way
//! they fall back to format-agnostic positions: the end of the file and the
//! middle of its non-zero prefix.

use std::fs::{self, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use rand::RngCore;

/// `<data-dir>/member/wal`.
pub fn wal_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("member").join("wal")
}

/// `<data-dir>/member/snap/db`.
pub fn backend_path(data_dir: &Path) -> PathBuf {
    data_dir.join("member").join("snap").join("db")
}

/// The `*.wal` segments, sorted by name (= log order).
pub fn wal_segments(data_dir: &Path) -> Result<Vec<PathBuf>> {
    let dir = wal_dir(data_dir);
    let mut v: Vec<PathBuf> = fs::read_dir(&dir)
        .with_context(|| format!("read {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .collect();
    v.sort();
    if v.is_empty() {
        bail!("no *.wal file in {}", dir.display());
    }
    Ok(v)
}

/// The last segment.
pub fn last_segment(data_dir: &Path) -> Result<PathBuf> {
    Ok(wal_segments(data_dir)?.pop().expect("non-empty"))
}

/// One record frame in a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// Offset of the length word.
    pub offset: usize,
    /// Bytes before the record data (etcd: the 8-byte length word; retcd:
    /// its 16-byte header).
    pub header: usize,
    /// Length of the record data (without padding).
    pub len: usize,
    /// Padding after the data.
    pub pad: usize,
}

impl Frame {
    pub fn end(&self) -> usize {
        self.offset + self.header + self.len + self.pad
    }
}

/// Parses `buf` as etcd's or retcd's record frames (retcd: a 16-byte header
/// `[len u32][type 1..=5][0; 3][crc u32][header crc u32]`, see
/// `crates/storage/src/wal`); both stop at the zeros of a preallocated
/// segment. `None` if neither fits.
pub fn frames(buf: &[u8]) -> Option<Vec<Frame>> {
    etcd_frames(buf).or_else(|| retcd_frames(buf))
}

fn retcd_frames(buf: &[u8]) -> Option<Vec<Frame>> {
    let mut frames = Vec::new();
    let mut off = 0usize;
    while off + 16 <= buf.len() {
        let h = &buf[off..off + 16];
        if h.iter().all(|&b| b == 0) {
            break;
        }
        let len = u32::from_le_bytes(h[0..4].try_into().ok()?) as usize;
        if !(1..=5).contains(&h[4]) || h[5..8] != [0, 0, 0] {
            return None;
        }
        let f = Frame {
            offset: off,
            header: 16,
            len,
            pad: 0,
        };
        if f.end() > buf.len() {
            return None;
        }
        frames.push(f);
        off = f.end();
    }
    if frames.is_empty() {
        None
    } else {
        Some(frames)
    }
}

/// Parses `buf` as etcd record frames; `None` if it does not look like
/// etcd's framing. Stops at a zero length word or the end of `buf`.
pub fn etcd_frames(buf: &[u8]) -> Option<Vec<Frame>> {
    let mut frames = Vec::new();
    let mut off = 0usize;
    while off + 8 <= buf.len() {
        let word = u64::from_le_bytes(buf[off..off + 8].try_into().ok()?);
        if word == 0 {
            break;
        }
        let len = (word & 0x00FF_FFFF_FFFF_FFFF) as usize;
        let pad = if word & (1 << 63) != 0 {
            ((word >> 56) & 0x7) as usize
        } else {
            0
        };
        let f = Frame {
            offset: off,
            header: 8,
            len,
            pad,
        };
        if len == 0 || f.end() > buf.len() || buf[off + 8] != 0x08 || !(len + pad).is_multiple_of(8)
        {
            return None;
        }
        frames.push(f);
        off = f.end();
    }
    if frames.is_empty() {
        None
    } else {
        Some(frames)
    }
}

fn nonzero_prefix_len(buf: &[u8]) -> usize {
    buf.iter()
        .rposition(|&b| b != 0)
        .map(|p| p + 1)
        .unwrap_or(0)
}

/// Simulates a torn write of a last record that was never acknowledged:
/// at the end of the written part writes a length word announcing a 4096-byte
/// record followed by only 37 random bytes (what follows is the file's end,
/// or preallocated zeros — a torn sector). Returns the offset written at.
pub fn tear_tail(segment: &Path) -> Result<u64> {
    let buf = fs::read(segment)?;
    let at = match frames(&buf) {
        Some(frames) => frames.last().expect("non-empty").end(),
        None => buf.len(),
    };
    let mut garbage = vec![0u8; 37];
    rand::rng().fill_bytes(&mut garbage);
    garbage[0] = 0x08;
    let mut f = OpenOptions::new().write(true).open(segment)?;
    f.seek(SeekFrom::Start(at as u64))?;
    f.write_all(&4096u64.to_le_bytes())?;
    f.write_all(&garbage)?;
    f.sync_all()?;
    Ok(at as u64)
}

/// Truncates the segment in the middle of its last record (so the last
/// record is torn and nothing follows it). Returns the new length.
pub fn truncate_last_record(segment: &Path) -> Result<u64> {
    let buf = fs::read(segment)?;
    let new_len = match frames(&buf) {
        Some(frames) => {
            let last = frames.last().expect("non-empty");
            last.offset + last.header + last.len / 2
        }
        None => nonzero_prefix_len(&buf).saturating_sub(3),
    };
    let f = OpenOptions::new().write(true).open(segment)?;
    f.set_len(new_len as u64)?;
    f.sync_all()?;
    Ok(new_len as u64)
}

/// Flips (xor 0xff) one byte in the middle of the data of a record in the
/// middle of the segment — a CRC mismatch that is not at the tail.
/// Returns the offset flipped.
pub fn flip_middle_byte(segment: &Path) -> Result<u64> {
    let mut buf = fs::read(segment)?;
    let at = match frames(&buf) {
        Some(frames) => {
            if frames.len() < 3 {
                bail!("only {} records in {}", frames.len(), segment.display());
            }
            let f = frames[frames.len() / 2];
            f.offset + f.header + f.len / 2
        }
        None => nonzero_prefix_len(&buf) / 2,
    };
    buf[at] ^= 0xFF;
    let mut f = OpenOptions::new().write(true).open(segment)?;
    f.seek(SeekFrom::Start(at as u64))?;
    f.write_all(&buf[at..at + 1])?;
    f.sync_all()?;
    Ok(at as u64)
}
