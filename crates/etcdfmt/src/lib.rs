//! etcd's on-disk formats, so data moves between etcd and retcd both ways:
//!
//! * [`bolt`]: a read-only walker of bbolt files (etcd's `member/snap/db`
//!   and `snapshot.db`);
//! * [`backend`]: etcd's buckets and encodings, mapped to retcd's tables;
//! * [`BackendWriter`]: writes an etcd backend file with `bbolt-rs`, in
//!   bounded batches (what `Maintenance.Snapshot` streams);
//! * [`read_backend`] / [`status`]: an etcd backend's rows as retcd dump
//!   records, and `etcdutl snapshot status`'s figures;
//! * [`wal`]: etcd's WAL (records, entries, hard state), for taking over a
//!   stopped etcd member's data dir.

pub mod backend;
pub mod bolt;
pub mod wal;

use std::path::Path;

use bbolt_rs::{BoltOptions, BucketRwApi, DbRwAPI, TxRwApi, TxRwRefApi};

pub use backend::{from_etcd, to_etcd, ConvertError, BUCKETS};
pub use bolt::{BoltError, BoltReader};

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error(transparent)]
    Bolt(#[from] BoltError),
    #[error("{0}")]
    Convert(#[from] ConvertError),
    #[error("bbolt: {0}")]
    Write(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A key of the root that bbolt's lookup finds no bucket for (its
    /// name as etcdutl prints it: the raw bytes).
    #[error("cannot get hash of bucket {}", String::from_utf8_lossy(.0))]
    NotABucket(Vec<u8>),
}

impl From<bbolt_rs::Error> for FormatError {
    fn from(e: bbolt_rs::Error) -> Self {
        FormatError::Write(e.to_string())
    }
}

/// Bytes of rows buffered before a bbolt transaction commits them: bounds
/// the writer's memory whatever the store's size. bbolt-rs holds about ten
/// times a transaction's rows while committing it: 4 MiB grew the server
/// by ~40 MiB during a snapshot, 16 MiB by ~150 MiB (docs/benchmarks.md).
const BATCH_BYTES: usize = 4 << 20;

/// Writes an etcd-format backend file (bbolt with etcd's ten buckets).
pub struct BackendWriter {
    db: bbolt_rs::Bolt,
    batch: Vec<(&'static str, Vec<u8>, Vec<u8>)>,
    batch_bytes: usize,
}

impl std::fmt::Debug for BackendWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendWriter")
            .field("batch", &self.batch.len())
            .finish()
    }
}

impl BackendWriter {
    /// Creates `path` (which must not exist) with etcd's buckets and the
    /// `cluster` bucket's `clusterVersion` (`major.minor.0` of
    /// `etcd_version`, as etcd stores it).
    pub fn create(path: &Path, etcd_version: &str) -> Result<BackendWriter, FormatError> {
        if path.exists() {
            return Err(FormatError::Io(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} exists", path.display()),
            )));
        }
        // No fsync per commit: the caller syncs the finished file (or
        // streams it and deletes it).
        let mut db = BoltOptions::builder().no_sync().build().open(path)?;
        let mut tx = db.begin_rw()?;
        for b in BUCKETS {
            tx.create_bucket_if_not_exists(b)?;
        }
        let mut parts = etcd_version.split('.');
        let cluster = format!(
            "{}.{}.0",
            parts.next().unwrap_or("3"),
            parts.next().unwrap_or("5")
        );
        tx.bucket_mut("cluster")
            .expect("created above")
            .put("clusterVersion", cluster)?;
        tx.commit()?;
        Ok(BackendWriter {
            db,
            batch: Vec::new(),
            batch_bytes: 0,
        })
    }

    /// Adds retcd dump record `(table, k, v)` (converted to etcd's layout;
    /// records etcd has no place for are dropped). Records of one table
    /// come in key order, as a dump gives them.
    pub fn add(&mut self, table: u8, k: &[u8], v: &[u8]) -> Result<(), FormatError> {
        if let Some((bucket, k, v)) = to_etcd(table, k, v)? {
            self.batch_bytes += k.len() + v.len() + 32;
            self.batch.push((bucket, k, v));
            if self.batch_bytes >= BATCH_BYTES {
                self.flush()?;
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), FormatError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let mut tx = self.db.begin_rw()?;
        let mut i = 0;
        while i < self.batch.len() {
            let name = self.batch[i].0;
            let mut b = tx
                .bucket_mut(name)
                .ok_or_else(|| FormatError::Write(format!("bucket {name} missing")))?;
            // Rows come in key order: fill pages as etcd fills `key`.
            b.set_fill_percent(0.9);
            while i < self.batch.len() && self.batch[i].0 == name {
                let (_, k, v) = &self.batch[i];
                b.put(k, v)?;
                i += 1;
            }
        }
        tx.commit()?;
        self.batch.clear();
        self.batch_bytes = 0;
        Ok(())
    }

    /// Commits what is left, syncs the file and closes it.
    pub fn finish(mut self) -> Result<(), FormatError> {
        self.flush()?;
        self.db.sync()?;
        Ok(())
    }
}

