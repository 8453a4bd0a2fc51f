//! Segment files on disk: naming, listing, atomic creation, directory fsync.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::{Result, WalError};

const SUFFIX: &str = ".wal";
const TMP_SUFFIX: &str = ".wal.tmp";

/// A segment file: `{seq:016x}-{first_index:016x}.wal`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SegmentName {
    /// Position in the sequence of segments; consecutive, starting at 0.
    pub seq: u64,
    /// One more than the last entry index saved before this segment was cut:
    /// every live entry of the previous segments is below it.
    pub first_index: u64,
}

impl SegmentName {
    pub(crate) fn file_name(&self) -> String {
        format!("{:016x}-{:016x}{SUFFIX}", self.seq, self.first_index)
    }

    pub(crate) fn parse(name: &str) -> Option<SegmentName> {
        let stem = name.strip_suffix(SUFFIX)?;
        let (seq, first) = stem.split_once('-')?;
        if seq.len() != 16 || first.len() != 16 {
            return None;
        }
        let hex = |s: &str| {
            if s.bytes().all(|b| b.is_ascii_hexdigit()) {
                u64::from_str_radix(s, 16).ok()
            } else {
                None
            }
        };
        Some(SegmentName {
            seq: hex(seq)?,
            first_index: hex(first)?,
        })
    }
}

pub(crate) fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> WalError {
    let context = context.into();
    move |source| WalError::Io { context, source }
}

/// Segment names in `dir`, sorted by sequence number. A missing directory
/// is an empty list. Files that merely end in `.wal` are ignored with a
/// warning.
pub(crate) fn list(dir: &Path) -> Result<Vec<SegmentName>> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(format!("read directory {}", dir.display()))(e)),
    };
    let mut out = Vec::new();
    for ent in rd {
        let ent = ent.map_err(io_err(format!("read directory {}", dir.display())))?;
        let name = ent.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(seg) = SegmentName::parse(name) {
            out.push(seg);
        } else if name.ends_with(SUFFIX) {
            tracing::warn!(file = name, "wal: ignoring file with an unexpected name");
        }
    }
    out.sort_by_key(|s| s.seq);
    Ok(out)
}

/// Removes `*.wal.tmp` leftovers of a crash during a segment cut. Such a file
/// was never renamed into place, so nothing in it was acknowledged.
pub(crate) fn remove_temp_files(dir: &Path) -> Result<()> {
    let rd = fs::read_dir(dir).map_err(io_err(format!("read directory {}", dir.display())))?;
    for ent in rd {
        let ent = ent.map_err(io_err(format!("read directory {}", dir.display())))?;
        if ent
            .file_name()
            .to_str()
            .is_some_and(|n| n.ends_with(TMP_SUFFIX))
        {
            tracing::warn!(file = ?ent.path(), "wal: removing unfinished segment");
            match fs::remove_file(ent.path()) {
                // gone meanwhile: a dropped log's spare thread, cancelled,
                // removes its own file
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                r => r.map_err(io_err(format!("remove {}", ent.path().display())))?,
            }
        }
    }
    Ok(())
}

pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(format!("fsync directory {}", dir.display())))
}

