//! Free loopback ports for servers.
//!
//! A port is chosen at random in 20000..32000 — below Linux's ephemeral range
//! (32768+), so the kernel never hands it to an outgoing connection while a
//! member is down between kill and restart — checked free by binding it on
//! 127.0.0.1, released, and remembered so this process never hands it out
//! twice (tests run in parallel threads).

use std::collections::HashSet;
use std::net::TcpListener;
use std::sync::Mutex;

use rand::Rng;

static TAKEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A loopback port that was free a moment ago and that no other caller in
/// this process has been given.
pub fn free_port() -> u16 {
    let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
    let taken = taken.get_or_insert_with(HashSet::new);
    let mut rng = rand::rng();
    for _ in 0..10_000 {
        let port: u16 = rng.random_range(20_000..32_000);
        if taken.contains(&port) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            taken.insert(port);
            return port;
        }
    }
    // Fall back to the kernel's choice.
    let l = TcpListener::bind(("127.0.0.1", 0)).expect("bind 127.0.0.1:0");
    let port = l.local_addr().expect("local_addr").port();
    taken.insert(port);
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
}
