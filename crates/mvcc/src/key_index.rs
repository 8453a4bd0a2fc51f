//! `KeyIndex`: the revision history of one key, in generations.
//!
//! A key's life is a series of *generations*. A generation starts with the
//! put that creates the key and ends with a tombstone (its delete); the
//! tombstone is the generation's last revision, and a new, empty generation
//! follows it. The last generation is the live one (empty if the key is
//! currently deleted).
//!
//! Worked example (as in etcd's `key_index.go`): the key "foo" is put at
//! 1.0, put at 2.0, deleted at 3.0, put at 4.0, deleted at 5.0:
//!
//! ```text
//! generations:
//!     {empty}                 <- live generation: "foo" is deleted
//!     {4.0, 5.0(t)}
//!     {1.0, 2.0, 3.0(t)}
//! ```
//!
//! Put 6.0 then gives `{6.0}` as the live generation. `get(at_rev)` finds the
//! generation alive at `at_rev` and the latest revision in it not after
//! `at_rev`; a tombstone never answers a get (the key is absent then).
//!
//! **Compaction** at revision `r` drops whole generations whose tombstone
//! is `< r` and, in the first remaining one, every revision older than
//! the latest one `<= r`. The
//! revisions that must survive (the latest `<= r` of the first remaining
//! generation, a tombstone at `r` included, as etcd 3.5.16+; and, when the
//! key was deleted and put again within revision `r` itself, the latest
//! revision `<= r` of each generation that began at `r`) are added to
//! `available`; everything else `<= r` may go from the backend. Compacting
//! the example above:
//!
//! ```text
//! compact(2): {empty}, {4.0, 5.0(t)}, {2.0, 3.0(t)}      available: {2.0}
//! compact(4): {empty}, {4.0, 5.0(t)}                     available: {4.0}
//! compact(5): {empty}, {5.0(t)}                          available: {5.0}
//! compact(6): {empty}                                    available: {}
//! ```
//!
//! After `compact(6)` the key index is empty and the tree index drops it.
//! `keep(r)` computes the same `available` set without changing anything,
//! except that it leaves out a tombstone at `r` (HashKV skips it, so that
//! members of etcd versions that deleted it hash the same).

use std::collections::HashSet;

use crate::revision::Revision;

/// One life of a key: from its creation to its tombstone (inclusive).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Generation {
    /// Version of the key at the generation's last revision (puts counted
    /// from 1; a tombstone counts too).
    pub ver: i64,
    /// The revision that created the key (first put).
    pub created: Revision,
    /// Revisions in this generation, increasing.
    pub revs: Vec<Revision>,
}

impl Generation {
    /// Whether this generation has no revisions.
    pub fn is_empty(&self) -> bool {
        self.revs.is_empty()
    }

    /// Walks revisions newest first; returns the index of the first one for
    /// which `f` returns false.
    fn walk(&self, mut f: impl FnMut(Revision) -> bool) -> Option<usize> {
        (0..self.revs.len()).rev().find(|&i| !f(self.revs[i]))
    }
}

/// The history of one key; see the module documentation.
///
/// The key itself is the index map's key, not repeated here (it would be a
/// second allocation of every key, ~70 bytes each). Nor is the last
/// modification: it is the last revision of the last generation that has
/// one (compaction never removes it without removing the key). 32 bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyIndex {
    /// Bytes of the stored row of the key's last modification when that
    /// is a put whose row size was given ([`KeyIndex::put_sized`]), else
    /// [`UNKNOWN_LEN`]: a Range at the current revision sizes its response
    /// from the index instead of reading every row twice.
    last_len: u32,
    /// Generations, oldest first; never empty once a revision was added.
    pub generations: Vec<Generation>,
}

/// [`KeyIndex`]'s `last_len` when the size is not known.
const UNKNOWN_LEN: u32 = u32::MAX;

impl Default for KeyIndex {
    fn default() -> KeyIndex {
        KeyIndex {
            last_len: UNKNOWN_LEN,
            generations: Vec::new(),
        }
    }
}

/// `get` found no live revision (etcd's `ErrRevisionNotFound`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("mvcc: revision not found")]
pub struct RevisionNotFound;

impl KeyIndex {
    /// A key index with no history.
    pub fn new() -> KeyIndex {
        KeyIndex::default()
    }

