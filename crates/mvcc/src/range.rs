//! The Range logic shared by readers and the write batch: etcd's
//! `storeTxnRead.rangeKeys` plus the filtering, sorting and limiting of
//! `applierV3backend.Range`.
//!
//! It runs in two phases so that readers hold the index lock only for the
//! first: [`plan`] resolves the revision and picks revisions from the index,
//! [`fetch`] reads and post-processes the values.

use std::cmp::Ordering;

use prost::Message;
use retcd_api::etcdserverpb::range_request::{SortOrder, SortTarget};
use retcd_api::etcdserverpb::{RangeRequest, RangeResponse, ResponseHeader};
use retcd_api::mvccpb::KeyValue;

use crate::index::{KeyRange, TreeIndex};
use crate::memtable::{RowSource, RowsAt};
use crate::revision::Revision;
use crate::MvccError;

/// What [`plan`] found in the index.
#[derive(Debug)]
pub(crate) struct RangePlan {
    /// Revisions to fetch, in key order (already cut to the fetch limit).
    revs: Vec<Revision>,
    /// With `sized`: each of `revs`' stored row size, `u32::MAX` where the
    /// index does not know it.
    lens: Vec<u32>,
    /// Number of keys matching before any limit (etcd's `count`).
    total: usize,
    /// The store revision the response reports.
    header_rev: i64,
}

/// Whether the request needs every matching key before limiting: sorting or
/// revision filters make etcd fetch everything, then cut.
fn fetch_all(req: &RangeRequest) -> bool {
    req.sort_order != SortOrder::None as i32 || has_revision_filter(req)
}

/// etcd's `IsDefaultOrdering`: no sort order, or ascending by key. What
/// `RangeStream` accepts; not that the answer is in key order (see
/// [`lists_in_key_order`]).
pub fn is_default_ordering(req: &RangeRequest) -> bool {
    req.sort_order == SortOrder::None as i32
        || (req.sort_target == SortTarget::Key as i32 && req.sort_order == SortOrder::Ascend as i32)
}

/// Whether a Range's answer lists its keys in the index's order: sorted by
/// key, ascending or with no order given. With no order and another target
/// etcd sorts ascending by that target (as [`fetch`] does).
fn lists_in_key_order(req: &RangeRequest) -> bool {
    req.sort_target == SortTarget::Key as i32
        && (req.sort_order == SortOrder::None as i32 || req.sort_order == SortOrder::Ascend as i32)
}

/// etcd's check of a Range in a Txn's chosen branch, before any of the
/// txn runs (`checkRequestRange`): revision 0 is the current one; any
/// other must not be past `cur_rev` nor below `compact_rev` (-1 when never
/// compacted). Unlike a unary Range, where any revision below 1 reads the
/// current one, a negative revision here is compacted once it is below
/// `compact_rev` (always from -2 on).
pub(crate) fn check_txn_range(
    r: &RangeRequest,
    cur_rev: i64,
    compact_rev: i64,
) -> Result<(), MvccError> {
    if r.revision == 0 {
        Ok(())
    } else if r.revision > cur_rev {
        Err(MvccError::FutureRev)
    } else if r.revision < compact_rev {
        Err(MvccError::Compacted)
    } else {
        Ok(())
    }
}

/// Whether the request has a min/max mod/create revision filter.
pub fn has_revision_filter(req: &RangeRequest) -> bool {
    req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0
}

/// Checks the requested revision against `cur_rev` / `compact_rev` and picks
/// the revisions to read. `compact_rev` is -1 when never compacted. Without
/// `with_count` the response's `count` is not the range's (a streamed
/// chunk's caller counts once, at the end). With `sized` the plan also
/// carries the rows' sizes the index knows.
pub(crate) fn plan(
    index: &TreeIndex,
    req: &RangeRequest,
    cur_rev: i64,
    compact_rev: i64,
    with_count: bool,
    sized: bool,
) -> Result<RangePlan, MvccError> {
    let mut rev = req.revision;
    if rev > cur_rev {
        return Err(MvccError::FutureRev);
    }
    if rev <= 0 {
        rev = cur_rev;
    }
    if rev < compact_rev {
        return Err(MvccError::Compacted);
    }
    let range = KeyRange::new(&req.key, &req.range_end);
    if req.count_only {
        let total = index.count_revisions(range, rev);
        return Ok(RangePlan {
            revs: Vec::new(),
            lens: Vec::new(),
            total,
            header_rev: cur_rev,
        });
    }
    // etcd asks the store for limit+1 to learn `more`, or everything when it
    // has to sort or filter first. Only those are collected; the rest of the
    // range is counted (a page of a long list does not copy the list's
    // revisions), or not even visited when the caller needs no count.
    let fetch = if fetch_all(req) || req.limit <= 0 {
        0
    } else {
        usize::try_from(req.limit.saturating_add(1)).unwrap_or(usize::MAX)
    };
    let mut lens = Vec::new();
    let (revs, total) =
        index.revisions_capped(range, rev, fetch, with_count, sized.then_some(&mut lens));
    Ok(RangePlan {
        revs,
        lens,
        total,
        header_rev: cur_rev,
    })
}

