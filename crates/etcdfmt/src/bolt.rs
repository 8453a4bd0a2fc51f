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
//!   sealed by an FNV-1a 64 checksum (0: none); the valid one with the
//!   higher txid is the current state (the page header's flags are not
//!   looked at, as bbolt does not);
//! * a page starts with `id u64, flags u16, count u16, overflow u32`; a
//!   branch page's elements are `pos u32, ksize u32, pgid u64`, a leaf's
//!   `flags u32, pos u32, ksize u32, vsize u32` (`pos` counted from the
//!   element); a page with `overflow` n spans n + 1 pages;
//! * a leaf element with flag 1 is a bucket: its value is `root u64,
//!   sequence u64`, and with root 0 an inline page follows.
//!
//! Pages are read with `pread` one at a time, so memory stays at one page
//! (plus its overflow) whatever the file's size. What is read is what
//! bbolt 1.3.6 reads through its memory map of the file (etcdutl is held
//! to it by `tests/tests/etcdutl_random_differential.rs`): a file shorter
//! than its pages reads if the missing pages are never reached (the last,
//! partial memory page reads as zeros past the end), a key or value
//! running past its page reads the bytes that follow, a page header's id
//! is only checked against the high-water mark, a bucket is looked up as
//! bbolt's cursor seeks it ([`BoltReader::root_bucket`]). Every offset is
//! checked against the file: where bbolt would fault, a damaged file is
//! an error, never a panic, and a page reached twice in one walk (a
//! cycle) is refused.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

const MAGIC: u32 = 0xED0C_DAED;
const VERSION: u32 = 2;
const PAGE_HEADER: usize = 16;
/// The memory page size bbolt's map of the file is made of.
const OS_PAGE: u64 = 4096;
const ELEMENT: usize = 16;
const BRANCH: u16 = 0x01;
const LEAF: u16 = 0x02;
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

/// Go's `sort.Search`: the lowest index in `0..n` where `f` is true,
/// found by halving as Go does it (so the same elements are looked at
/// when `f` is not monotone).
fn go_sort_search(n: usize, mut f: impl FnMut(usize) -> bool) -> usize {
    let (mut i, mut j) = (0, n);
    while i < j {
        let h = (i + j) / 2;
        if !f(h) {
            i = h + 1;
        } else {
            j = h;
        }
    }
    i
}

/// FNV-1a 64, bbolt's meta checksum.
pub fn fnv1a64(data: &[u8]) -> u64 {
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
    // bbolt's `meta.validate`: the page header's flags are not looked at,
    // and a checksum of 0 is taken as none.
    let m = &page[PAGE_HEADER..PAGE_HEADER + 64];
    if u32_at(m, 0) != MAGIC {
        return Err("invalid magic".into());
    }
    if u32_at(m, 4) != VERSION {
        return Err(format!("unsupported version {}", u32_at(m, 4)));
    }
    let sum = u64_at(m, 56);
    if sum != 0 && fnv1a64(&m[..56]) != sum {
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
    /// The inline page (the value past its 16-byte bucket header) and
    /// where it lies in the file (None: read from a copy, see [`Mapped`]).
    Inline(Vec<u8>, Option<u64>),
}

/// A page's bytes and where they start in the file. What lies past them
/// is read from the file, as bbolt reads past a page in its map of the
/// file: an element whose key or value runs past its page (or past an
/// inline page, into its parent's) reads the bytes that follow; past the
/// end of the file is refused (where bbolt faults).
struct Mapped<'a> {
    r: &'a BoltReader,
    buf: Vec<u8>,
    /// Where `buf` starts in the file; None for a copy (nothing readable
    /// past it).
    base: Option<u64>,
}

