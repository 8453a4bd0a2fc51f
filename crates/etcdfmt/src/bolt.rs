//! A read-only walker of bbolt files (etcd's backend, `snapshot.db`).
//!
//! bbolt-rs writes files etcd reads, but cannot open the files etcd writes:
//! etcd opens bbolt with `NoFreelistSync`, so its meta page names no
//! freelist and bbolt-rs 1.3.10 refuses it (`PGID_NO_FREE_LIST not
//! currently supported`). Reading needs no freelist at all, so this module
//! walks the pages itself:
//!
//! * pages 0 and 1 are meta pages: magic `0xED0CDAED`, version 2, the page
//!   size, the root bucket's page, the high-water page id and the txid,
//!   sealed by an FNV-1a 64 checksum; the valid one with the higher txid
//!   is the current state;
//! * a page starts with `id u64, flags u16, count u16, overflow u32`; a
//!   branch page's elements are `pos u32, ksize u32, pgid u64`, a leaf's
//!   `flags u32, pos u32, ksize u32, vsize u32` (`pos` counted from the
//!   element); a page with `overflow` n spans n + 1 pages;
//! * a leaf element with flag 1 is a bucket: its value is `root u64,
//!   sequence u64`, and with root 0 an inline page follows.
//!
//! Pages are read with `pread` one at a time, so memory stays at one page
//! (plus its overflow) whatever the file's size. Every offset is checked
//! against the page and the file: a damaged file is an error, never a
//! panic, and a page reached twice in one walk (a cycle) is refused.

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

const MAGIC: u32 = 0xED0C_DAED;
const VERSION: u32 = 2;
const PAGE_HEADER: usize = 16;
const ELEMENT: usize = 16;
const BRANCH: u16 = 0x01;
const LEAF: u16 = 0x02;
const META: u16 = 0x04;
const BUCKET_LEAF: u32 = 0x01;
/// Deeper trees than this are damage (a bbolt tree of 2^64 keys is far
/// shallower).
const MAX_DEPTH: usize = 64;

/// Why a bbolt file cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum BoltError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The file is not a bbolt file or is damaged.
    #[error("invalid database: {0}")]
    Invalid(String),
}

/// A damaged-file error, as a [`BoltError`] or any error made from one.
fn invalid<E: From<BoltError>>(why: impl Into<String>) -> E {
    BoltError::Invalid(why.into()).into()
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// FNV-1a 64, bbolt's meta checksum.
fn fnv1a64(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// One meta page's fields.
#[derive(Debug, Clone, Copy)]
struct Meta {
    page_size: u32,
    root: u64,
    high_water: u64,
    txid: u64,
}

/// The meta page at the start of `page` if it is valid.
fn parse_meta(page: &[u8]) -> Result<Meta, String> {
    if page.len() < PAGE_HEADER + 64 {
        return Err("file too short".into());
    }
    if u16_at(page, 8) & META == 0 {
        return Err("meta page flag missing".into());
    }
    let m = &page[PAGE_HEADER..PAGE_HEADER + 64];
    if u32_at(m, 0) != MAGIC {
        return Err("invalid magic".into());
    }
    if u32_at(m, 4) != VERSION {
        return Err(format!("unsupported version {}", u32_at(m, 4)));
    }
    if fnv1a64(&m[..56]) != u64_at(m, 56) {
        return Err("meta checksum mismatch".into());
    }
    let page_size = u32_at(m, 8);
    if !(512..=1 << 20).contains(&page_size) || !page_size.is_power_of_two() {
        return Err(format!("invalid page size {page_size}"));
    }
    Ok(Meta {
        page_size,
        root: u64_at(m, 16),
        high_water: u64_at(m, 40),
        txid: u64_at(m, 48),
    })
}

/// Where a bucket's tree is: a page, or a page inline in its parent's value.
#[derive(Debug, Clone)]
pub enum BucketRoot {
    Page(u64),
    Inline(Vec<u8>),
}

/// An open bbolt file (read-only; the file is never written or locked).
pub struct BoltReader {
    file: File,
    file_len: u64,
    page_size: u64,
    meta: Meta,
}

impl std::fmt::Debug for BoltReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoltReader")
            .field("page_size", &self.page_size)
            .field("txid", &self.meta.txid)
            .finish()
    }
}