/// Decodes a row as `M` (`KeyValue`, or `KeyValueHead` to skip the value).
pub(crate) fn decode_row<M: Message + Default>(row: &[u8], rev: Revision) -> Result<M, MvccError> {
    M::decode(row).map_err(|e| MvccError::Backend(format!("cannot decode KeyValue at {rev}: {e}")))
}

/// A row's `KeyValue` without its value, the key borrowed from the row.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct RowHead<'a> {
    pub key: &'a [u8],
    pub create_revision: i64,
    pub version: i64,
    pub lease: i64,
}

/// Reads a row's head without allocating: the index rebuild and the
/// lessor's reattachment read every row at start, and a key copied out per
/// row (then dropped) left the index's own allocations on half-empty pages
/// (RSS after restarting a 1M-key store 1.5× the RSS before it).
/// Accepts what prost's decoding of `KeyValueHead` accepts (fields in any
/// order, the last one of a number wins, unknown fields skipped).
pub(crate) fn decode_row_head(row: &[u8], rev: Revision) -> Result<RowHead<'_>, MvccError> {
    use prost::encoding::{decode_key, decode_varint, skip_field, DecodeContext, WireType};
    let bad = |why: &dyn std::fmt::Display| {
        MvccError::Backend(format!("cannot decode KeyValue at {rev}: {why}"))
    };
    let mut head = RowHead::default();
    let mut buf = row;
    while !buf.is_empty() {
        let (tag, wire) = decode_key(&mut buf).map_err(|e| bad(&e))?;
        let int = |buf: &mut &[u8]| -> Result<i64, MvccError> {
            if wire != WireType::Varint {
                return Err(bad(&"invalid wire type"));
            }
            decode_varint(buf).map(|v| v as i64).map_err(|e| bad(&e))
        };
        match tag {
            1 => {
                if wire != WireType::LengthDelimited {
                    return Err(bad(&"invalid wire type"));
                }
                let len = decode_varint(&mut buf).map_err(|e| bad(&e))?;
                if len > buf.len() as u64 {
                    return Err(bad(&"buffer underflow"));
                }
                let (key, rest) = buf.split_at(len as usize);
                head.key = key;
                buf = rest;
            }
            2 => head.create_revision = int(&mut buf)?,
            4 => head.version = int(&mut buf)?,
            6 => head.lease = int(&mut buf)?,
            _ => skip_field(wire, tag, &mut buf, DecodeContext::default()).map_err(|e| bad(&e))?,
        }
    }
    Ok(head)
}

/// Reads the value stored at `rev`.
pub(crate) fn read_kv(rows: &impl RowSource, rev: Revision) -> Result<KeyValue, MvccError> {
    decode_row(rows.row(rev)?.value(), rev)
}

/// Bytes a length-delimited field of `len` bytes takes in its message.
fn field_len(len: usize) -> usize {
    1 + prost::encoding::encoded_len_varint(len as u64) + len
}

fn cmp_by(target: SortTarget, a: &KeyValue, b: &KeyValue) -> Ordering {
    match target {
        SortTarget::Key => a.key.cmp(&b.key),
        SortTarget::Version => a.version.cmp(&b.version),
        SortTarget::Create => a.create_revision.cmp(&b.create_revision),
        SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
        SortTarget::Value => a.value.cmp(&b.value),
    }
}

