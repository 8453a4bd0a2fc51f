//! Power loss: a member's data dir on its own ext4 file system (a sparse
//! image file on a loop device), which the test can "switch off": the
//! kernel's shutdown ioctl without flushing the journal
//! (`xfs_io -x -c shutdown`, `EXT4_IOC_SHUTDOWN` with
//! `EXT4_GOING_FLAGS_NOLOGFLUSH`; xfstests simulates power failure the same
//! way). From that instant every I/O on the file system fails, and what was
//! not fsynced — dirty pages and journal transactions not yet committed —
//! never reaches the image: after an unmount and a fresh mount (journal
//! replay) the files are as the disk had them at the shutdown.
//!
//! The file system is mounted with `commit=60`, so ext4's own periodic
//! commit (5 s by default) does not persist unsynced writes behind the
//! test's back within a scenario; the kernel's dirty-page writeback
//! (`dirty_expire_centisecs`, 30 s) is longer than a fault phase.
//!
//! Why not a FUSE layer in the style of LazyFS: this kernel has ext4, loop
//! devices and the shutdown ioctl, so the real file system's semantics
//! (ordered data, journaled metadata, a rename that was never committed)
//! decide what survives, not a model of them; device-mapper (dm-flakey,
//! dm-log-writes) is not in this kernel.
//!
//! Every power-off first overwrites a canary — a 4 KiB file of zeros,
//! synced when the disk was made — in place without syncing it, and checks
//! after the remount that the canary still reads zeros: the proof that
//! unsynced data really was dropped. (A *new* unsynced file is no proof: a
//! member's fsync commits the shared journal transaction, and ordered mode
//! writes newly allocated data with it; an in-place overwrite stays a dirty
//! page.) Needs root (mount, losetup).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The canary each power-off overwrites without syncing.
const CANARY: &str = "power-loss-canary";
const CANARY_LEN: usize = 4096;

fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// An ext4 image mounted on a member's data dir; see the module docs.
/// Unmounted (lazily) when dropped, also when the test fails.
pub struct PowerDisk {
    pub image: PathBuf,
    pub path: PathBuf,
    mounted: bool,
    /// Power-offs so far.
    pub power_offs: usize,
}

impl PowerDisk {
    /// Makes a sparse image of `bytes` next to `path`, formats it ext4 and
    /// mounts it on `path` (created if missing).
    pub fn new(path: &Path, bytes: u64) -> Result<PowerDisk> {
        std::fs::create_dir_all(path).with_context(|| format!("create {}", path.display()))?;
        let image = path.with_extension("img");
        let f = std::fs::File::create(&image).context("create the disk image")?;
        f.set_len(bytes).context("size the disk image")?;
        drop(f);
        run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image))?;
        let mut d = PowerDisk {
            image,
            path: path.to_path_buf(),
            mounted: false,
            power_offs: 0,
        };
        d.mount()?;
        let f = std::fs::File::create(d.path.join(CANARY)).context("create the canary")?;
        std::io::Write::write_all(&mut &f, &[0u8; CANARY_LEN])?;
        f.sync_all().context("sync the canary")?;
        Ok(d)
    }

    fn mount(&mut self) -> Result<()> {
        run(Command::new("mount")
            .args(["-t", "ext4", "-o", "loop,commit=60"])
            .arg(&self.image)
            .arg(&self.path))
        .context("mount the member's disk (the power-loss scenarios need root)")?;
        self.mounted = true;
        Ok(())
    }

    /// Cuts the power: writes the unsynced canary, then shuts the file
    /// system down without flushing anything. The member's next I/O fails;
    /// the caller kills it, then calls [`PowerDisk::power_on`].
    pub fn power_off(&mut self) -> Result<()> {
        {
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(self.path.join(CANARY))
                .context("open the canary")?;
            f.write_all_at(format!("unsynced {}", self.power_offs).as_bytes(), 0)
                .context("overwrite the canary")?;
        }
        run(Command::new("xfs_io")
            .args(["-x", "-c", "shutdown"])
            .arg(&self.path))
        .context("shut the file system down (xfs_io, from xfsprogs)")?;
        self.power_offs += 1;
        Ok(())
    }

    /// After a power-off, once the member is dead: unmounts and mounts the
    /// image again (ext4 replays its journal), and checks that the canary
    /// is gone.
    pub fn power_on(&mut self) -> Result<()> {
        // the dead process's files are closed once it is reaped
        let mut tries = 0;
        loop {
            match run(Command::new("umount").arg(&self.path)) {
                Ok(_) => break,
                Err(e) if tries < 50 => {
                    tries += 1;
                    let _ = e;
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                Err(e) => return Err(e.context("unmount after the power-off")),
            }
        }
        self.mounted = false;
        self.mount()?;
        let canary = std::fs::read(self.path.join(CANARY)).context("read the canary")?;
        if canary.len() != CANARY_LEN || canary.iter().any(|&b| b != 0) {
            bail!(
                "the unsynced overwrite of the canary survived the power-off of {}: unsynced data was not dropped ({:?})",
                self.path.display(),
                String::from_utf8_lossy(&canary[..canary.len().min(16)])
            );
        }
        Ok(())
    }
}

impl Drop for PowerDisk {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        }
    }
}
