//! Record framing: encoding records into a buffer and scanning a segment's
//! bytes back into records, deciding between "torn tail" and "corruption".
//!
//! Header layout (16 bytes, all integers little endian):
//!
//! ```text
//! 0..4   payload length (u32)
//! 4      record type (u8): 1 crc, 2 metadata, 3 entry, 4 hard state, 5 snapshot
//! 5..8   reserved, zero
//! 8..12  running crc (u32): for a crc record, the chain value it carries;
//!        otherwise CRC32-IEEE continued from the previous record's crc
//!        over [type byte] ++ payload
//! 12..16 header crc (u32): CRC32-IEEE of bytes 0..12
//! ```
//!
//! The header crc makes the length trustworthy: a corrupt length is caught
//! before it is used, and a length that passed the check is still capped by
//! the bytes actually left in the file.

use super::{WalEntry, WalError, WalSnapshot};

/// Size of a record header in bytes.
pub(crate) const HEADER_LEN: usize = 16;

pub(crate) const TYPE_CRC: u8 = 1;
pub(crate) const TYPE_METADATA: u8 = 2;
pub(crate) const TYPE_ENTRY: u8 = 3;
pub(crate) const TYPE_HARD_STATE: u8 = 4;
pub(crate) const TYPE_SNAPSHOT: u8 = 5;

/// A decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record {
    /// Chain value: the running crc of the previous segment at the cut.
    Crc(u32),
    Metadata(Vec<u8>),
    Entry(WalEntry),
    HardState(Vec<u8>),
    Snapshot(WalSnapshot),
}

/// Appends framed records to a buffer while maintaining the running crc.
/// Cloned before building a batch so that a failed write leaves the
/// committed crc untouched.
#[derive(Debug, Clone)]
pub(crate) struct Encoder {
    crc: u32,
}

impl Encoder {
    pub(crate) fn new(crc: u32) -> Self {
        Encoder { crc }
    }

    /// A crc record carrying the current running crc (first record of every
    /// segment). It does not change the running crc.
    pub(crate) fn crc_record(&mut self, buf: &mut Vec<u8>) {
        let value = self.crc;
        push_header(buf, TYPE_CRC, 4, value);
        buf.extend_from_slice(&value.to_le_bytes());
    }

    pub(crate) fn metadata(&mut self, buf: &mut Vec<u8>, metadata: &[u8]) -> Result<(), WalError> {
        self.record(buf, TYPE_METADATA, &[metadata])
    }

    pub(crate) fn hard_state(&mut self, buf: &mut Vec<u8>, hs: &[u8]) -> Result<(), WalError> {
        self.record(buf, TYPE_HARD_STATE, &[hs])
    }

    pub(crate) fn entry(&mut self, buf: &mut Vec<u8>, e: &WalEntry) -> Result<(), WalError> {
        self.record(
            buf,
            TYPE_ENTRY,
            &[&e.index.to_le_bytes(), &e.term.to_le_bytes(), &e.data],
        )
    }

    pub(crate) fn snapshot(&mut self, buf: &mut Vec<u8>, s: &WalSnapshot) -> Result<(), WalError> {
        self.record(
            buf,
            TYPE_SNAPSHOT,
            &[&s.index.to_le_bytes(), &s.term.to_le_bytes(), &s.payload],
        )
    }

    fn record(&mut self, buf: &mut Vec<u8>, ty: u8, parts: &[&[u8]]) -> Result<(), WalError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let len = u32::try_from(len).map_err(|_| WalError::RecordTooLarge { len })?;
        let crc = chain_crc(self.crc, ty, parts);
        push_header(buf, ty, len, crc);
        for p in parts {
            buf.extend_from_slice(p);
        }
        self.crc = crc;
        Ok(())
    }
}

fn chain_crc(prev: u32, ty: u8, parts: &[&[u8]]) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(prev);
    h.update(&[ty]);
    for p in parts {
        h.update(p);
    }
    h.finalize()
}

fn push_header(buf: &mut Vec<u8>, ty: u8, len: u32, crc: u32) {
    let mut header = [0u8; HEADER_LEN];
    header[0..4].copy_from_slice(&len.to_le_bytes());
    header[4] = ty;
    header[8..12].copy_from_slice(&crc.to_le_bytes());
    let hcrc = crc32fast::hash(&header[0..12]);
    header[12..16].copy_from_slice(&hcrc.to_le_bytes());
    buf.extend_from_slice(&header);
}

/// Result of scanning one segment.
#[derive(Debug)]
pub(crate) struct Scan {
    /// Good records in file order.
    pub records: Vec<Record>,
    /// Offset just past the last good record.
    pub end: u64,
    /// Running crc after the last good record.
    pub crc: u32,
    /// Set when a torn tail was found (only possible with `allow_torn_tail`):
    /// why the bytes from `end` on were rejected.
    pub torn: Option<&'static str>,
}

fn le_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(b);
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    u64::from_le_bytes(a)
}

/// Splits `index u64 | term u64 | rest`.
fn split_index_term(payload: &[u8]) -> Option<(u64, u64, Vec<u8>)> {
    if payload.len() < 16 {
        return None;
    }
    let (it, rest) = payload.split_at(16);
    Some((le_u64(&it[0..8]), le_u64(&it[8..16]), rest.to_vec()))
}

/// True if a valid record header (passing its header crc) starts at any
/// byte offset of `buf`. Zeros never form one. Used to tell a damaged last
/// record (nothing recognisable after it: zeros, or garbage of an unfinished
/// write) from damage in the middle of the log (later records follow).
fn contains_record_header(buf: &[u8]) -> bool {
    buf.windows(HEADER_LEN).any(|h| {
        (TYPE_CRC..=TYPE_SNAPSHOT).contains(&h[4])
            && h[5..8] == [0, 0, 0]
            && crc32fast::hash(&h[0..12]) == le_u32(&h[12..16])
    })
}