/// Reads the planned revisions and applies etcd's filters, sort, limit and
/// `keys_only`. `count` stays the number of keys matching the range before
/// the revision filters, as in etcd.
///
/// `max_bytes` bounds the values read (their stored size, which is their
/// encoded size in the response): past it the read stops holding values and
/// only sums the sizes, and the range fails with
/// [`MvccError::ResponseTooLarge`] instead of building a response that big.
/// Only reads served outside raft pass a bound; the apply's always fits.
pub(crate) fn fetch(
    rows: &impl RowSource,
    req: &RangeRequest,
    plan: RangePlan,
    max_bytes: usize,
) -> Result<RangeResponse, MvccError> {
    let mut kvs = Vec::with_capacity(plan.revs.len());
    let mut size = 0usize;
    for rev in &plan.revs {
        if size <= max_bytes {
            let kv = read_kv(rows, *rev)?;
            let mut len = kv.encoded_len();
            if req.keys_only && !kv.value.is_empty() {
                len -= field_len(kv.value.len());
            }
            size = size.saturating_add(field_len(len));
            kvs.push(kv);
        } else {
            // over the bound: only the size of the rest, for the error
            size = size.saturating_add(field_len(rows.row(*rev)?.value().len()));
        }
    }
    if size > max_bytes {
        return Err(MvccError::ResponseTooLarge {
            size,
            max: max_bytes,
        });
    }
    if req.max_mod_revision != 0 {
        kvs.retain(|kv| kv.mod_revision <= req.max_mod_revision);
    }
    if req.min_mod_revision != 0 {
        kvs.retain(|kv| kv.mod_revision >= req.min_mod_revision);
    }
    if req.max_create_revision != 0 {
        kvs.retain(|kv| kv.create_revision <= req.max_create_revision);
    }
    if req.min_create_revision != 0 {
        kvs.retain(|kv| kv.create_revision >= req.min_create_revision);
    }
    let target = SortTarget::try_from(req.sort_target).unwrap_or(SortTarget::Key);
    let mut order = SortOrder::try_from(req.sort_order).unwrap_or(SortOrder::None);
    if target != SortTarget::Key && order == SortOrder::None {
        // results come in key order; any other target defaults to ascending
        order = SortOrder::Ascend;
    }
    // Stable sorts: ties keep key order (Go's sort.Sort leaves it unspecified).
    match order {
        SortOrder::None => {}
        SortOrder::Ascend => kvs.sort_by(|a, b| cmp_by(target, a, b)),
        SortOrder::Descend => kvs.sort_by(|a, b| cmp_by(target, b, a)),
    }
    let mut more = false;
    if req.limit > 0 && kvs.len() > req.limit as usize {
        kvs.truncate(req.limit as usize);
        more = true;
    }
    if req.keys_only {
        for kv in &mut kvs {
            kv.value.clear();
        }
    }
    Ok(RangeResponse {
        header: Some(ResponseHeader {
            revision: plan.header_rev,
            ..Default::default()
        }),
        kvs,
        more,
        count: plan.total as i64,
    })
}

/// Whether [`KvStore::range_encoded`](crate::KvStore::range_encoded) can
/// answer `req`: listed in key order, no revision filter, values wanted,
/// keys listed. Its kvs are then the stored rows in index order, so the
/// response can be written from the rows without decoding them.
pub fn is_plain_range(req: &RangeRequest) -> bool {
    lists_in_key_order(req) && !has_revision_filter(req) && !req.keys_only && !req.count_only
}

/// A plain Range's answer, not yet read: the revisions it lists and the
/// snapshot they are read from, with the encoded size of its `kvs` known
/// (the stored rows' lengths: from the index for keys read at their newest
/// revision, from a first pass over the same snapshot for the others). The
/// caller writes the response's prefix with [`EncodedRange::kvs_len`], then
/// the kvs a piece at a time with [`EncodedRange::write_kvs`], so a Range
/// of any size is never in memory whole (etcd builds it whole). The first
/// pass keeps the leading rows it reads, up to a budget, encoded in `head`:
/// those are written from it and not read again.
pub struct EncodedRange {
    at: RowsAt,
    revs: Vec<Revision>,
    /// Each of `revs`' row size, as summed into `kvs_len`: a row read
    /// later must have it, or the response's framing would lie.
    lens: Vec<u32>,
    /// The next of `revs` to read (those before it are in `head`).
    next: usize,
    kvs_len: usize,
    /// The first rows' kvs fields, encoded by the sizing pass.
    head: Vec<u8>,
    /// Bytes of `head` already written.
    head_sent: usize,
    /// The store revision the response reports.
    pub header_rev: i64,
    /// Keys follow the limit (`RangeResponse.more`).
    pub more: bool,
    /// Keys in the range (`RangeResponse.count`).
    pub count: i64,
    /// Rows the sizing pass had to read (their size not in the index).
    rows_sized_by_reading: usize,
}