/// Creates segment `name` starting with `contents`: written to a temporary
/// file, preallocated to `prealloc` bytes (see [`preallocate`]), fsynced,
/// renamed into place, then the directory is fsynced. A crash therefore
/// never leaves a visible segment with a partial header. Returns the open
/// file (writes go to explicit offsets) and the number of syncs issued.
pub(crate) fn create(
    dir: &Path,
    name: &SegmentName,
    contents: &[u8],
    prealloc: u64,
) -> Result<(File, u64)> {
    let path: PathBuf = dir.join(name.file_name());
    let tmp = dir.join(format!("{}.tmp", name.file_name()));
    let ctx = |what: &str| format!("{what} {}", tmp.display());
    if tmp.exists() {
        fs::remove_file(&tmp).map_err(io_err(ctx("remove stale")))?;
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(io_err(ctx("create")))?;
    f.write_all(contents).map_err(io_err(ctx("write")))?;
    preallocate(&f, prealloc, &tmp);
    f.sync_all().map_err(io_err(ctx("fsync")))?;
    fs::rename(&tmp, &path).map_err(io_err(format!("rename to {}", path.display())))?;
    sync_dir(dir)?;
    Ok((f, 2))
}

/// Extends `f` to `len` bytes of allocated zeros (`fallocate`), as etcd
/// preallocates its segments: an append then changes no file size, so each
/// `fdatasync` flushes data without a journal commit for the size (about a
/// third cheaper per save on ext4 here). Best effort: where the file system
/// cannot (or has no room to) preallocate, the segment simply grows as it
/// is written. Never shrinks a file.
pub(crate) fn preallocate(f: &File, len: u64, path: &Path) {
    let Ok(meta) = f.metadata() else { return };
    if meta.len() >= len {
        return;
    }
    // Mode empty: allocate and extend the size; existing data untouched.
    if let Err(err) = rustix::fs::fallocate(f, rustix::fs::FallocateFlags::empty(), 0, len) {
        tracing::warn!(file = %path.display(), error = %err, "wal: cannot preallocate segment; it will grow as written");
    }
}

/// Name of the next segment being prepared (removed at open, like every
/// `*.wal.tmp`).
pub(crate) const SPARE_NAME: &str = "spare.wal.tmp";

/// Zeros written per step while a spare is prepared: each step is synced
/// before the next, so a WAL fdatasync queued behind it waits for at most
/// this much (a whole 64 MiB flush stalled the log's syncs for ~100 ms).
const SPARE_STEP: usize = 256 * 1024;

/// A segment file prepared on a background thread: `len` bytes of zeros
/// really written and synced, so that appending into it changes no
/// extent. On ext4 an fdatasync after writing into a `fallocate`d
/// (unwritten) extent also writes the extent tree; into written zeros it
/// writes the data only: p50 0.13 instead of 0.26 ms for a 4 KiB append
/// on this machine's disk (docs/benchmarks.md).
///
/// The zeros go to the disk with `O_DIRECT` where the file system takes
/// it: no copy into the page cache (64 MiB of it per segment otherwise),
/// 11–13 instead of 25–37 ms of CPU per segment here. Its pages are then
/// not cached, so the log writes each page whole the first time it
/// touches it ([`page_pad`]): a partial write into an uncached written
/// block would read it from the disk first.
#[derive(Debug)]
pub(crate) struct Spare {
    done: std::sync::mpsc::Receiver<std::io::Result<File>>,
    ready: Option<File>,
    finished: bool,
    cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Spare {
    /// Starts preparing `dir/SPARE_NAME` of `len` bytes.
    pub(crate) fn start(dir: &Path, len: u64) -> Spare {
        let (tx, done) = std::sync::mpsc::sync_channel(1);
        let cancel = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let path = dir.join(SPARE_NAME);
        let stop = cancel.clone();
        let spawned = std::thread::Builder::new()
            .name("wal-spare".into())
            .spawn(move || {
                let r = write_zeros(&path, len, &stop);
                if r.is_err() {
                    let _ = fs::remove_file(&path);
                }
                let _ = tx.send(r);
            });
        let finished = match spawned {
            Ok(_) => false,
            Err(e) => {
                tracing::warn!(error = %e, "wal: cannot start preparing a segment");
                true
            }
        };
        Spare {
            done,
            ready: None,
            finished,
            cancel,
        }
    }

    fn poll(&mut self) {
        if self.finished {
            return;
        }
        match self.done.try_recv() {
            Ok(Ok(f)) => {
                self.ready = Some(f);
                self.finished = true;
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "wal: cannot prepare a zero-filled segment");
                self.finished = true;
            }
            Err(std::sync::mpsc::TryRecvError::Empty) => {}
            Err(std::sync::mpsc::TryRecvError::Disconnected) => self.finished = true,
        }
    }

    /// Whether the prepared file is there to take.
    pub(crate) fn is_ready(&mut self) -> bool {
        self.poll();
        self.ready.is_some()
    }

    /// The prepared file, if it is ready (None: not yet, or it failed —
    /// logged — and the caller makes its segment the usual way).
    pub(crate) fn take(&mut self) -> Option<File> {
        self.poll();
        self.ready.take()
    }

    /// Whether it is done, used or not (ready, failed or gone).
    pub(crate) fn finished(&mut self) -> bool {
        self.poll();
        self.finished
    }
}

impl Drop for Spare {
    fn drop(&mut self) {
        // an unused spare is left to the next open's clean-up
        self.cancel
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

fn write_zeros(
    path: &Path,
    len: u64,
    stop: &std::sync::atomic::AtomicBool,
) -> std::io::Result<File> {
    if stop.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(std::io::Error::other("cancelled"));
    }
    // Never the one that fills the disk: a spare is a convenience, the log
    // itself must find room for its records.
    let dir = path.parent().unwrap_or(Path::new("."));
    let st = rustix::fs::statvfs(dir)?;
    let free = st.f_bavail.saturating_mul(st.f_frsize);
    if free < len.saturating_mul(4) {
        return Err(std::io::Error::other(format!(
            "{free} bytes free, less than four segments"
        )));
    }
    if path.exists() {
        fs::remove_file(path)?;
    }
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)?;
    // an aligned step of zeros (O_DIRECT wants the buffer, the offsets and
    // the lengths aligned to the logical block size; a page covers it)
    let zeros = vec![0u8; SPARE_STEP + PAGE];
    let zeros = &zeros[zeros.as_ptr().align_offset(PAGE)..][..SPARE_STEP];
    let mut direct = len.is_multiple_of(PAGE as u64) && set_direct(&f, true).is_ok();
    let mut off = 0u64;
    while off < len {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(std::io::Error::other("cancelled"));
        }
        let n = (len - off).min(SPARE_STEP as u64) as usize;
        match write_step(&f, &zeros[..n], off, direct) {
            Ok(()) => {}
            // a file system that opens but refuses direct writes: the
            // usual way from here on (the step is written again)
            Err(e)
                if direct && e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) =>
            {
                direct = false;
                set_direct(&f, false)?;
                continue;
            }
            Err(e) => return Err(e),
        }
        // each step synced: a WAL fdatasync meanwhile flushes at most a
        // step of these zeros from the disk's cache
        f.sync_data()?;
        off += n as u64;
    }
    if direct {
        set_direct(&f, false)?;
    }
    f.sync_all()?;
    Ok(f)
}