/// What `etcdutl snapshot status` reports of a backend file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// CRC-32C over every bucket name and every key and value, in order.
    pub hash: u32,
    /// Main revision of the last row of `key`.
    pub revision: i64,
    /// Rows in all buckets.
    pub total_keys: u64,
    /// bbolt's size: high-water page × page size.
    pub total_size: u64,
}

/// Walks every bucket of `r`: `etcdutl snapshot status`'s figures, read
/// as etcdutl reads them: each key of the root in order, looked up as a
/// bucket (`tx.Bucket`: "cannot get hash of bucket" when that finds no
/// bucket), then every key and value of it (a nested bucket's value as
/// nothing, as `Bucket.ForEach` gives it).
pub fn status(r: &BoltReader) -> Result<Status, FormatError> {
    let mut hash = 0u32;
    let mut revision = 0i64;
    let mut total_keys = 0u64;
    let mut names = Vec::new();
    r.walk::<BoltError>(&r.root(), &mut |k, _, _| {
        names.push(k.to_vec());
        Ok(())
    })?;
    for name in names {
        let Some(root) = r.root_bucket(&name)? else {
            return Err(FormatError::NotABucket(name));
        };
        hash = crc32c::crc32c_append(hash, &name);
        let is_key = name == b"key";
        r.walk::<BoltError>(&root, &mut |k, v, sub| {
            hash = crc32c::crc32c_append(hash, k);
            if sub.is_none() {
                hash = crc32c::crc32c_append(hash, v);
            }
            if is_key && k.len() >= 8 {
                revision = i64::from_be_bytes(k[..8].try_into().expect("8 bytes"));
            }
            total_keys += 1;
            Ok(())
        })?;
    }
    Ok(Status {
        hash,
        revision,
        total_keys,
        total_size: r.size(),
    })
}

/// Calls `f(table, k, v)` with every row of the etcd backend `r` that
/// retcd keeps, as retcd dump records, checked (see [`backend`]); `key`
/// rows come first, in revision order.
pub fn read_backend(
    r: &BoltReader,
    f: &mut dyn FnMut(u8, &[u8], &[u8]) -> Result<(), FormatError>,
) -> Result<(), FormatError> {
    let mut buckets = r.buckets()?;
    // `key` first: the dump order retcd's restore expects is by table.
    buckets.sort_by_key(|(n, _)| n.as_slice() != b"key");
    for (name, root) in buckets {
        r.walk::<FormatError>(&root, &mut |k, v, sub| {
            if sub.is_some() {
                return Err(BoltError::Invalid(format!(
                    "nested bucket {:?} in {:?}",
                    String::from_utf8_lossy(k),
                    String::from_utf8_lossy(&name)
                ))
                .into());
            }
            match from_etcd(&name, k, v)? {
                Some((t, k, v)) => f(t, &k, &v),
                None => Ok(()),
            }
        })?;
    }
    Ok(())
}

/// The SHA-256 trailer etcd appends to a snapshot stream is there when the
/// file's length is 32 past a multiple of 512 (a bbolt file's length is a
/// multiple of its page size): etcdutl's own test.
pub fn has_sha256_trailer(file_len: u64) -> bool {
    file_len % 512 == 32
}

/// go-humanize's `Bytes` (SI units), as etcdctl prints sizes.
pub fn human_bytes(n: u64) -> String {
    if n < 10 {
        return format!("{n} B");
    }
    let units = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    let e = ((n as f64).ln() / 1000f64.ln()).floor() as usize;
    let v = n as f64 / 1000f64.powi(e as i32);
    if v < 10.0 {
        format!("{v:.1} {}", units[e])
    } else {
        format!("{v:.0} {}", units[e])
    }
}

#[cfg(test)]
mod tests;