    /// The last modification (put or tombstone); the zero revision for a
    /// key index with no history.
    pub fn modified(&self) -> Revision {
        let mut gens = self.generations.iter().rev();
        match gens.next() {
            Some(g) if !g.is_empty() => g.revs[g.revs.len() - 1],
            // the live generation is empty: the one before ends with the
            // tombstone
            Some(_) => gens
                .next()
                .and_then(|g| g.revs.last().copied())
                .unwrap_or_default(),
            None => Revision::default(),
        }
    }

    /// Records a put at `(main, sub)` whose stored row is `row_len` bytes.
    pub fn put_sized(&mut self, main: i64, sub: i64, row_len: usize) {
        self.put(main, sub);
        self.set_last_row_len(row_len);
    }

    /// Records the stored size of the row of the key's last modification
    /// (after [`KeyIndex::restore`] or a put; a size past `u32` is not kept).
    pub fn set_last_row_len(&mut self, row_len: usize) {
        self.last_len = u32::try_from(row_len)
            .ok()
            .filter(|&l| l != UNKNOWN_LEN)
            .unwrap_or(UNKNOWN_LEN);
    }

    /// Records a put at `(main, sub)` (its row's size unknown).
    ///
    /// # Panics
    /// If the revision is not greater than the last modification: the store
    /// hands out revisions in increasing order, anything else is a bug.
    pub fn put(&mut self, main: i64, sub: i64) {
        let rev = Revision::new(main, sub);
        let modified = self.modified();
        assert!(
            rev > modified,
            "mvcc: 'put' with an unexpected smaller revision {rev} <= {modified}",
        );
        self.last_len = UNKNOWN_LEN;
        if self.generations.is_empty() {
            // Most keys live one generation with few revisions: exact
            // first allocations (Vec's default first capacity, 4, made
            // the index ~2× larger for 100k keys written once).
            self.generations.reserve_exact(1);
            self.generations.push(Generation::default());
        }
        let g = self.generations.last_mut().expect("non-empty");
        if g.revs.is_empty() {
            g.created = rev;
            g.revs.reserve_exact(1);
        }
        g.revs.push(rev);
        g.ver += 1;
    }

    /// Rebuilds a key index from the first surviving revision found in the
    /// backend (after a compaction the creation may be gone): one generation
    /// created at `created`, at version `ver`, last modified at `modified`.
    pub fn restore(&mut self, created: Revision, modified: Revision, ver: i64) {
        assert!(
            self.generations.is_empty(),
            "mvcc: 'restore' got an unexpected non-empty generations",
        );
        self.last_len = UNKNOWN_LEN;
        // exact, as `put`: Vec's first capacity of 4 generations made a
        // restarted member's index ~150 MiB larger at 1M keys than the
        // same index built by puts
        self.generations.reserve_exact(1);
        self.generations.push(Generation {
            ver,
            created,
            revs: vec![modified],
        });
    }

    /// Rebuilds a key index whose only revision left in the backend is a
    /// tombstone (a compaction at it kept it, everything before is gone):
    /// one generation holding the tombstone, created at an unknown
    /// revision, then the empty live one (etcd 3.5.18+, #19249).
    pub fn restore_tombstone(&mut self, main: i64, sub: i64) {
        self.generations.reserve_exact(2);
        self.restore(Revision::default(), Revision::new(main, sub), 1);
        self.generations.push(Generation::default());
    }

    /// Records a delete at `(main, sub)`: the tombstone ends the live
    /// generation and a new empty one begins. Errors if the key is not
    /// live (its last generation is empty).
    pub fn tombstone(&mut self, main: i64, sub: i64) -> Result<(), RevisionNotFound> {
        match self.generations.last() {
            Some(g) if !g.is_empty() => {}
            _ => return Err(RevisionNotFound),
        }
        self.put(main, sub);
        self.generations.push(Generation::default());
        Ok(())
    }

    /// The stored row size of the key's revision `rev` when the index
    /// knows it: `rev` is the key's newest revision, put with
    /// [`KeyIndex::put_sized`] (or sized at restore).
    pub fn row_len(&self, rev: Revision) -> Option<u32> {
        (self.last_len != UNKNOWN_LEN && rev == self.modified()).then_some(self.last_len)
    }