/// One step of a spare's zeros.
fn write_step(f: &File, zeros: &[u8], off: u64, direct: bool) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    #[cfg(test)]
    if direct && REFUSE_DIRECT.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(rustix::io::Errno::INVAL.into());
    }
    let _ = direct;
    f.write_all_at(zeros, off)
}

/// Unit tests: direct writes of spares fail with EINVAL, as on a file
/// system that opens files with `O_DIRECT` but refuses the writes.
#[cfg(test)]
pub(crate) static REFUSE_DIRECT: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// The page size the log pads its first write into a page to.
pub(crate) const PAGE: usize = 4096;

/// Turns `O_DIRECT` on or off for `f` (Linux lets `F_SETFL` change it).
fn set_direct(f: &File, on: bool) -> std::io::Result<()> {
    use rustix::fs::OFlags;
    let flags = rustix::fs::fcntl_getfl(f)?;
    let flags = if on {
        flags | OFlags::DIRECT
    } else {
        flags - OFlags::DIRECT
    };
    rustix::fs::fcntl_setfl(f, flags)?;
    Ok(())
}

/// How many zero bytes to write after a write into a prepared segment
/// ending at `end`, so that the write covers its last page whole (not
/// past `zeros_end`, where the prepared zeros end). Pages before it were
/// covered whole by an earlier write, or by this one.
pub(crate) fn page_pad(end: u64, zeros_end: u64) -> usize {
    let page_end = end.div_ceil(PAGE as u64) * PAGE as u64;
    page_end.min(zeros_end).saturating_sub(end) as usize
}

/// Where the written zeros of a reopened segment end: its length `len`
/// when every block from the page holding `from` (the end of its records)
/// to its end is written — a prepared spare, whose zeros were written
/// before it became a segment — else 0: some of that tail is only
/// preallocated (`fallocate`'s unwritten extents), a hole, or the file
/// system does not say (no `FIEMAP`, as on tmpfs).
pub(crate) fn written_zeros_end(f: &File, from: u64, len: u64) -> u64 {
    use fiemap::FiemapExtentFlags as X;
    if from >= len {
        return 0;
    }
    let not_written = X::UNWRITTEN | X::DELALLOC | X::UNKNOWN;
    // everything before `covered` is known to be written
    let mut covered = from / PAGE as u64 * PAGE as u64;
    for ext in fiemap::Fiemap::new(f) {
        let Ok(ext) = ext else { return 0 };
        let end = ext.fe_logical.saturating_add(ext.fe_length);
        if end <= covered {
            continue;
        }
        if ext.fe_logical > covered || ext.fe_flags.intersects(not_written) {
            return 0;
        }
        covered = end;
        if covered >= len {
            return len;
        }
    }
    0
}

