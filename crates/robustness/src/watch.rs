//! Watch validation: what each watcher received, checked on its own
//! (ordered, unique, atomic, bookmarkable, filters) and against the other
//! watchers and the KV history (reliable, resumable, prev_kv correct, no
//! phantom event, every acknowledged write seen at its revision).
//!
//! The traffic writes only under one prefix and every write that changes
//! the store changes a key under it, so a watcher of the whole prefix must
//! see *every* revision: a missing revision number is a lost event.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::history::{History, Kv, Request, Response};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventKind {
    Put,
    Delete,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchEvent {
    pub kind: EventKind,
    /// For a delete: key and `mod_revision` (the deletion revision) only.
    pub kv: Kv,
    pub prev_kv: Option<Kv>,
}

/// One thing a watcher's stream delivered (or that happened to it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum WatchItem {
    /// A response with events, received at `time` (ns on the run's clock).
    Events {
        header_rev: i64,
        events: Vec<WatchEvent>,
        #[serde(default)]
        time: u64,
    },
    /// A progress notification (response with no events, not created/canceled).
    Progress { rev: i64 },
    /// The stream broke (or was cancelled); the watcher reconnects from `resume_rev`.
    Restart { resume_rev: i64, reason: String },
    /// The resume revision was compacted; the watcher continues from `compact_rev`
    /// (events between are legitimately gone).
    Compacted { compact_rev: i64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Filter {
    None,
    NoPut,
    NoDelete,
}

/// What one watcher saw.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WatchRecord {
    pub id: usize,
    pub member: usize,
    pub filter: Filter,
    pub prev_kv: bool,
    /// The revision the watch was created at (first wanted event).
    pub start_rev: i64,
    pub items: Vec<WatchItem>,
}

impl WatchRecord {
    pub fn events(&self) -> impl Iterator<Item = &WatchEvent> {
        self.items.iter().flat_map(|i| match i {
            WatchItem::Events { events, .. } => events.as_slice(),
            _ => &[],
        })
    }

    pub fn last_rev(&self) -> i64 {
        self.events()
            .map(|e| e.kv.mod_revision)
            .max()
            .unwrap_or(self.start_rev - 1)
    }
}

/// Violations found, as readable lines.
#[derive(Debug, Default)]
pub struct WatchReport {
    pub violations: Vec<String>,
    /// Ground truth: every event by revision, merged from unfiltered watchers.
    pub events_by_rev: BTreeMap<i64, Vec<WatchEvent>>,
    /// Whether the ground truth can be trusted as the sequence of every
    /// revision: no revision missing up to the final one, the watchers
    /// agree, and replaying it is consistent (create revisions, versions,
    /// deletes of existing keys). Other watch violations (a lost event on
    /// one stream, a wrong `prev_kv`, an acknowledged write missing) leave
    /// it usable.
    pub truth_consistent: bool,
}

impl WatchReport {
    fn v(&mut self, s: String) {
        if self.violations.len() < 50 {
            self.violations.push(s);
        }
    }
}

fn same_event(a: &WatchEvent, b: &WatchEvent) -> bool {
    a.kind == b.kind && a.kv == b.kv
}