/// Scans a whole segment.
///
/// * `prev_chain`: the running crc at the end of the previous segment, which
///   this segment's leading crc record must carry (`None` for the oldest
///   segment on disk, whose predecessor may have been released).
/// * `allow_torn_tail`: true only for the last segment. Then a damaged record
///   is a torn write (reported in `Scan::torn`, not an error) when it is
///   incomplete at EOF, or when no valid record header follows it.
///   Everywhere else damage is an error.
pub(crate) fn scan(
    buf: &[u8],
    segment: &str,
    prev_chain: Option<u32>,
    allow_torn_tail: bool,
) -> Result<Scan, WalError> {
    let mut out = Scan {
        records: Vec::new(),
        end: 0,
        crc: 0,
        torn: None,
    };
    let mut off = 0usize;
    let seg = || segment.to_string();
    loop {
        let rest = buf.get(off..).unwrap_or(&[]);
        // The end of the written part: nothing, or the zeros of a
        // preallocated segment (a record header is never all zeros).
        if rest.first().is_none_or(|&b| b == 0) && rest.iter().all(|&b| b == 0) {
            break;
        }
        // Either returns the torn-tail verdict or the corruption error.
        let tail = |reason: &'static str, err: WalError| -> Result<&'static str, WalError> {
            if allow_torn_tail {
                Ok(reason)
            } else {
                Err(err)
            }
        };
        let Some(header) = rest.get(..HEADER_LEN) else {
            let err = WalError::UnexpectedEof {
                segment: seg(),
                offset: off as u64,
            };
            out.torn = Some(tail("partial record header at end of file", err)?);
            break;
        };
        let body = rest.get(HEADER_LEN..).unwrap_or(&[]);
        if crc32fast::hash(&header[0..12]) != le_u32(&header[12..16]) {
            let err = WalError::CrcMismatch {
                segment: seg(),
                offset: off as u64,
                what: "record header",
            };
            if !contains_record_header(rest.get(1..).unwrap_or(&[])) {
                out.torn = Some(tail(
                    "damaged record header, nothing recognisable after it",
                    err,
                )?);
                break;
            }
            return Err(err);
        }
        let len = le_u32(&header[0..4]) as usize;
        let ty = header[4];
        let stored_crc = le_u32(&header[8..12]);
        if header[5..8] != [0, 0, 0] {
            return Err(malformed(
                segment,
                off,
                "reserved header bytes are not zero",
            ));
        }
        let Some(payload) = body.get(..len) else {
            let err = WalError::UnexpectedEof {
                segment: seg(),
                offset: off as u64,
            };
            out.torn = Some(tail("partial record at end of file", err)?);
            break;
        };
        let after = body.get(len..).unwrap_or(&[]);
        let first = out.records.is_empty();

        let record = if ty == TYPE_CRC {
            if !first {
                return Err(malformed(
                    segment,
                    off,
                    "crc record in the middle of a segment",
                ));
            }
            if payload.len() != 4 || le_u32(payload) != stored_crc {
                let err = WalError::CrcMismatch {
                    segment: seg(),
                    offset: off as u64,
                    what: "crc record",
                };
                if !contains_record_header(after) {
                    out.torn = Some(tail(
                        "damaged crc record and nothing recognisable after it",
                        err,
                    )?);
                    break;
                }
                return Err(err);
            }
            if let Some(expected) = prev_chain {
                if stored_crc != expected {
                    return Err(WalError::ChainMismatch {
                        segment: seg(),
                        expected,
                        found: stored_crc,
                    });
                }
            }
            out.crc = stored_crc;
            Record::Crc(stored_crc)
        } else {
            if first {
                return Err(malformed(
                    segment,
                    off,
                    "segment does not start with a crc record",
                ));
            }
            if chain_crc(out.crc, ty, &[payload]) != stored_crc {
                let err = WalError::CrcMismatch {
                    segment: seg(),
                    offset: off as u64,
                    what: "record",
                };
                if !contains_record_header(after) {
                    out.torn = Some(tail(
                        "last record fails its crc, nothing recognisable follows",
                        err,
                    )?);
                    break;
                }
                return Err(err);
            }
            out.crc = stored_crc;
            match ty {
                TYPE_METADATA => Record::Metadata(payload.to_vec()),
                TYPE_HARD_STATE => Record::HardState(payload.to_vec()),
                TYPE_ENTRY => {
                    let (index, term, data) = split_index_term(payload).ok_or_else(|| {
                        malformed(segment, off, "entry record shorter than 16 bytes")
                    })?;
                    Record::Entry(WalEntry { index, term, data })
                }
                TYPE_SNAPSHOT => {
                    let (index, term, payload) = split_index_term(payload).ok_or_else(|| {
                        malformed(segment, off, "snapshot record shorter than 16 bytes")
                    })?;
                    Record::Snapshot(WalSnapshot {
                        index,
                        term,
                        payload,
                    })
                }
                _ => return Err(malformed(segment, off, "unknown record type")),
            }
        };
        out.records.push(record);
        off += HEADER_LEN + len;
        out.end = off as u64;
    }
    Ok(out)
}

fn malformed(segment: &str, offset: usize, reason: &'static str) -> WalError {
    WalError::Malformed {
        segment: segment.to_string(),
        offset: offset as u64,
        reason,
    }
}