/// Writes `buf` at `offset` and then `pad` zeros (at most a page), in one
/// call where the system takes it all at once.
pub(crate) fn write_padded(f: &File, buf: &[u8], pad: usize, offset: u64) -> std::io::Result<()> {
    use std::io::IoSlice;
    static ZEROS: [u8; PAGE] = [0; PAGE];
    let pad = &ZEROS[..pad.min(PAGE)];
    let total = buf.len() + pad.len();
    let mut done = 0;
    while done < total {
        let at = offset + done as u64;
        let res = if done < buf.len() {
            rustix::io::pwritev(f, &[IoSlice::new(&buf[done..]), IoSlice::new(pad)], at)
        } else {
            rustix::io::pwritev(f, &[IoSlice::new(&pad[done - buf.len()..])], at)
        };
        match res {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Appends into a prepared segment with `O_DIRECT`: each append rewrites
/// the page the log ends in whole (the bytes already there, then the new
/// ones, then zeros to the page's end), from an aligned buffer, in one
/// write. The prepared zeros are overwritten in place (no extent changes),
/// nothing is copied into the page cache, and the fdatasync that follows
/// has no dirty pages to find and write back: 26–32 instead of 43–47 µs
/// of kernel time per 4 KiB write and fdatasync on this machine's disk
/// (docs/benchmarks.md). A crash in the middle of such a write can tear
/// that page as the page cache's writeback of it could.
#[derive(Debug)]
pub(crate) struct Direct {
    /// The bytes of the page the log's end is in, before that end.
    tail: Vec<u8>,
    /// Scratch, over-allocated so that a page-aligned run of it holds a
    /// whole write.
    scratch: Vec<u8>,
}

/// Scratch above this is freed after its write (a large batch's).
const DIRECT_SCRATCH_KEPT: usize = 1 << 20;

impl Direct {
    /// Turns `O_DIRECT` on for `f`, a prepared segment whose records end at
    /// `end` and whose written zeros end at `zeros_end` (a multiple of the
    /// page), after reading the part of the last page before `end`; then
    /// rewrites that page as it is, to learn whether the file system takes
    /// direct writes. None (and `f` as it was) where anything fails: the
    /// log then writes through the page cache.
    pub(crate) fn start(f: &File, end: u64, zeros_end: u64) -> Option<Direct> {
        use std::os::unix::fs::FileExt;
        if !zeros_end.is_multiple_of(PAGE as u64) || end >= zeros_end {
            return None;
        }
        let page_start = end / PAGE as u64 * PAGE as u64;
        let mut tail = vec![0u8; (end - page_start) as usize];
        f.read_exact_at(&mut tail, page_start).ok()?;
        set_direct(f, true).ok()?;
        let mut direct = Direct {
            tail,
            scratch: Vec::new(),
        };
        match direct.write(f, &[], end) {
            Ok(()) => Some(direct),
            Err(_) => {
                let _ = set_direct(f, false);
                None
            }
        }
    }

    /// Whether `len` more bytes after `end` stay inside the prepared zeros
    /// (up to `zeros_end`) once padded to a page.
    pub(crate) fn fits(end: u64, len: usize, zeros_end: u64) -> bool {
        (end + len as u64).div_ceil(PAGE as u64) * PAGE as u64 <= zeros_end
    }

    /// Writes `buf` at `end`, the log's end (see the type).
    pub(crate) fn write(&mut self, f: &File, buf: &[u8], end: u64) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let page_start = end - self.tail.len() as u64;
        let len = self.tail.len() + buf.len();
        let padded = len.div_ceil(PAGE).max(1) * PAGE;
        if self.scratch.len() < padded + PAGE {
            self.scratch = vec![0u8; padded + PAGE];
        }
        let at = self.scratch.as_ptr().align_offset(PAGE);
        let out = &mut self.scratch[at..at + padded];
        out[..self.tail.len()].copy_from_slice(&self.tail);
        out[self.tail.len()..len].copy_from_slice(buf);
        out[len..].fill(0);
        f.write_all_at(out, page_start)?;
        let last_page = len / PAGE * PAGE;
        self.tail.clear();
        self.tail.extend_from_slice(&out[last_page..len]);
        if self.scratch.len() > DIRECT_SCRATCH_KEPT {
            self.scratch = Vec::new();
        }
        Ok(())
    }

    /// Turns `O_DIRECT` off again (the log goes on through the page cache).
    pub(crate) fn stop(f: &File) -> std::io::Result<()> {
        set_direct(f, false)
    }
}

/// Turns a prepared spare into segment `name`: writes `contents` at its
/// start, syncs, renames it into place and syncs the directory. Returns
/// the number of syncs issued and the spare's length (where its zeros end).
pub(crate) fn install_spare(
    dir: &Path,
    spare: &File,
    name: &SegmentName,
    contents: &[u8],
) -> Result<(u64, u64)> {
    let tmp = dir.join(SPARE_NAME);
    let path = dir.join(name.file_name());
    let ctx = |what: &str| format!("{what} {}", tmp.display());
    let zeros_end = spare.metadata().map_err(io_err(ctx("stat")))?.len();
    write_padded(
        spare,
        contents,
        page_pad(contents.len() as u64, zeros_end),
        0,
    )
    .map_err(io_err(ctx("write")))?;
    spare.sync_data().map_err(io_err(ctx("fdatasync")))?;
    fs::rename(&tmp, &path).map_err(io_err(format!("rename to {}", path.display())))?;
    sync_dir(dir)?;
    Ok((2, zeros_end))
}