    /// The key as of `at_rev`: `(modified, created, version)`, or
    /// `RevisionNotFound` if the key did not exist then.
    pub fn get(&self, at_rev: i64) -> Result<(Revision, Revision, i64), RevisionNotFound> {
        let g = self.find_generation(at_rev).ok_or(RevisionNotFound)?;
        let n = g.walk(|r| r.main > at_rev).ok_or(RevisionNotFound)?;
        Ok((g.revs[n], g.created, g.ver - (g.revs.len() - n - 1) as i64))
    }

    /// Revisions since `rev` (main >= rev), across generations, keeping only
    /// the last sub-revision of each main revision.
    pub fn since(&self, rev: i64) -> Vec<Revision> {
        if self.generations.is_empty() {
            return Vec::new();
        }
        let since = Revision::new(rev, 0);
        // find the generation to start from
        let mut gi = self.generations.len() - 1;
        while gi > 0 {
            let g = &self.generations[gi];
            if !g.is_empty() && since > g.created {
                break;
            }
            gi -= 1;
        }
        let mut revs: Vec<Revision> = Vec::new();
        let mut last = 0i64;
        for g in &self.generations[gi..] {
            for &r in &g.revs {
                if since > r {
                    continue;
                }
                if r.main == last {
                    *revs.last_mut().expect("pushed before") = r;
                    continue;
                }
                revs.push(r);
                last = r.main;
            }
        }
        revs
    }

    /// Compacts the history at `at_rev`; adds the revisions that must stay
    /// in the backend to `available`. See the module documentation.
    pub fn compact(&mut self, at_rev: i64, available: &mut HashSet<Revision>) {
        if self.generations.is_empty() {
            return;
        }
        let (gen_idx, rev_index) = self.do_compact(at_rev, available);
        let g = &mut self.generations[gen_idx];
        if !g.is_empty() {
            if let Some(ri) = rev_index {
                g.revs.drain(..ri);
            }
            // etcd 3.5.16+ (#18474): a tombstone at `at_rev` is kept (a
            // watch from the compaction revision gets the delete); it goes
            // with the next compaction above it.
        }
        for (i, ri) in self.reborn_at(gen_idx, at_rev, available) {
            self.generations[i].revs.drain(..ri);
        }
        self.generations.drain(..gen_idx);
    }