/// Checks every watcher. `init_rev` is the store revision before the
/// traffic started (watchers start at `init_rev + 1`); `final_rev` the
/// revision every watcher must have reached.
pub fn check(
    records: &[WatchRecord],
    history: &History,
    init_rev: i64,
    final_rev: i64,
) -> WatchReport {
    let mut rep = WatchReport {
        truth_consistent: true,
        ..Default::default()
    };
    // Per-watcher properties.
    for w in records {
        let mut last: i64 = w.start_rev - 1;
        let mut last_progress: i64 = 0;
        let mut last_in_stream: i64 = 0;
        let mut seen: HashSet<(String, i64)> = HashSet::new();
        let mut expect_next: Option<i64> = Some(w.start_rev);
        for item in &w.items {
            match item {
                WatchItem::Events {
                    header_rev, events, ..
                } => {
                    if events.is_empty() {
                        continue;
                    }
                    let first = events[0].kv.mod_revision;
                    if first <= last {
                        if first == last {
                            rep.v(format!("watcher {}: not atomic: events of revision {first} split over two responses", w.id));
                        } else {
                            rep.v(format!(
                                "watcher {}: not ordered: revision {first} after {last}",
                                w.id
                            ));
                        }
                    }
                    if first <= last_progress {
                        rep.v(format!("watcher {}: not bookmarkable: event at revision {first} after a progress notification at {last_progress}", w.id));
                    }
                    let mut prev_in = 0;
                    for e in events {
                        let r = e.kv.mod_revision;
                        if r < prev_in {
                            rep.v(format!(
                                "watcher {}: not ordered within a response: {r} after {prev_in}",
                                w.id
                            ));
                        }
                        if w.filter == Filter::None && r != prev_in {
                            if let Some(x) = expect_next {
                                if r != x {
                                    rep.v(format!("watcher {}: not reliable: expected revision {x}, got {r} (revisions {x}..{} missing)", w.id, r - 1));
                                }
                            }
                            expect_next = Some(r + 1);
                        }
                        prev_in = r;
                        if !seen.insert((e.kv.key.clone(), r)) {
                            rep.v(format!(
                                "watcher {}: not unique: event {} at revision {r} delivered twice",
                                w.id, e.kv.key
                            ));
                        }
                        match (w.filter, e.kind) {
                            (Filter::NoPut, EventKind::Put)
                            | (Filter::NoDelete, EventKind::Delete) => rep.v(format!(
                                "watcher {}: filter {:?} not respected: {:?} {} at {r}",
                                w.id, w.filter, e.kind, e.kv.key
                            )),
                            _ => {}
                        }
                        // prev_kv is read at r-1 and is legitimately absent once compacted (as in etcd).
                        let prev_compacted = history.compactions.iter().any(|&c| c > r - 1);
                        if w.prev_kv
                            && e.kind == EventKind::Delete
                            && e.prev_kv.is_none()
                            && !prev_compacted
                        {
                            rep.v(format!(
                                "watcher {}: delete of {} at {r} without prev_kv",
                                w.id, e.kv.key
                            ));
                        }
                        if !w.prev_kv && e.prev_kv.is_some() {
                            rep.v(format!(
                                "watcher {}: prev_kv sent though not asked for ({} at {r})",
                                w.id, e.kv.key
                            ));
                        }
                    }
                    if *header_rev < prev_in {
                        rep.v(format!("watcher {}: response header revision {header_rev} below its events' revision {prev_in}", w.id));
                    }
                    last = last.max(prev_in);
                    last_in_stream = last_in_stream.max(prev_in);
                }
                WatchItem::Progress { rev } => {
                    // Within one stream (a member may lag after a reconnect).
                    if *rev < last_in_stream {
                        rep.v(format!("watcher {}: progress notification at {rev} below the revision {last_in_stream} of an event on the same stream", w.id));
                    }
                    last_progress = last_progress.max(*rev);
                }
                WatchItem::Restart { resume_rev, .. } => {
                    last_in_stream = 0;
                    if *resume_rev != last.max(last_progress) + 1 {
                        // The harness resumes right after what it saw; anything else is a harness bug.
                        rep.v(format!(
                            "watcher {}: resumed at {resume_rev}, last seen {last}",
                            w.id
                        ));
                    }
                }
                WatchItem::Compacted { compact_rev } => {
                    expect_next = None;
                    last = last.max(compact_rev - 1);
                }
            }
        }
        if w.filter == Filter::None && w.last_rev() < final_rev {
            rep.v(format!("watcher {}: not reliable: stopped at revision {} before the final revision {final_rev}", w.id, w.last_rev()));
        }
    }
    // Ground truth from unfiltered watchers; they must agree.
    let mut truth: BTreeMap<i64, Vec<WatchEvent>> = BTreeMap::new();
    for w in records.iter().filter(|w| w.filter == Filter::None) {
        for item in &w.items {
            if let WatchItem::Events { events, .. } = item {
                let mut by: BTreeMap<i64, Vec<WatchEvent>> = BTreeMap::new();
                for e in events {
                    by.entry(e.kv.mod_revision).or_default().push(e.clone());
                }
                for (r, evs) in by {
                    match truth.get(&r) {
                        None => {
                            truth.insert(r, evs);
                        }
                        Some(t) => {
                            let eq = t.len() == evs.len()
                                && t.iter().zip(&evs).all(|(a, b)| same_event(a, b));
                            if !eq {
                                rep.truth_consistent = false;
                                rep.v(format!("watchers disagree at revision {r}: {t:?} vs (watcher {}) {evs:?}", w.id));
                            }
                        }
                    }
                }
            }
        }
    }
    // The union must have every revision.
    let mut expect = init_rev + 1;
    for &r in truth.keys() {
        if r != expect {
            rep.truth_consistent = false;
            rep.v(format!("no watcher saw revisions {expect}..{}", r - 1));
        }
        expect = r + 1;
    }
    if expect <= final_rev {
        rep.truth_consistent = false;
    }
    // Replay the truth: prev_kv, create/version consistency, and state by revision.
    let mut state: BTreeMap<String, Kv> = BTreeMap::new();
    let mut prev_of: HashMap<(String, i64), Option<Kv>> = HashMap::new();
    for (r, evs) in &truth {
        for e in evs {
            let before = state.get(&e.kv.key).cloned();
            match e.kind {
                EventKind::Put => {
                    let (c, v) = before
                        .as_ref()
                        .map(|b| (b.create_revision, b.version + 1))
                        .unwrap_or((*r, 1));
                    if e.kv.create_revision != c || e.kv.version != v {
                        rep.truth_consistent = false;
                        rep.v(format!(
                            "event put {} at {r}: create_revision {} version {}, expected {c} {v}",
                            e.kv.key, e.kv.create_revision, e.kv.version
                        ));
                    }
                    state.insert(e.kv.key.clone(), e.kv.clone());
                }
                EventKind::Delete => {
                    if before.is_none() {
                        rep.truth_consistent = false;
                        rep.v(format!(
                            "event delete {} at {r} of a key that does not exist",
                            e.kv.key
                        ));
                    }
                    state.remove(&e.kv.key);
                }
            }
            prev_of.insert((e.kv.key.clone(), *r), before);
        }
    }
    for w in records.iter().filter(|w| w.prev_kv) {
        for e in w.events() {
            if let Some(expected) = prev_of.get(&(e.kv.key.clone(), e.kv.mod_revision)) {
                let r = e.kv.mod_revision;
                let prev_compacted = history.compactions.iter().any(|&c| c > r - 1);
                if e.prev_kv != *expected && !(e.prev_kv.is_none() && prev_compacted) {
                    rep.v(format!(
                        "watcher {}: wrong prev_kv for {} at {}: got {:?}, expected {:?}",
                        w.id, e.kv.key, e.kv.mod_revision, e.prev_kv, expected
                    ));
                }
            }
        }
    }
    // Filtered watchers: exactly the matching events of the truth in the range they covered.
    for w in records.iter().filter(|w| w.filter != Filter::None) {
        let got: Vec<(String, i64)> = w
            .events()
            .map(|e| (e.kv.key.clone(), e.kv.mod_revision))
            .collect();
        let compacted = w
            .items
            .iter()
            .any(|i| matches!(i, WatchItem::Compacted { .. }));
        let hi = w.last_rev().max(final_rev);
        let want: Vec<(String, i64)> = truth
            .range(w.start_rev..=hi)
            .flat_map(|(_, evs)| evs.iter())
            .filter(|e| match w.filter {
                Filter::NoPut => e.kind == EventKind::Delete,
                Filter::NoDelete => e.kind == EventKind::Put,
                Filter::None => true,
            })
            .map(|e| (e.kv.key.clone(), e.kv.mod_revision))
            .collect();
        if !compacted && got != want {
            let missing: Vec<_> = want.iter().filter(|x| !got.contains(x)).take(5).collect();
            let extra: Vec<_> = got.iter().filter(|x| !want.contains(x)).take(5).collect();
            rep.v(format!("watcher {} ({:?}): events differ from the truth: missing {missing:?}, extra {extra:?}", w.id, w.filter));
        }
    }
    // Against the KV history: no phantom values, acknowledged writes seen.
    let mut written: HashSet<&str> = HashSet::new();
    for op in &history.ops {
        match &op.req {
            Request::Put { value, .. } | Request::Cas { value, .. } => {
                written.insert(value.as_str());
            }
            _ => {}
        }
    }
    for (r, evs) in &truth {
        for e in evs {
            if e.kind == EventKind::Put && !written.contains(e.kv.value.as_str()) {
                rep.v(format!(
                    "phantom event: put {}={} at {r} was never written by a client",
                    e.kv.key, e.kv.value
                ));
            }
        }
    }
    let max_truth = truth.keys().next_back().copied().unwrap_or(init_rev);
    for op in history.acknowledged_writes() {
        let (key, value, rev, kind) = match (&op.req, op.resp.as_ref()) {
            (Request::Put { key, value, .. }, Some(Response::Put { rev })) => {
                (key, Some(value), *rev, EventKind::Put)
            }
            (
                Request::Cas { key, value, .. },
                Some(Response::Cas {
                    succeeded: true,
                    rev,
                    ..
                }),
            ) => (key, Some(value), *rev, EventKind::Put),
            (Request::Delete { key }, Some(Response::Delete { deleted: 1, rev })) => {
                (key, None, *rev, EventKind::Delete)
            }
            _ => continue,
        };
        if rev > max_truth {
            rep.v(format!("acknowledged write {op} at revision {rev} beyond the last watched revision {max_truth}"));
            continue;
        }
        let ok = truth.get(&rev).is_some_and(|evs| {
            evs.iter().any(|e| {
                e.kind == kind && e.kv.key == *key && value.is_none_or(|v| e.kv.value == *v)
            })
        });
        if !ok {
            rep.v(format!("acknowledged write not in the watch history at its revision {rev}: {op}; events there: {:?}", truth.get(&rev)));
        }
    }
    // Serializable reads at revision R equal the state at R.
    if truth.keys().next().is_none_or(|&r| r == init_rev + 1) {
        for sr in &history.stale_reads {
            let at = truth
                .range(..=sr.rev)
                .rev()
                .flat_map(|(_, evs)| evs.iter().rev())
                .find(|e| e.kv.key == sr.key)
                .and_then(|e| (e.kind == EventKind::Put).then(|| e.kv.clone()));
            if at != sr.kv && sr.rev <= max_truth {
                rep.v(format!("serializable read of {} from member {} at revision {}: got {:?}, state at that revision is {:?}", sr.key, sr.member, sr.rev, sr.kv, at));
            }
        }
    }
    rep.events_by_rev = truth;
    rep
}
