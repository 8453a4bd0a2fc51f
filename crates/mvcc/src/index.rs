//! `TreeIndex`: the in-memory ordered map from key to [`KeyIndex`].
//!
//! Ranges follow etcd's conventions through [`KeyRange`]: an empty
//! `range_end` names one key, `"\0"` means every key `>= key`, anything else
//! is the half-open interval `[key, range_end)` (empty if `range_end <= key`).

use smallvec::SmallVec;
use std::collections::{BTreeMap, HashSet};
use std::ops::Bound;

use crate::key_index::{KeyIndex, RevisionNotFound};
use crate::revision::Revision;

/// Which keys a request names; see the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyRange<'a> {
    /// Exactly this key.
    Single(&'a [u8]),
    /// Every key `>= from`.
    From(&'a [u8]),
    /// Every key in `[from, to)`.
    Between(&'a [u8], &'a [u8]),
}

impl<'a> KeyRange<'a> {
    /// Interprets a request's `key` and `range_end` as etcd does.
    pub fn new(key: &'a [u8], range_end: &'a [u8]) -> KeyRange<'a> {
        match range_end {
            [] => KeyRange::Single(key),
            [0] => KeyRange::From(key),
            end => KeyRange::Between(key, end),
        }
    }

    /// Whether `k` lies in the range.
    pub fn contains(&self, k: &[u8]) -> bool {
        match *self {
            KeyRange::Single(key) => k == key,
            KeyRange::From(from) => k >= from,
            KeyRange::Between(from, to) => k >= from && k < to,
        }
    }
}

/// A key as the index holds it: up to 16 bytes inside the tree's node,
/// longer ones on the heap; 24 bytes either way, as a `Vec` is. A search
/// compares the keys of each node it passes, and keys behind pointers cost
/// a cache miss per comparison: on 100k 8-byte keys the index search was
/// the largest part of applying a put.
type IndexKey = SmallVec<[u8; 16]>;

/// Ordered map key -> [`KeyIndex`].
#[derive(Clone, Debug, Default)]
pub struct TreeIndex {
    tree: BTreeMap<IndexKey, KeyIndex>,
}

impl TreeIndex {
    /// An empty index.
    pub fn new() -> TreeIndex {
        TreeIndex::default()
    }

    /// Number of keys with a history (live or not yet compacted away).
    pub fn len(&self) -> usize {
        self.tree.len()
    }

    /// Whether no key has a history.
    pub fn is_empty(&self) -> bool {
        self.tree.is_empty()
    }

    /// Records a put of `key` at `rev` (its row's size unknown).
    #[cfg(test)]
    pub fn put(&mut self, key: &[u8], rev: Revision) {
        self.put_sized(key, rev, usize::MAX);
    }

    /// Records a put of `key` at `rev` whose stored row is `row_len`
    /// bytes.
    pub fn put_sized(&mut self, key: &[u8], rev: Revision, row_len: usize) {
        // looked up first: a key written again allocates nothing
        if let Some(ki) = self.tree.get_mut(key) {
            ki.put_sized(rev.main, rev.sub, row_len);
        } else {
            let mut ki = KeyIndex::new();
            ki.put_sized(rev.main, rev.sub, row_len);
            self.tree.insert(IndexKey::from_slice(key), ki);
        }
    }

    /// The key index of `key` to update in place (one search for a put
    /// that reads what it replaces and records itself).
    pub fn key_index_mut(&mut self, key: &[u8]) -> Option<&mut KeyIndex> {
        self.tree.get_mut(key)
    }

    /// Records the first put of `key`, absent from the index (see
    /// [`TreeIndex::key_index_mut`]).
    pub fn put_new_sized(&mut self, key: &[u8], rev: Revision, row_len: usize) {
        let mut ki = KeyIndex::new();
        ki.put_sized(rev.main, rev.sub, row_len);
        let old = self.tree.insert(IndexKey::from_slice(key), ki);
        debug_assert!(old.is_none(), "put_new_sized of a key in the index");
    }

    /// Records a delete of `key` at `rev`; errors if the key is not live.
    pub fn tombstone(&mut self, key: &[u8], rev: Revision) -> Result<(), RevisionNotFound> {
        self.tree
            .get_mut(key)
            .ok_or(RevisionNotFound)?
            .tombstone(rev.main, rev.sub)
    }