impl EncodedRange {
    /// Reads the sizes of the planned rows, keeping the first `read_once`
    /// bytes of them encoded; fails with [`MvccError::ResponseTooLarge`]
    /// past `max_bytes`, as [`fetch`].
    pub(crate) fn new(
        at: RowsAt,
        req: &RangeRequest,
        mut plan: RangePlan,
        max_bytes: usize,
        read_once: usize,
    ) -> Result<EncodedRange, MvccError> {
        let mut more = false;
        if req.limit > 0 && plan.revs.len() > req.limit as usize {
            plan.revs.truncate(req.limit as usize);
            more = true;
        }
        let mut lens = plan.lens;
        lens.resize(plan.revs.len(), u32::MAX);
        let mut kvs_len = 0usize;
        let mut head = Vec::new();
        let mut next = 0;
        let mut table = None;
        let mut read = 0;
        for (i, rev) in plan.revs.iter().enumerate() {
            if lens[i] != u32::MAX {
                kvs_len = kvs_len.saturating_add(field_len(lens[i] as usize));
                continue;
            }
            let table = match &mut table {
                Some(t) => t,
                None => table.insert(at.open()?),
            };
            let row = table.row(*rev)?;
            let row = row.value();
            read += 1;
            lens[i] = u32::try_from(row.len())
                .map_err(|_| MvccError::Backend(format!("row at {rev} is over 4 GiB")))?;
            kvs_len = kvs_len.saturating_add(field_len(row.len()));
            // only a run from the first row, so the rest follow in order
            if next == i && kvs_len <= read_once {
                encode_kv_field(row, &mut head);
                next += 1;
            }
        }
        drop(table);
        if kvs_len > max_bytes {
            return Err(MvccError::ResponseTooLarge {
                size: kvs_len,
                max: max_bytes,
            });
        }
        Ok(EncodedRange {
            at,
            revs: plan.revs,
            lens,
            next,
            kvs_len,
            head,
            head_sent: 0,
            header_rev: plan.header_rev,
            more,
            count: plan.total as i64,
            rows_sized_by_reading: read,
        })
    }

    /// Rows the sizing pass had to read, their size not in the index
    /// (keys read at an older revision than their newest).
    pub fn rows_sized_by_reading(&self) -> usize {
        self.rows_sized_by_reading
    }

    /// Bytes the `kvs` fields take in the response.
    pub fn kvs_len(&self) -> usize {
        self.kvs_len
    }

    /// Keys listed.
    pub fn len(&self) -> usize {
        self.revs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.revs.is_empty()
    }

    /// Appends the next kvs (field 2 of `RangeResponse`, each its stored
    /// row) until `out` holds at least `target` bytes or none are left;
    /// false once every kv is written.
    pub fn write_kvs(&mut self, out: &mut Vec<u8>, target: usize) -> Result<bool, MvccError> {
        if self.head_sent < self.head.len() && out.len() < target {
            let n = (target - out.len()).min(self.head.len() - self.head_sent);
            out.extend_from_slice(&self.head[self.head_sent..self.head_sent + n]);
            self.head_sent += n;
            if self.head_sent == self.head.len() {
                self.head = Vec::new();
                self.head_sent = 0;
            }
        }
        if self.next < self.revs.len() && out.len() < target {
            let table = self.at.open()?;
            while self.next < self.revs.len() && out.len() < target {
                let rev = self.revs[self.next];
                let row = table.row(rev)?;
                let row = row.value();
                if row.len() != self.lens[self.next] as usize {
                    return Err(MvccError::Backend(format!(
                        "row at {rev} is {} bytes, the index said {}",
                        row.len(),
                        self.lens[self.next]
                    )));
                }
                encode_kv_field(row, out);
                self.next += 1;
            }
        }
        Ok(!self.head.is_empty() || self.next < self.revs.len())
    }
}

/// Field 2 of `RangeResponse` (a kv) around a stored row.
fn encode_kv_field(row: &[u8], out: &mut Vec<u8>) {
    prost::encoding::encode_key(2, prost::encoding::WireType::LengthDelimited, out);
    prost::encoding::encode_varint(row.len() as u64, out);
    out.extend_from_slice(row);
}

#[cfg(test)]
mod tests {
    use super::*;
    use retcd_api::retcdpb::KeyValueHead;

    #[test]
    fn test_row_head_reads_what_prost_reads() {
        let rev = Revision::new(5, 0);
        let rows = [
            KeyValue::default().encode_to_vec(),
            KeyValue {
                key: b"/registry/pods/a".to_vec().into(),
                value: vec![7; 3000].into(),
                create_revision: 3,
                mod_revision: 5,
                version: 2,
                lease: 0x1234_5678_9abc,
            }
            .encode_to_vec(),
            KeyValue {
                key: b"k".to_vec().into(),
                create_revision: -4,
                ..Default::default()
            }
            .encode_to_vec(),
            // fields out of order, a repeated one (the last wins) and an
            // unknown one
            vec![0x20, 9, 0x0a, 1, b'x', 0x20, 3, 0x38, 1, 0x10, 2],
        ];
        for row in rows {
            let want = KeyValueHead::decode(row.as_slice()).unwrap();
            let got = decode_row_head(&row, rev).unwrap();
            assert_eq!(got.key, want.key.as_slice());
            assert_eq!(
                (got.create_revision, got.version, got.lease),
                (want.create_revision, want.version, want.lease)
            );
        }
        // damaged rows are errors, as prost's decoding says
        for bad in [
            &[0x0a, 5, b'a'][..],
            &[0x10][..],
            &[0x0a][..],
            &[0x12, 1][..],
        ] {
            assert!(KeyValueHead::decode(bad).is_err());
            assert!(decode_row_head(bad, rev).is_err(), "{bad:?}");
        }
    }
}