    /// The generations after `gen_idx` that began at `at_rev` itself:
    /// the key was deleted and put again in the revision compacted at (a
    /// Txn whose from-key delete covers a key it puts), after the tombstone
    /// kept at `at_rev`. Each one's latest revision `<= at_rev` is what the
    /// key holds at `at_rev`: it joins `available` (etcd's first
    /// generation rule alone would let the compaction delete it while the
    /// index still lists it). Returns each with the index of that revision.
    fn reborn_at(
        &self,
        gen_idx: usize,
        at_rev: i64,
        available: &mut HashSet<Revision>,
    ) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for (i, g) in self.generations.iter().enumerate().skip(gen_idx + 1) {
            if g.revs.first().is_none_or(|r| r.main > at_rev) {
                break;
            }
            if let Some(ri) = g.walk(|r| r.main > at_rev) {
                available.insert(g.revs[ri]);
                out.push((i, ri));
            }
        }
        out
    }

    /// The `available` set `compact(at_rev)` would produce, without changing
    /// the index.
    pub fn keep(&self, at_rev: i64, available: &mut HashSet<Revision>) {
        if self.is_empty() {
            return;
        }
        let (gen_idx, rev_index) = self.do_compact(at_rev, available);
        let g = &self.generations[gen_idx];
        if !g.is_empty()
            && rev_index == Some(g.revs.len() - 1)
            && gen_idx != self.generations.len() - 1
        {
            // the kept revision is a tombstone: unlike `compact`, left
            // out, so that HashKV hashes what etcd < 3.5.16 (which deleted
            // it) hashes
            available.remove(&g.revs[g.revs.len() - 1]);
        }
        for (i, ri) in self.reborn_at(gen_idx, at_rev, available) {
            let g = &self.generations[i];
            if ri == g.revs.len() - 1 && i != self.generations.len() - 1 {
                // a tombstone again
                available.remove(&g.revs[ri]);
            }
        }
    }

    /// Finds the first generation whose tombstone is at or after `at_rev`
    /// (or the last one) and, in it, the latest revision `<= at_rev`, which
    /// is added to `available`.
    fn do_compact(&self, at_rev: i64, available: &mut HashSet<Revision>) -> (usize, Option<usize>) {
        let mut gen_idx = 0;
        while gen_idx < self.generations.len() - 1 {
            let g = &self.generations[gen_idx];
            if g.revs
                .last()
                .expect("a closed generation has a tombstone")
                .main
                >= at_rev
            {
                break;
            }
            gen_idx += 1;
        }
        let rev_index = self.generations[gen_idx].walk(|r| {
            if r.main <= at_rev {
                available.insert(r);
                false
            } else {
                true
            }
        });
        (gen_idx, rev_index)
    }

    /// True when the index holds nothing but one empty generation (or
    /// nothing at all): the key can be dropped from the tree.
    pub fn is_empty(&self) -> bool {
        self.generations.is_empty()
            || (self.generations.len() == 1 && self.generations[0].is_empty())
    }

    /// The generation alive at `rev`, if any.
    pub fn find_generation(&self, rev: i64) -> Option<&Generation> {
        let last = self.generations.len().checked_sub(1)?;
        let mut cg = last as isize;
        while cg >= 0 {
            let g = &self.generations[cg as usize];
            if g.revs.is_empty() {
                cg -= 1;
                continue;
            }
            if cg as usize != last && g.revs[g.revs.len() - 1].main <= rev {
                // the key was deleted at or before rev
                return None;
            }
            if g.revs[0].main <= rev {
                return Some(g);
            }
            cg -= 1;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(main: i64) -> Revision {
        Revision::new(main, 0)
    }

    /// etcd's newTestKeyIndex:
    /// ```text
    ///    {empty}
    ///    {{14, 0}[1], {14, 1}[2], {16, 0}(t)[3]}
    ///    {{8, 0}[1], {10, 0}[2], {12, 0}(t)[3]}
    ///    {{2, 0}[1], {4, 0}[2], {6, 0}(t)[3]}
    /// ```
    #[test]
    fn test_restored_index_allocates_exactly() {
        // A restarted member rebuilds every key's index with `restore`: it
        // must take no more memory than the same key written by a put.
        let mut put = KeyIndex::new();
        put.put(5, 0);
        let mut restored = KeyIndex::new();
        restored.restore(Revision::new(5, 0), Revision::new(5, 0), 1);
        assert_eq!(restored.generations, put.generations);
        assert_eq!(restored.generations.capacity(), 1);
        assert_eq!(restored.generations[0].revs.capacity(), 1);
        assert_eq!(put.generations.capacity(), 1);
        let mut tomb = KeyIndex::new();
        tomb.restore_tombstone(7, 0);
        assert_eq!(tomb.generations.len(), 2);
        assert_eq!(tomb.generations.capacity(), 2);
    }

    #[test]
    fn test_row_len_of_the_newest_put_only() {
        assert_eq!(std::mem::size_of::<KeyIndex>(), 32);
        let mut ki = KeyIndex::new();
        ki.put_sized(2, 0, 100);
        assert_eq!(ki.row_len(r(2)), Some(100));
        ki.put_sized(3, 0, 50);
        assert_eq!((ki.row_len(r(2)), ki.row_len(r(3))), (None, Some(50)));
        // a tombstone, an unsized put, a size past u32: unknown
        ki.tombstone(4, 0).unwrap();
        assert_eq!((ki.row_len(r(3)), ki.row_len(r(4))), (None, None));
        assert_eq!(ki.modified(), r(4));
        ki.put_sized(5, 0, 70);
        assert_eq!(ki.row_len(r(5)), Some(70));
        ki.put(6, 0);
        assert_eq!(ki.row_len(r(6)), None);
        ki.put_sized(7, 0, u32::MAX as usize + 1);
        assert_eq!(ki.row_len(r(7)), None);
        // compaction keeps the newest revision and its size
        ki.put_sized(8, 0, 9);
        ki.compact(8, &mut HashSet::new());
        assert_eq!((ki.modified(), ki.row_len(r(8))), (r(8), Some(9)));
        let mut restored = KeyIndex::new();
        restored.restore(r(5), r(9), 3);
        assert_eq!(restored.row_len(r(9)), None);
        restored.set_last_row_len(12);
        assert_eq!(restored.row_len(r(9)), Some(12));
    }

    fn new_test_key_index() -> KeyIndex {
        let mut ki = KeyIndex::new();
        ki.put(2, 0);
        ki.put(4, 0);
        ki.tombstone(6, 0).unwrap();
        ki.put(8, 0);
        ki.put(10, 0);
        ki.tombstone(12, 0).unwrap();
        ki.put(14, 0);
        ki.put(14, 1);
        ki.tombstone(16, 0).unwrap();
        ki
    }

    #[test]
    fn test_key_index_get() {
        let mut ki = new_test_key_index();
        ki.compact(4, &mut HashSet::new());
        let nf = Err(RevisionNotFound);
        let tests: Vec<(i64, Result<(Revision, Revision, i64), RevisionNotFound>)> = vec![
            (17, nf),
            (16, nf),
            (15, Ok((Revision::new(14, 1), r(14), 2))),
            (14, Ok((Revision::new(14, 1), r(14), 2))),
            (13, nf),
            (12, nf),
            (11, Ok((r(10), r(8), 2))),
            (10, Ok((r(10), r(8), 2))),
            (9, Ok((r(8), r(8), 1))),
            (8, Ok((r(8), r(8), 1))),
            (7, nf),
            (6, nf),
            (5, Ok((r(4), r(2), 2))),
            (4, Ok((r(4), r(2), 2))),
            (3, nf),
            (2, nf),
            (1, nf),
            (0, nf),
        ];
        for (rev, want) in tests {
            assert_eq!(ki.get(rev), want, "get({rev})");
        }
    }

    #[test]
    fn test_key_index_since() {
        let mut ki = new_test_key_index();
        ki.compact(4, &mut HashSet::new());
        let all = [r(4), r(6), r(8), r(10), r(12), Revision::new(14, 1), r(16)];
        let tests: [(i64, usize); 17] = [
            (16, 6),
            (15, 6),
            (14, 5),
            (13, 5),
            (12, 4),
            (11, 4),
            (10, 3),
            (9, 3),
            (8, 2),
            (7, 2),
            (6, 1),
            (5, 1),
            (4, 0),
            (3, 0),
            (2, 0),
            (1, 0),
            (0, 0),
        ];
        assert!(ki.since(17).is_empty());
        for (rev, from) in tests {
            assert_eq!(ki.since(rev), all[from..].to_vec(), "since({rev})");
        }
    }

    #[test]
    fn test_key_index_put() {
        let mut ki = KeyIndex::new();
        ki.put(5, 0);
        assert_eq!(ki.modified(), r(5));
        assert_eq!(
            ki.generations,
            vec![Generation {
                ver: 1,
                created: r(5),
                revs: vec![r(5)]
            }]
        );
        ki.put(7, 0);
        assert_eq!(ki.modified(), r(7));
        assert_eq!(
            ki.generations,
            vec![Generation {
                ver: 2,
                created: r(5),
                revs: vec![r(5), r(7)]
            }]
        );
    }

    #[test]
    #[should_panic(expected = "unexpected smaller revision")]
    fn test_key_index_put_smaller_revision_panics() {
        let mut ki = KeyIndex::new();
        ki.put(5, 0);
        ki.put(4, 0);
    }

    #[test]
    fn test_key_index_restore() {
        let mut ki = KeyIndex::new();
        ki.restore(r(5), r(7), 2);
        assert_eq!(ki.modified(), r(7));
        assert_eq!(
            ki.generations,
            vec![Generation {
                ver: 2,
                created: r(5),
                revs: vec![r(7)]
            }]
        );
        assert_eq!(ki.get(7), Ok((r(7), r(5), 2)));
    }

    #[test]
    fn test_key_index_tombstone() {
        let mut ki = KeyIndex::new();
        ki.put(5, 0);
        ki.tombstone(7, 0).unwrap();
        assert_eq!(ki.modified(), r(7));
        assert_eq!(
            ki.generations,
            vec![
                Generation {
                    ver: 2,
                    created: r(5),
                    revs: vec![r(5), r(7)]
                },
                Generation::default()
            ]
        );
        ki.put(8, 0);
        ki.put(9, 0);
        ki.tombstone(15, 0).unwrap();
        assert_eq!(ki.modified(), r(15));
        assert_eq!(
            ki.generations,
            vec![
                Generation {
                    ver: 2,
                    created: r(5),
                    revs: vec![r(5), r(7)]
                },
                Generation {
                    ver: 3,
                    created: r(8),
                    revs: vec![r(8), r(9), r(15)]
                },
                Generation::default(),
            ]
        );
        assert_eq!(ki.tombstone(16, 0), Err(RevisionNotFound));
    }

    /// Expected (first generation's revs, number of generations, available)
    /// after compact(rev) of new_test_key_index, from etcd's table.
    fn compact_expectations() -> Vec<(i64, Vec<Revision>, usize, Vec<Revision>)> {
        let g1 = vec![r(2), r(4), r(6)];
        let g2 = vec![r(8), r(10), r(12)];
        let g3 = vec![r(14), Revision::new(14, 1), r(16)];
        vec![
            (1, g1.clone(), 4, vec![]),
            (2, g1.clone(), 4, vec![r(2)]),
            (3, g1.clone(), 4, vec![r(2)]),
            (4, vec![r(4), r(6)], 4, vec![r(4)]),
            (5, vec![r(4), r(6)], 4, vec![r(4)]),
            (6, vec![r(6)], 4, vec![r(6)]),
            (7, g2.clone(), 3, vec![]),
            (8, g2.clone(), 3, vec![r(8)]),
            (9, g2.clone(), 3, vec![r(8)]),
            (10, vec![r(10), r(12)], 3, vec![r(10)]),
            (11, vec![r(10), r(12)], 3, vec![r(10)]),
            (12, vec![r(12)], 3, vec![r(12)]),
            (13, g3.clone(), 2, vec![]),
            (
                14,
                vec![Revision::new(14, 1), r(16)],
                2,
                vec![Revision::new(14, 1)],
            ),
            (
                15,
                vec![Revision::new(14, 1), r(16)],
                2,
                vec![Revision::new(14, 1)],
            ),
            (16, vec![r(16)], 2, vec![r(16)]),
            (17, vec![], 1, vec![]),
        ]
    }

    /// Deleted and put again within one revision (a Txn whose from-key
    /// delete covers a key it puts), then compacted at that revision: the
    /// put survives the compaction, and so does the value it reads.
    #[test]
    fn test_compact_keeps_a_key_put_again_in_the_compacted_revision() {
        let rv = Revision::new;
        let mut ki = KeyIndex::new();
        ki.put(2, 0);
        ki.tombstone(3, 0).unwrap();
        ki.put(3, 1);
        let mut kept = HashSet::new();
        ki.keep(3, &mut kept);
        assert_eq!(kept, HashSet::from([rv(3, 1)]));
        let mut available = HashSet::new();
        ki.compact(3, &mut available);
        assert_eq!(available, HashSet::from([rv(3, 0), rv(3, 1)]));
        assert_eq!(ki.get(3).map(|(m, ..)| m), Ok(rv(3, 1)));
        // put, then deleted again in the same revision
        let mut ki = KeyIndex::new();
        ki.put(2, 0);
        ki.tombstone(3, 0).unwrap();
        ki.put(3, 1);
        ki.tombstone(3, 2).unwrap();
        let mut kept = HashSet::new();
        ki.keep(3, &mut kept);
        assert!(kept.is_empty(), "{kept:?}");
        let mut available = HashSet::new();
        ki.compact(3, &mut available);
        assert_eq!(available, HashSet::from([rv(3, 0), rv(3, 2)]));
        assert!(ki.get(3).is_err());
        // every revision the index still lists is available or above 3
        for g in &ki.generations {
            for r in &g.revs {
                assert!(
                    r.main > 3 || available.contains(r),
                    "{r:?} listed, not kept"
                );
            }
        }
    }

    fn check_compact(
        ki: &mut KeyIndex,
        rev: i64,
        first: &[Revision],
        ngen: usize,
        avail: &[Revision],
    ) {
        let want: HashSet<Revision> = avail.iter().copied().collect();
        let before = ki.clone();
        let mut kept = HashSet::new();
        ki.keep(rev, &mut kept);
        assert_eq!(*ki, before, "keep({rev}) must not change the index");
        // a tombstone at `rev` is kept by compact, not by keep
        let tombstone_at_rev = ki.generations[..ki.generations.len() - 1]
            .iter()
            .any(|g| g.revs.last().is_some_and(|t| t.main == rev));
        if tombstone_at_rev {
            assert!(kept.is_empty(), "keep({rev}) at a tombstone: {kept:?}");
        } else {
            assert_eq!(kept, want, "keep({rev})");
        }
        let mut am = HashSet::new();
        ki.compact(rev, &mut am);
        assert_eq!(am, want, "compact({rev}) available");
        assert_eq!(ki.generations.len(), ngen, "compact({rev}) generations");
        assert_eq!(
            ki.generations[0].revs, first,
            "compact({rev}) first generation"
        );
    }

    #[test]
    fn test_key_index_compact_and_keep() {
        // continuous compaction
        let mut ki = new_test_key_index();
        for (rev, first, ngen, avail) in compact_expectations() {
            check_compact(&mut ki, rev, &first, ngen, &avail);
        }
        // jump compaction
        let mut ki = new_test_key_index();
        for (i, (rev, first, ngen, avail)) in compact_expectations().into_iter().enumerate() {
            if (i % 2 == 0 && i < 6) || (i % 2 == 1 && i > 6) {
                check_compact(&mut ki, rev, &first, ngen, &avail);
            }
        }
        // once compaction
        for (rev, first, ngen, avail) in compact_expectations() {
            let mut ki = new_test_key_index();
            check_compact(&mut ki, rev, &first, ngen, &avail);
        }
    }

    #[test]
    fn test_key_index_compact_on_further_rev() {
        let mut ki = KeyIndex::new();
        ki.put(1, 0);
        ki.put(2, 0);
        let mut am = HashSet::new();
        ki.compact(1, &mut am);
        ki.compact(2, &mut am);
        assert_eq!(
            ki.generations,
            vec![Generation {
                ver: 2,
                created: r(1),
                revs: vec![r(2)]
            }]
        );
        assert!(am.contains(&r(2)));
    }

    #[test]
    fn test_key_index_is_empty() {
        let mut ki = KeyIndex::new();
        assert!(ki.is_empty());
        ki.put(2, 0);
        assert!(!ki.is_empty());
        ki.tombstone(3, 0).unwrap();
        assert!(!ki.is_empty());
        // the tombstone at the compaction revision stays
        ki.compact(3, &mut HashSet::new());
        assert!(!ki.is_empty());
        ki.compact(4, &mut HashSet::new());
        assert!(ki.is_empty());
    }

    #[test]
    fn test_key_index_restore_tombstone() {
        // etcd's TestRestoreTombstone
        let mut ki = KeyIndex::new();
        ki.restore_tombstone(16, 0);
        for at in 16..=20 {
            assert_eq!(ki.get(at), Err(RevisionNotFound));
        }
        let mut avail = HashSet::new();
        ki.do_compact(16, &mut avail);
        assert_eq!(avail, HashSet::from([r(16)]));
        ki.put(17, 0);
        ki.put(18, 0);
        assert_eq!(ki.since(16), vec![r(16), r(17), r(18)]);
        ki.compact(17, &mut HashSet::new());
        assert_eq!(ki.generations.len(), 1);
        assert_eq!(ki.generations[0].revs, vec![r(17), r(18)]);
    }

    #[test]
    fn test_key_index_find_generation() {
        let ki = new_test_key_index();
        let tests: [(i64, Option<usize>); 17] = [
            (0, None),
            (1, None),
            (2, Some(0)),
            (3, Some(0)),
            (4, Some(0)),
            (5, Some(0)),
            (6, None),
            (7, None),
            (8, Some(1)),
            (9, Some(1)),
            (10, Some(1)),
            (11, Some(1)),
            (12, None),
            (13, None),
            (14, Some(2)),
            (15, Some(2)),
            (16, None),
        ];
        for (rev, want) in tests {
            let got = ki.find_generation(rev).map(|g| {
                ki.generations
                    .iter()
                    .position(|x| std::ptr::eq(x, g))
                    .unwrap()
            });
            assert_eq!(got, want, "find_generation({rev})");
        }
    }

    #[test]
    fn test_generation_walk() {
        let g = Generation {
            ver: 3,
            created: r(2),
            revs: vec![r(2), r(4), r(6)],
        };
        assert_eq!(g.walk(|rev| rev.main >= 7), Some(2));
        assert_eq!(g.walk(|rev| rev.main >= 6), Some(1));
        assert_eq!(g.walk(|rev| rev.main >= 5), Some(1));
        assert_eq!(g.walk(|rev| rev.main >= 4), Some(0));
        assert_eq!(g.walk(|rev| rev.main >= 1), None);
    }
}