    /// `key` as of `at_rev`: `(modified, created, version)`.
    pub fn get(
        &self,
        key: &[u8],
        at_rev: i64,
    ) -> Result<(Revision, Revision, i64), RevisionNotFound> {
        self.tree.get(key).ok_or(RevisionNotFound)?.get(at_rev)
    }

    /// The key index of `key`, if any.
    pub fn key_index(&self, key: &[u8]) -> Option<&KeyIndex> {
        self.tree.get(key)
    }

    /// Mutable access for rebuilding from the backend.
    pub(crate) fn key_index_entry(&mut self, key: &[u8]) -> &mut KeyIndex {
        // allocate the key only when it is new
        if self.tree.contains_key(key) {
            return self.tree.get_mut(key).expect("present");
        }
        self.tree.entry(IndexKey::from_slice(key)).or_default()
    }

    fn visit_keys<'a>(
        &'a self,
        range: KeyRange<'_>,
    ) -> Box<dyn Iterator<Item = (&'a IndexKey, &'a KeyIndex)> + 'a> {
        match range {
            KeyRange::Single(key) => Box::new(self.tree.get_key_value(key).into_iter()),
            KeyRange::From(from) => Box::new(
                self.tree
                    .range::<[u8], _>((Bound::Included(from), Bound::Unbounded)),
            ),
            KeyRange::Between(from, to) if from < to => Box::new(
                self.tree
                    .range::<[u8], _>((Bound::Included(from), Bound::Excluded(to))),
            ),
            KeyRange::Between(..) => Box::new(std::iter::empty()),
        }
    }

    fn visit<'a>(&'a self, range: KeyRange<'_>) -> impl Iterator<Item = &'a KeyIndex> + 'a {
        self.visit_keys(range).map(|(_, v)| v)
    }

    /// Keys live at `at_rev` in `range`, in key order, with their revision.
    pub fn range(&self, range: KeyRange<'_>, at_rev: i64) -> Vec<(Vec<u8>, Revision)> {
        self.visit_keys(range)
            .filter_map(|(k, ki)| ki.get(at_rev).ok().map(|(m, _, _)| (k.to_vec(), m)))
            .collect()
    }

    /// Revisions of the keys live at `at_rev` in `range`, in key order.
    pub fn revisions(&self, range: KeyRange<'_>, at_rev: i64) -> Vec<Revision> {
        self.visit(range)
            .filter_map(|ki| ki.get(at_rev).ok().map(|(m, _, _)| m))
            .collect()
    }

    /// Like [`TreeIndex::revisions`], but keeps only the first `cap`
    /// (0: all). With `count`, it still visits the whole range and returns
    /// how many keys are live there; without, it stops at `cap` and returns
    /// the number kept. With `lens`, each kept revision's stored row size
    /// is pushed there too, `u32::MAX` where the index does not know it
    /// ([`KeyIndex::row_len`]).
    pub fn revisions_capped(
        &self,
        range: KeyRange<'_>,
        at_rev: i64,
        cap: usize,
        count: bool,
        mut lens: Option<&mut Vec<u32>>,
    ) -> (Vec<Revision>, usize) {
        let mut revs = Vec::with_capacity(cap.min(4096));
        let mut total = 0;
        for ki in self.visit(range) {
            let Ok((m, _, _)) = ki.get(at_rev) else {
                continue;
            };
            if cap == 0 || revs.len() < cap {
                revs.push(m);
                if let Some(lens) = lens.as_deref_mut() {
                    lens.push(ki.row_len(m).unwrap_or(u32::MAX));
                }
            } else if !count {
                break;
            }
            total += 1;
        }
        (revs, total)
    }

    /// Number of keys live at `at_rev` in `range`.
    pub fn count_revisions(&self, range: KeyRange<'_>, at_rev: i64) -> usize {
        self.visit(range)
            .filter(|ki| ki.get(at_rev).is_ok())
            .count()
    }

    /// Revisions since `rev` of the keys in `range` (for watch catch-up),
    /// ordered by revision.
    pub fn range_since(&self, range: KeyRange<'_>, rev: i64) -> Vec<Revision> {
        let mut revs: Vec<Revision> = self.visit(range).flat_map(|ki| ki.since(rev)).collect();
        revs.sort();
        revs
    }

    /// Compacts every key at `rev`, dropping keys left empty; returns the
    /// revisions `<= rev` that must stay in the backend.
    pub fn compact(&mut self, rev: i64) -> HashSet<Revision> {
        let mut available = HashSet::new();
        self.tree.retain(|_, ki| {
            ki.compact(rev, &mut available);
            !ki.is_empty()
        });
        available
    }

    /// [`TreeIndex::compact`] for at most `n` keys from `from` on
    /// (exclusive; None: from the first key), adding their kept revisions
    /// to `keep`. Returns the last key it compacted when keys remain after
    /// it, None when it reached the end. Compacting chunk by chunk gives
    /// the same index and keep set as one `compact`; the compactor releases
    /// the index lock between chunks.
    pub fn compact_chunk(
        &mut self,
        rev: i64,
        from: Option<&[u8]>,
        n: usize,
        keep: &mut HashSet<Revision>,
    ) -> Option<Vec<u8>> {
        use std::ops::Bound;
        let lower = match from {
            Some(k) => Bound::Excluded(k),
            None => Bound::Unbounded,
        };
        let mut empty = Vec::new();
        let mut last = None;
        let range = self.tree.range_mut::<[u8], _>((lower, Bound::Unbounded));
        for (k, ki) in range.take(n) {
            ki.compact(rev, keep);
            if ki.is_empty() {
                empty.push(k.clone());
            }
            last = Some(k);
        }
        let more = last.map(|l| l.to_vec()).and_then(|l| {
            self.tree
                .range::<[u8], _>((Bound::Excluded(l.as_slice()), Bound::Unbounded))
                .next()
                .map(|_| l)
        });
        for k in empty {
            self.tree.remove(&k);
        }
        more
    }

    /// What `compact(rev)` would return, without changing anything.
    pub fn keep(&self, rev: i64) -> HashSet<Revision> {
        let mut available = HashSet::new();
        for ki in self.tree.values() {
            ki.keep(rev, &mut available);
        }
        available
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(main: i64) -> Revision {
        Revision::new(main, 0)
    }

    #[test]
    fn test_compact_in_chunks_is_one_compact() {
        let mut one = TreeIndex::new();
        for i in 0..50u8 {
            let k = [b'k', i];
            one.put(&k, r(10 + i as i64 * 3));
            one.put(&k, r(11 + i as i64 * 3));
            if i % 3 == 0 {
                one.tombstone(&k, r(12 + i as i64 * 3)).unwrap();
            }
        }
        for rev in [5, 40, 90, 200] {
            for n in [1, 7, 50, 100] {
                let mut whole = one.clone();
                let want = whole.compact(rev);
                let mut chunked = one.clone();
                let mut keep = HashSet::new();
                let mut from: Option<Vec<u8>> = None;
                let mut chunks = 0;
                while let Some(k) = chunked.compact_chunk(rev, from.as_deref(), n, &mut keep) {
                    from = Some(k);
                    chunks += 1;
                    assert!(chunks <= 50, "no progress");
                }
                assert_eq!(keep, want, "rev {rev} n {n}");
                assert_eq!(chunked.tree, whole.tree, "rev {rev} n {n}");
            }
        }
    }

    #[test]
    fn test_index_get() {
        let mut ti = TreeIndex::new();
        ti.put(b"foo", r(2));
        ti.put(b"foo", r(4));
        ti.tombstone(b"foo", r(6)).unwrap();
        assert_eq!(ti.get(b"foo", 0), Err(RevisionNotFound));
        assert_eq!(ti.get(b"foo", 1), Err(RevisionNotFound));
        assert_eq!(ti.get(b"foo", 2), Ok((r(2), r(2), 1)));
        assert_eq!(ti.get(b"foo", 3), Ok((r(2), r(2), 1)));
        assert_eq!(ti.get(b"foo", 4), Ok((r(4), r(2), 2)));
        assert_eq!(ti.get(b"foo", 5), Ok((r(4), r(2), 2)));
        assert_eq!(ti.get(b"foo", 6), Err(RevisionNotFound));
    }

    #[test]
    fn test_index_range() {
        let mut ti = TreeIndex::new();
        let keys: [&[u8]; 3] = [b"foo", b"foo1", b"foo2"];
        for (i, k) in keys.iter().enumerate() {
            ti.put(k, r(i as i64 + 1));
        }
        let at = 6;
        let cases: Vec<(KeyRange, Vec<&[u8]>)> = vec![
            (KeyRange::new(b"foo", b""), vec![b"foo"]),
            (KeyRange::new(b"doo", b""), vec![]),
            (KeyRange::new(b"foo", b"foo1"), vec![b"foo"]),
            (KeyRange::new(b"foo", b"foo2"), vec![b"foo", b"foo1"]),
            (
                KeyRange::new(b"foo", b"fop"),
                vec![b"foo", b"foo1", b"foo2"],
            ),
            (KeyRange::new(b"foo1", b"fop"), vec![b"foo1", b"foo2"]),
            (KeyRange::new(b"foo1", b"\0"), vec![b"foo1", b"foo2"]),
            (KeyRange::new(b"\0", b"\0"), vec![b"foo", b"foo1", b"foo2"]),
            (KeyRange::new(b"foo3", b"fop"), vec![]),
            (KeyRange::new(b"fop", b"foo"), vec![]),
        ];
        for (range, want) in cases {
            let got: Vec<Vec<u8>> = ti.range(range, at).into_iter().map(|(k, _)| k).collect();
            let want: Vec<Vec<u8>> = want.into_iter().map(|k| k.to_vec()).collect();
            assert_eq!(got, want, "{range:?}");
            assert_eq!(ti.count_revisions(range, at), want.len());
            assert_eq!(ti.revisions(range, at).len(), want.len());
        }
        // at rev 2 only foo and foo1 existed
        assert_eq!(ti.count_revisions(KeyRange::new(b"\0", b"\0"), 2), 2);
    }

    #[test]
    fn test_index_tombstone() {
        let mut ti = TreeIndex::new();
        ti.put(b"foo", r(1));
        ti.tombstone(b"foo", r(2)).unwrap();
        assert_eq!(ti.get(b"foo", 2), Err(RevisionNotFound));
        assert_eq!(ti.tombstone(b"foo", r(3)), Err(RevisionNotFound));
        assert_eq!(ti.tombstone(b"bar", r(3)), Err(RevisionNotFound));
    }

    #[test]
    fn test_index_range_since() {
        let mut ti = TreeIndex::new();
        ti.put(b"foo", r(1));
        ti.put(b"foo1", r(2));
        ti.put(b"foo", r(3));
        ti.tombstone(b"foo1", r(4)).unwrap();
        assert_eq!(
            ti.range_since(KeyRange::new(b"foo", b"fop"), 2),
            vec![r(2), r(3), r(4)]
        );
        assert_eq!(
            ti.range_since(KeyRange::new(b"foo", b""), 0),
            vec![r(1), r(3)]
        );
    }

    #[test]
    fn test_index_compact_and_keep() {
        let mut ti = TreeIndex::new();
        ti.put(b"foo", r(1));
        ti.put(b"foo1", r(2));
        ti.put(b"foo", Revision::new(3, 0));
        ti.put(b"foo2", Revision::new(3, 1));
        ti.tombstone(b"foo1", r(4)).unwrap();
        ti.put(b"foo", r(5));
        for rev in 1..=6 {
            let mut kept = ti.keep(rev);
            if rev == 4 {
                // compact keeps the tombstone at its revision, keep does not
                kept.insert(r(4));
            }
            let mut clone = ti.clone();
            assert_eq!(clone.compact(rev), kept, "rev {rev}");
        }
        let kept = ti.compact(4);
        let want: HashSet<Revision> = [Revision::new(3, 0), Revision::new(3, 1), r(4)]
            .into_iter()
            .collect();
        assert_eq!(kept, want);
        assert!(
            ti.key_index(b"foo1").is_some(),
            "a tombstone at the compaction revision stays"
        );
        assert_eq!(ti.len(), 3);
        let kept = ti.compact(5);
        assert!(!kept.contains(&r(4)));
        assert!(
            ti.key_index(b"foo1").is_none(),
            "a key deleted before the compaction goes"
        );
        assert_eq!(ti.len(), 2);
    }
}