impl BoltReader {
    /// Opens `path` and picks its current meta page.
    pub fn open(path: &Path) -> Result<BoltReader, BoltError> {
        let file = File::open(path)?;
        Self::from_file(file)
    }

    /// As [`BoltReader::open`], for an open file.
    pub fn from_file(file: File) -> Result<BoltReader, BoltError> {
        let file_len = file.metadata()?.len();
        let mut first = vec![0u8; 4096.min(file_len as usize)];
        file.read_exact_at(&mut first, 0)?;
        let m0 = parse_meta(&first);
        // Page 1 sits one page size in: take it from page 0, or when page 0
        // is damaged try the usual sizes (as bbolt does).
        let sizes: Vec<u64> = match &m0 {
            Ok(m) => vec![u64::from(m.page_size)],
            Err(_) => vec![4096, 8192, 16384, 32768, 65536, 1024, 2048, 512],
        };
        let mut m1 = Err("no second meta page".to_string());
        for ps in sizes {
            if ps + (PAGE_HEADER as u64) + 64 > file_len {
                continue;
            }
            let mut buf = vec![0u8; PAGE_HEADER + 64];
            file.read_exact_at(&mut buf, ps)?;
            if let Ok(m) = parse_meta(&buf) {
                if u64::from(m.page_size) == ps {
                    m1 = Ok(m);
                    break;
                }
            }
        }
        let meta = match (m0, m1) {
            (Ok(a), Ok(b)) => {
                if b.txid > a.txid {
                    b
                } else {
                    a
                }
            }
            (Ok(a), Err(_)) => a,
            (Err(_), Ok(b)) => b,
            (Err(e), Err(_)) => return Err(invalid(e)),
        };
        let r = BoltReader {
            file,
            file_len,
            page_size: u64::from(meta.page_size),
            meta,
        };
        if meta.high_water < 2 || meta.root < 2 || meta.root >= meta.high_water {
            return Err(invalid(format!(
                "root page {} outside the {} pages",
                meta.root, meta.high_water
            )));
        }
        if meta.high_water.saturating_mul(r.page_size) > file_len {
            return Err(invalid(format!(
                "file is {file_len} bytes but its meta page says {} pages of {} (truncated?)",
                meta.high_water, r.page_size
            )));
        }
        Ok(r)
    }

    /// The database's size as bbolt reports it (`tx.Size()`): high-water
    /// page id × page size.
    pub fn size(&self) -> u64 {
        self.meta.high_water * self.page_size
    }

    /// The page size.
    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    /// The file's length.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// Reads page `id` with its overflow pages.
    fn page(&self, id: u64) -> Result<Vec<u8>, BoltError> {
        if id < 2 || id >= self.meta.high_water {
            return Err(invalid(format!(
                "page {id} outside the {} pages",
                self.meta.high_water
            )));
        }
        let mut head = [0u8; PAGE_HEADER];
        self.file.read_exact_at(&mut head, id * self.page_size)?;
        let overflow = u64::from(u32_at(&head, 12));
        let end = id.saturating_add(overflow).saturating_add(1);
        if end > self.meta.high_water {
            return Err(invalid(format!(
                "page {id} overflows past the last page ({overflow} overflow pages)"
            )));
        }
        let mut buf = vec![0u8; ((overflow + 1) * self.page_size) as usize];
        self.file.read_exact_at(&mut buf, id * self.page_size)?;
        if u64_at(&buf, 0) != id {
            return Err(invalid(format!(
                "page {id} has id {} in its header",
                u64_at(&buf, 0)
            )));
        }
        Ok(buf)
    }

    /// The top-level buckets, in name order.
    pub fn buckets(&self) -> Result<Vec<(Vec<u8>, BucketRoot)>, BoltError> {
        let mut out = Vec::new();
        self.walk::<BoltError>(&BucketRoot::Page(self.meta.root), &mut |k, v, bucket| {
            match bucket {
                Some(root) => out.push((k.to_vec(), root)),
                None => {
                    return Err(invalid(format!(
                        "key {:?} outside any bucket",
                        String::from_utf8_lossy(k)
                    )))
                }
            }
            let _ = v;
            Ok(())
        })?;
        Ok(out)
    }

