//! Free loopback ports for servers.
//!
//! A port is chosen at random in 20000..32000 — below Linux's ephemeral range
//! (32768+), so the kernel never hands it to an outgoing connection while a
//! member is down between kill and restart — checked free by binding it on
//! 127.0.0.1, released, and remembered so this process never hands it out
//! twice (tests run in parallel threads).
//!
//! Other processes on the machine (test binaries run side by side) are kept
//! off it too: the process holds an exclusive lock on a file named after
//! the port under `$TMPDIR/retcd-ports` for as long as it lives (the kernel
//! drops the lock when it exits), and a port whose file another process has
//! locked is skipped. Without it a member killed for a fault left its port
//! free, another test process took it, and the restart failed with
//! "Address already in use".

use std::collections::HashMap;
use std::fs::File;
use std::net::TcpListener;
use std::sync::Mutex;

use rand::Rng;

/// Ports given out by this process, each with its locked file (`None` if
/// the lock directory could not be used).
static TAKEN: Mutex<Option<HashMap<u16, Option<File>>>> = Mutex::new(None);

/// Locks `port`'s file for this process: `Ok(None)` without a usable lock
/// directory (then only this process's own bookkeeping holds), `Err` when
/// another process holds it.
fn lock_port(port: u16) -> Result<Option<File>, ()> {
    let dir = std::env::temp_dir().join("retcd-ports");
    if std::fs::create_dir_all(&dir).is_err() {
        return Ok(None);
    }
    let Ok(f) = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(port.to_string()))
    else {
        return Ok(None);
    };
    match f.try_lock() {
        Ok(()) => Ok(Some(f)),
        Err(std::fs::TryLockError::WouldBlock) => Err(()),
        Err(std::fs::TryLockError::Error(_)) => Ok(None),
    }
}

/// A loopback port that was free a moment ago and that no other caller in
/// this process has been given.
pub fn free_port() -> u16 {
    let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
    let taken = taken.get_or_insert_with(HashMap::new);
    let mut rng = rand::rng();
    for _ in 0..10_000 {
        let port: u16 = rng.random_range(20_000..32_000);
        if taken.contains_key(&port) {
            continue;
        }
        let Ok(lock) = lock_port(port) else {
            continue;
        };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            taken.insert(port, lock);
            return port;
        }
    }
    // Fall back to the kernel's choice.
    let l = TcpListener::bind(("127.0.0.1", 0)).expect("bind 127.0.0.1:0");
    let port = l.local_addr().expect("local_addr").port();
    taken.insert(port, None);
    port
}

#[cfg(test)]
mod tests {
    use super::free_port;

    #[test]
    fn ports_are_distinct_bindable_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        let mut uniq = ports.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), ports.len(), "a port was handed out twice");
        // Other test processes (the fault lane runs beside this one) take
        // ports from the same range at the same time: one of them may have
        // bound a port since it was checked, not several.
        let mut taken_since = Vec::new();
        for p in ports {
            assert!((20_000..32_000).contains(&p), "{p}");
            if let Err(e) = std::net::TcpListener::bind(("127.0.0.1", p)) {
                assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{p}: {e}");
                taken_since.push(p);
            }
        }
        assert!(
            taken_since.len() <= 2,
            "ports handed out but not free: {taken_since:?}"
        );
    }

    /// A port this process holds is locked against other processes: a
    /// child process trying the same lock file finds it held.
    #[test]
    fn a_given_port_is_locked_for_other_processes() {
        // flock(1) from util-linux, non-blocking: exit 7 when held elsewhere
        let flock_exit = |path: &std::path::Path| {
            std::process::Command::new("flock")
                .args(["-n", "-E", "7"])
                .arg(path)
                .arg("true")
                .status()
                .expect("run flock")
                .code()
        };
        let dir = std::env::temp_dir().join("retcd-ports");
        let path = dir.join(free_port().to_string());
        assert!(path.exists(), "{path:?}");
        assert_eq!(flock_exit(&path), Some(7), "another process got {path:?}");
        // a path nobody holds is free for it
        let other = dir.join(format!("unused-{}", std::process::id()));
        std::fs::write(&other, b"").unwrap();
        let free = flock_exit(&other);
        std::fs::remove_file(&other).ok();
        assert_eq!(free, Some(0));
    }
}
