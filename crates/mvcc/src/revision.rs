//! Revisions and their on-disk encoding.
//!
//! A revision is `(main, sub)`: `main` is the store revision a write
//! transaction created, `sub` numbers the changes inside it (0, 1, 2...).
//! In the backend's `key` table a revision is the key, encoded so that the
//! byte order is the revision order:
//!
//! ```text
//! main = 5, sub = 1   ->  00 00 00 00 00 00 00 05 '_' 00 00 00 00 00 00 00 01   (17 bytes)
//! a tombstone         ->  ... the same 17 bytes ... 't'                           (18 bytes)
//! ```
//!
//! A scan of the table is therefore a scan in revision order, which is what
//! index rebuilding, watch catch-up and compaction need.

use std::fmt;

/// Length of an encoded revision without the tombstone mark.
pub const REV_BYTES_LEN: usize = 8 + 1 + 8;
/// Length of an encoded tombstone revision.
pub const MARKED_REV_BYTES_LEN: usize = REV_BYTES_LEN + 1;
/// The mark appended to a tombstone's revision bytes.
pub const MARK_TOMBSTONE: u8 = b't';

/// A point in the store's history; ordered by `main`, then `sub`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Revision {
    /// The store revision of the write transaction.
    pub main: i64,
    /// The index of the change inside that transaction.
    pub sub: i64,
}

impl Revision {
    /// A revision `(main, sub)`.
    pub const fn new(main: i64, sub: i64) -> Revision {
        Revision { main, sub }
    }

    /// The 17-byte encoding.
    pub fn to_bytes(self) -> [u8; REV_BYTES_LEN] {
        let mut b = [0u8; REV_BYTES_LEN];
        b[..8].copy_from_slice(&self.main.to_be_bytes());
        b[8] = b'_';
        b[9..].copy_from_slice(&self.sub.to_be_bytes());
        b
    }

    /// The 18-byte encoding of a tombstone at this revision.
    pub fn to_tombstone_bytes(self) -> [u8; MARKED_REV_BYTES_LEN] {
        let mut b = [0u8; MARKED_REV_BYTES_LEN];
        b[..REV_BYTES_LEN].copy_from_slice(&self.to_bytes());
        b[REV_BYTES_LEN] = MARK_TOMBSTONE;
        b
    }

    /// Parses 17 or 18 (tombstone) bytes; returns the revision and whether
    /// it is a tombstone. `None` for anything else.
    pub fn parse(b: &[u8]) -> Option<(Revision, bool)> {
        let tombstone = match b.len() {
            REV_BYTES_LEN => false,
            MARKED_REV_BYTES_LEN if b[REV_BYTES_LEN] == MARK_TOMBSTONE => true,
            _ => return None,
        };
        if b[8] != b'_' {
            return None;
        }
        let main = i64::from_be_bytes(b[..8].try_into().ok()?);
        let sub = i64::from_be_bytes(b[9..17].try_into().ok()?);
        Some((Revision { main, sub }, tombstone))
    }
}

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}_{}", self.main, self.sub)
    }
}

/// Whether encoded revision bytes carry the tombstone mark.
pub fn is_tombstone(b: &[u8]) -> bool {
    b.len() == MARKED_REV_BYTES_LEN && b[REV_BYTES_LEN] == MARK_TOMBSTONE
}

#[cfg(test)]
mod tests {
    use super::*;

    // etcd: TestRevision
    #[test]
    fn test_revision() {
        let tests = [
            Revision::new(0, 0),
            Revision::new(1, 0),
            Revision::new(1, 1),
            Revision::new(2, 0),
            Revision::new(i64::MAX, i64::MAX),
        ];
        for w in tests.windows(2) {
            assert!(w[0] < w[1]);
            assert!(
                w[0].to_bytes() < w[1].to_bytes(),
                "byte order is revision order"
            );
        }
        for r in tests {
            assert_eq!(Revision::parse(&r.to_bytes()), Some((r, false)));
            assert_eq!(Revision::parse(&r.to_tombstone_bytes()), Some((r, true)));
            assert!(is_tombstone(&r.to_tombstone_bytes()));
            assert!(!is_tombstone(&r.to_bytes()));
        }
        assert_eq!(Revision::parse(b"short"), None);
        assert_eq!(
            Revision::new(5, 1).to_bytes(),
            [0, 0, 0, 0, 0, 0, 0, 5, b'_', 0, 0, 0, 0, 0, 0, 0, 1]
        );
    }
}