    /// Calls `f(key, value, sub_bucket)` for every element of the bucket
    /// at `root`, in key order (`sub_bucket` is Some for a nested bucket,
    /// whose value is then its header).
    /// `f`'s error type is the walk's: a damaged page becomes one through
    /// `From<BoltError>`, and `f` may stop the walk with its own.
    pub fn walk<E: From<BoltError>>(
        &self,
        root: &BucketRoot,
        f: &mut dyn FnMut(&[u8], &[u8], Option<BucketRoot>) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut seen = HashSet::new();
        match root {
            BucketRoot::Page(id) => self.walk_page(*id, 0, &mut seen, f),
            BucketRoot::Inline(page) => {
                // An inline bucket is one leaf page inside the value.
                if page.len() < PAGE_HEADER || u16_at(page, 8) & LEAF == 0 {
                    return Err(invalid("inline bucket is not a leaf page"));
                }
                self.walk_leaf(page, f)
            }
        }
    }

    fn walk_page<E: From<BoltError>>(
        &self,
        id: u64,
        depth: usize,
        seen: &mut HashSet<u64>,
        f: &mut dyn FnMut(&[u8], &[u8], Option<BucketRoot>) -> Result<(), E>,
    ) -> Result<(), E> {
        if depth > MAX_DEPTH {
            return Err(invalid("tree deeper than 64 levels"));
        }
        if !seen.insert(id) {
            return Err(invalid(format!("page {id} is reached twice")));
        }
        let page = self.page(id)?;
        let flags = u16_at(&page, 8);
        if flags & BRANCH != 0 {
            let count = usize::from(u16_at(&page, 10));
            if PAGE_HEADER + count * ELEMENT > page.len() {
                return Err(invalid(format!(
                    "branch page {id}: {count} elements overflow it"
                )));
            }
            let children: Vec<u64> = (0..count)
                .map(|i| u64_at(&page, PAGE_HEADER + i * ELEMENT + 8))
                .collect();
            drop(page);
            for child in children {
                self.walk_page(child, depth + 1, seen, f)?;
            }
            Ok(())
        } else if flags & LEAF != 0 {
            self.walk_leaf(&page, f)
        } else {
            Err(invalid(format!(
                "page {id} has flags {flags:#x}, not a branch or leaf"
            )))
        }
    }

    fn walk_leaf<E: From<BoltError>>(
        &self,
        page: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8], Option<BucketRoot>) -> Result<(), E>,
    ) -> Result<(), E> {
        let count = usize::from(u16_at(page, 10));
        if PAGE_HEADER + count * ELEMENT > page.len() {
            return Err(invalid(format!("leaf page: {count} elements overflow it")));
        }
        for i in 0..count {
            let e = PAGE_HEADER + i * ELEMENT;
            let flags = u32_at(page, e);
            let pos = u32_at(page, e + 4) as usize;
            let ksize = u32_at(page, e + 8) as usize;
            let vsize = u32_at(page, e + 12) as usize;
            let k_start = e.checked_add(pos);
            let k_end = k_start.and_then(|s| s.checked_add(ksize));
            let v_end = k_end.and_then(|s| s.checked_add(vsize));
            let (Some(ks), Some(ke), Some(ve)) = (k_start, k_end, v_end) else {
                return Err(invalid("leaf element offsets overflow"));
            };
            if ve > page.len() {
                return Err(invalid(format!(
                    "leaf element {i} ends at {ve}, past its page of {}",
                    page.len()
                )));
            }
            let (k, v) = (&page[ks..ke], &page[ke..ve]);
            if flags & BUCKET_LEAF != 0 {
                if v.len() < 16 {
                    return Err(invalid("bucket header shorter than 16 bytes"));
                }
                let root = u64_at(v, 0);
                let r = if root == 0 {
                    BucketRoot::Inline(v[16..].to_vec())
                } else {
                    BucketRoot::Page(root)
                };
                f(k, v, Some(r))?;
            } else {
                f(k, v, None)?;
            }
        }
        Ok(())
    }
}