impl Mapped<'_> {
    fn bytes(&self, at: usize, len: usize) -> Result<Cow<'_, [u8]>, BoltError> {
        if let Some(b) = at.checked_add(len).and_then(|end| self.buf.get(at..end)) {
            return Ok(Cow::Borrowed(b));
        }
        let Some(base) = self.base else {
            return Err(invalid(format!(
                "{len} bytes at {at} run past an inline bucket bbolt copies (what it reads there is undefined)"
            )));
        };
        let start = base.saturating_add(at as u64);
        if start.saturating_add(len as u64) > self.r.mapped_len() {
            return Err(invalid(format!(
                "{len} bytes at offset {start} run past the end of the file ({} bytes; truncated?)",
                self.r.file_len
            )));
        }
        let mut v = vec![0u8; len];
        self.r.read_mapped(&mut v, start)?;
        Ok(Cow::Owned(v))
    }

    fn u16(&self, at: usize) -> Result<u16, BoltError> {
        Ok(u16_at(&self.bytes(at, 2)?, 0))
    }

    fn u32(&self, at: usize) -> Result<u32, BoltError> {
        Ok(u32_at(&self.bytes(at, 4)?, 0))
    }

    fn u64(&self, at: usize) -> Result<u64, BoltError> {
        Ok(u64_at(&self.bytes(at, 8)?, 0))
    }

    /// Leaf element `i`: its flags, key, and where its value starts and
    /// how long it is (relative to the page).
    fn leaf_elem(&self, i: usize) -> Result<(u32, Cow<'_, [u8]>, usize, usize), BoltError> {
        let e = PAGE_HEADER + i * ELEMENT;
        let flags = self.u32(e)?;
        let pos = self.u32(e + 4)? as usize;
        let ksize = self.u32(e + 8)? as usize;
        let vsize = self.u32(e + 12)? as usize;
        let k = self.bytes(e + pos, ksize)?;
        Ok((flags, k, e + pos + ksize, vsize))
    }

    /// The bucket a leaf element's value (at `vs`, `vsize` long) heads.
    fn bucket_root(&self, vs: usize, vsize: usize) -> Result<BucketRoot, BoltError> {
        if vsize < 16 {
            return Err(invalid("bucket header shorter than 16 bytes"));
        }
        // bbolt reads an inline bucket in place when its value is 8-byte
        // aligned, else from a copy of the value
        let in_place = self
            .base
            .map(|b| b.saturating_add(vs as u64))
            .filter(|a| a % 8 == 0);
        let v = match in_place {
            // In place bbolt reads the header and the inline page where
            // they lie, never the value's length: a value longer than
            // the file (a damaged size) reads as far as the file goes.
            Some(a) => {
                let mapped =
                    usize::try_from(self.r.mapped_len().saturating_sub(a)).unwrap_or(usize::MAX);
                self.bytes(vs, vsize.min(mapped).max(16))?
            }
            // cloneBytes reads all of it
            None => self.bytes(vs, vsize)?,
        };
        let at = in_place.map(|a| a.saturating_add(16));
        Ok(match u64_at(&v, 0) {
            0 => BucketRoot::Inline(v[16..].to_vec(), at),
            r => BucketRoot::Page(r),
        })
    }
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
        // A file shorter than its pages is read as bbolt reads it, through
        // a map of the file: pages never reached do not matter, and one
        // that is reached fails (`page`).
        Ok(r)
    }

    /// The database's size as bbolt reports it (`tx.Size()`): high-water
    /// page id × page size.
    pub fn size(&self) -> u64 {
        self.meta.high_water.saturating_mul(self.page_size)
    }

    /// The page size.
    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    /// The file's length.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// How much of the file a memory map of it reads: up to the end of
    /// its last memory page.
    fn mapped_len(&self) -> u64 {
        self.file_len.div_ceil(OS_PAGE) * OS_PAGE
    }

    /// Reads `buf.len()` bytes at `at` as bbolt reads its memory map of
    /// the file: the last, partial page of the file reads as zeros past
    /// its end; anything further is refused (bbolt faults there).
    fn read_mapped(&self, buf: &mut [u8], at: u64) -> Result<(), BoltError> {
        let end = at.saturating_add(buf.len() as u64);
        if end > self.mapped_len() {
            return Err(invalid(format!(
                "page at offset {at} lies past the end of the file ({} bytes; truncated?)",
                self.file_len
            )));
        }
        let have = self.file_len.saturating_sub(at).min(buf.len() as u64) as usize;
        self.file.read_exact_at(&mut buf[..have], at)?;
        buf[have..].fill(0);
        Ok(())
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
        self.read_mapped(&mut head, id.saturating_mul(self.page_size))?;
        let overflow = u64::from(u32_at(&head, 12));
        let size = overflow
            .saturating_add(1)
            .saturating_mul(self.page_size)
            .min(self.file_len.saturating_add(OS_PAGE));
        let mut buf = vec![0u8; size as usize];
        self.read_mapped(&mut buf, id.saturating_mul(self.page_size))?;
        // bbolt's check: a page's own id past the high-water mark ("out of
        // bounds"); another id below it is not looked at.
        if u64_at(&buf, 0) > self.meta.high_water {
            return Err(invalid(format!(
                "page {id} has id {} in its header, past the {} pages",
                u64_at(&buf, 0),
                self.meta.high_water
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

    /// The root bucket's tree.
    pub fn root(&self) -> BucketRoot {
        BucketRoot::Page(self.meta.root)
    }

    /// bbolt's `tx.Bucket(name)`: a cursor seek down the root's tree (a
    /// binary search of each page, as bbolt's `Cursor.search` does it,
    /// which on keys out of order may miss one that is there), then the
    /// element found if its key is `name` and it is a bucket.
    pub fn root_bucket(&self, name: &[u8]) -> Result<Option<BucketRoot>, BoltError> {
        let mut id = self.meta.root;
        for _ in 0..=MAX_DEPTH {
            let page = Mapped {
                r: self,
                buf: self.page(id)?,
                base: Some(id.saturating_mul(self.page_size)),
            };
            let flags = page.u16(8)?;
            let count = usize::from(page.u16(10)?);
            let key = |i: usize| -> Result<Cow<'_, [u8]>, BoltError> {
                if flags & LEAF != 0 {
                    Ok(page.leaf_elem(i)?.1)
                } else {
                    let e = PAGE_HEADER + i * ELEMENT;
                    let (pos, ksize) = (page.u32(e)? as usize, page.u32(e + 4)? as usize);
                    page.bytes(e + pos, ksize)
                }
            };
            let mut bad = None;
            let mut exact = false;
            let mut idx = go_sort_search(count, |i| match key(i) {
                Ok(k) => {
                    exact |= *k == *name;
                    *k >= *name
                }
                Err(e) => {
                    bad.get_or_insert(e);
                    true
                }
            });
            if let Some(e) = bad {
                return Err(e);
            }
            if flags & LEAF != 0 {
                if idx >= count {
                    return Ok(None);
                }
                let (eflags, k, vs, vsize) = page.leaf_elem(idx)?;
                if *k != *name || eflags & BUCKET_LEAF == 0 {
                    return Ok(None);
                }
                return page.bucket_root(vs, vsize).map(Some);
            }
            if flags & BRANCH == 0 || count == 0 {
                return Err(invalid(format!(
                    "page {id} has flags {flags:#x}, not a branch or leaf"
                )));
            }
            if !exact && idx > 0 {
                idx -= 1;
            }
            id = page.u64(PAGE_HEADER + idx.min(count - 1) * ELEMENT + 8)?;
        }
        Err(invalid("tree deeper than 64 levels"))
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
            BucketRoot::Inline(page, base) => {
                // An inline bucket is one leaf page inside the value.
                let page = Mapped {
                    r: self,
                    buf: page.clone(),
                    base: *base,
                };
                if page.u16(8)? & LEAF == 0 {
                    return Err(invalid("inline bucket is not a leaf page"));
                }
                self.walk_leaf(&page, f)
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
        let page = Mapped {
            r: self,
            buf: self.page(id)?,
            base: Some(id.saturating_mul(self.page_size)),
        };
        let flags = page.u16(8)?;
        if flags & BRANCH != 0 {
            let count = usize::from(page.u16(10)?);
            let children = (0..count)
                .map(|i| page.u64(PAGE_HEADER + i * ELEMENT + 8))
                .collect::<Result<Vec<u64>, BoltError>>()?;
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
        page: &Mapped<'_>,
        f: &mut dyn FnMut(&[u8], &[u8], Option<BucketRoot>) -> Result<(), E>,
    ) -> Result<(), E> {
        let count = usize::from(page.u16(10)?);
        for i in 0..count {
            let (flags, k, vs, vsize) = page.leaf_elem(i)?;
            if flags & BUCKET_LEAF != 0 {
                let root = page.bucket_root(vs, vsize)?;
                let v = page.bytes(vs, vsize)?;
                f(&k, &v, Some(root))?;
            } else {
                let v = page.bytes(vs, vsize)?;
                f(&k, &v, None)?;
            }
        }
        Ok(())
    }
}
