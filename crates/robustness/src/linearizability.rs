//! Linearizability checking of a KV history: the Wing & Gong / Lowe search
//! (as in porcupine) over [`crate::model`], with a cache of
//! (consumed set, state set) pairs already explored, which also prunes a
//! configuration that differs from an explored one only in having
//! consumed more optional operations (everything from it was possible
//! from there: see `search`).
//!
//! The history becomes a list of call and return events in time order.
//! The search walks it: at a call it tries to linearize that operation now
//! (the model must accept its response) and restarts from the head; at a
//! return of an operation not yet linearized it backtracks. The history is
//! linearizable when every operation with a known response is linearized.
//!
//! **Unknown outcomes are optional operations** (`resp == None`): one may
//! take effect once between its call and its return (`ret`; `None` = no
//! bound) or not at all. The search linearizes one only where it changes
//! the state; at its return event it *skips* it (it did not happen, or
//! happened where it changed nothing), and backtracking over a skip goes
//! on backtracking (there was no other choice there). [`crate::patch`]
//! bounds most of them with evidence from the watch history.
//!
//! **The truth oracle.** With the watch history as ground truth
//! ([`crate::patch::Truth`]), a step that makes a new revision must make
//! exactly the truth's key space at that revision, and an optional
//! operation may not make a revision that an answered operation claims
//! (answered `Put`/`Delete`/`CAS` with that revision). A wrong order then
//! dies at the step that goes wrong instead of many steps later, and the
//! search is close to linear.
//!
//! **Segments.** The history is cut at *quiet points*: times no operation
//! spans (every operation called before has returned, optional ones have
//! passed their bound). Each segment is searched on its own from the set
//! of states the previous one can end in (all of them are enumerated), so a
//! hard stretch or a violation late in the history never makes the search
//! backtrack through the whole of it. A segment whose end states cannot be
//! enumerated within the budget is merged with the rest (plain search).
//!
//! On a violation, [`check`] also finds the *minimal failing prefix*: the
//! smallest time `t` such that the operations called before `t` (those
//! still running at `t` counted as unknown outcomes) are already not
//! linearizable. Its last operation is the one no order can explain. It is
//! looked for inside the failing segment only (earlier segments passed).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::time::{Duration, Instant};

use crate::history::{Operation, Request, Response};
use crate::model::{KvState, StateSet};
use crate::patch::Truth;
use crate::search::{claimed_rev, lease_of, Budget, Mode, Outcome, Search};

/// The outcome of a check.
#[derive(Debug)]
pub enum Verdict {
    Ok,
    Violation(Box<Violation>),
    /// The search exceeded its step budget (not a proof either way).
    GaveUp {
        steps: u64,
    },
}

#[derive(Debug)]
pub struct Violation {
    /// Operations of the minimal failing prefix, in call order.
    pub prefix: Vec<Operation>,
    /// The operation (in `prefix`) whose call time closes the prefix.
    pub culprit: Operation,
    /// Why, when it shows without a search (see `direct_check`).
    pub reason: Option<String>,
    /// The most operations any explored order managed to linearize.
    pub longest_linearized: usize,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "history is not linearizable: minimal failing prefix has {} operations (longest linearizable order: {} ops); culprit:\n  {}",
            self.prefix.len(),
            self.longest_linearized,
            self.culprit
        )?;
        if let Some(r) = &self.reason {
            writeln!(f, "  why: {r}")?;
        }
        writeln!(f, "last operations of the prefix (call order):")?;
        let skip = self.prefix.len().saturating_sub(25);
        for op in &self.prefix[skip..] {
            writeln!(f, "  {op}")?;
        }
        Ok(())
    }
}

/// What a check did (for the run's report).
#[derive(Debug, Default, Clone)]
pub struct CheckStats {
    /// Search steps (candidate operations tried, skips, backtracks).
    pub steps: u64,
    /// Segments the history was cut into at quiet points.
    pub segments: usize,
    /// Operations in the largest segment.
    pub largest_segment: usize,
    /// The most end states a segment could finish in.
    pub max_end_states: usize,
    /// Whether a segment was too hard to enumerate and merged with the rest.
    pub merged: bool,
    /// Whether the violation showed without a search (revision order,
    /// answers against the watch history).
    pub direct: bool,
    /// Whether the watch history was used as the truth oracle.
    pub truth: bool,
}

/// The most possible states the search keeps at once (unknown outcomes
/// multiply them) before it gives up.
pub const MAX_STATES: usize = 4096;

/// Default step budget of a check (seconds of search in a debug build).
pub const DEFAULT_BUDGET: u64 = 5_000_000;

/// Wall-clock limit of one [`check`] (the search and the prefix
/// minimisation); the step budget is the limit that counts, this only
/// bounds a pathological step. At 30 s a long-mode history (4 209 ops,
/// 352 unknown, one 4 189-op segment: crashes leave no quiet point) gave
/// up after 2.07M steps on a machine loaded by two lanes of scenarios;
/// its saved record re-checked OK in 9.4 s and 2.1M steps.
pub const TIME_LIMIT: Duration = Duration::from_secs(90);

/// The operations called at or before `t`; those still running at `t`
/// become unknown outcomes, reads among them are dropped.
fn prefix_at(ops: &[Operation], t: u64) -> Vec<Operation> {
    ops.iter()
        .filter(|o| o.call <= t)
        .filter_map(|o| {
            if o.ret.is_some_and(|r| r <= t) {
                Some(o.clone())
            } else if o.is_write() {
                Some(Operation {
                    ret: None,
                    resp: None,
                    ..o.clone()
                })
            } else {
                None
            }
        })
        .collect()
}

/// Indices where the history (sorted by call) can be cut: no operation
/// called before spans the next call.
fn quiet_points(ops: &[Operation]) -> Vec<usize> {
    let mut cuts = vec![0];
    let mut max_ret = 0u64;
    for (j, o) in ops.iter().enumerate() {
        if j > 0 && max_ret < o.call {
            cuts.push(j);
        }
        max_ret = max_ret.max(o.ret.unwrap_or(u64::MAX));
    }
    cuts.push(ops.len());
    cuts
}

fn claimed_of(ops: &[Operation]) -> HashSet<i64> {
    ops.iter().filter_map(claimed_rev).collect()
}

/// Checks `ops` from the initial state `init`. Definite failures
/// ([`Response::LeaseNotFound`]) are kept: they must be explained too.
pub fn check(ops: &[Operation], init: &KvState, budget: u64) -> Verdict {
    check_with_truth(ops, init, None, budget).0
}

/// Checks `ops` (usually [`crate::patch::patch_history`]'s output) from
/// `init`, with the watch history as oracle when given.
pub fn check_with_truth(
    ops: &[Operation],
    init: &KvState,
    truth: Option<&Truth>,
    budget: u64,
) -> (Verdict, CheckStats) {
    let mut ops: Vec<Operation> = ops
        .iter()
        .filter(|o| o.resp.is_some() || o.is_write())
        .cloned()
        .collect();
    ops.sort_by_key(|o| o.call);
    let claimed = claimed_of(&ops);
    let mut b = Budget {
        steps: 0,
        limit: budget,
        deadline: Instant::now() + TIME_LIMIT,
    };
    let cuts = quiet_points(&ops);
    let mut stats = CheckStats {
        segments: cuts.len() - 1,
        truth: truth.is_some(),
        ..Default::default()
    };
    // The last op (index in call order) that uses each lease.
    let mut last_use: HashMap<i64, usize> = HashMap::new();
    for (i, o) in ops.iter().enumerate() {
        if let Some(l) = lease_of(&o.req) {
            last_use.insert(l, i);
        }
    }
    let start = StateSet::single(init.clone());
    if let Some(d) = direct_check(&ops, init, truth) {
        stats.direct = true;
        let v = minimize(&[], &ops, &start, init, truth, 0, &mut b, Some(d.time));
        stats.steps = b.steps;
        return (Verdict::Violation(Box::new(v)), stats);
    }
    let mut states = start;
    let mut k = 0;
    while k + 1 < cuts.len() {
        let last = k + 2 == cuts.len();
        let seg = &ops[cuts[k]..cuts[k + 1]];
        stats.largest_segment = stats.largest_segment.max(seg.len());
        let mode = if last { Mode::FindOne } else { Mode::Enumerate };
        let seg_start = cuts[k];
        let (seg, outcome) = match Search::new(seg, truth, &claimed).run(&states, mode, &mut b) {
            Outcome::OverBudget if !last && b.steps <= b.limit => {
                // Too many ways through this segment to list its end
                // states: search the rest of the history in one go.
                stats.merged = true;
                let rest = &ops[cuts[k]..];
                let o = Search::new(rest, truth, &claimed).run(&states, Mode::FindOne, &mut b);
                k = cuts.len() - 2;
                (rest, o)
            }
            o => (seg, o),
        };
        match outcome {
            Outcome::Ok(ends) => {
                stats.max_end_states = stats.max_end_states.max(ends.states.len());
                states = forget_leases(ends, &last_use, cuts[k + 1]);
            }
            Outcome::OverBudget => {
                stats.steps = b.steps;
                return (Verdict::GaveUp { steps: b.steps }, stats);
            }
            Outcome::Fail { longest } => {
                let v = minimize(
                    &ops[..seg_start],
                    seg,
                    &states,
                    init,
                    truth,
                    longest,
                    &mut b,
                    None,
                );
                stats.steps = b.steps;
                return (Verdict::Violation(Box::new(v)), stats);
            }
        }
        k += 1;
    }
    stats.steps = b.steps;
    (Verdict::Ok, stats)
}

/// The states a segment ended in, without the leases no op from `from`
/// on uses: they can no longer make a difference, and states that differ
/// only in them (unknown grants and revokes that did or did not happen)
/// become one.
fn forget_leases(set: StateSet, last_use: &HashMap<i64, usize>, from: usize) -> StateSet {
    let mut states: Vec<(u64, KvState)> = set
        .states
        .into_iter()
        .map(|(h, mut s)| {
            let before = s.leases.len();
            s.leases
                .retain(|l, _| last_use.get(l).is_some_and(|&i| i >= from));
            if s.leases.len() == before {
                (h, s)
            } else {
                (s.hash64(), s)
            }
        })
        .collect();
    states.sort_by_key(|(h, _)| *h);
    states.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
    StateSet { states }
}

/// The revision before and after an answered op took effect, when its
/// response says (a read at R: R, R; a write that made R: R-1, R). For a
/// revoke it is unknown whether it made its revision: R, R (the weaker pin).
fn pins(resp: &Response) -> Option<(i64, i64)> {
    Some(match resp {
        Response::Get { rev, .. }
        | Response::Range { rev, .. }
        | Response::LeaseGrant { rev }
        | Response::LeaseRevoke { rev } => (*rev, *rev),
        Response::Put { rev } => (rev - 1, *rev),
        Response::Delete { deleted, rev } => (rev - i64::from(*deleted > 0), *rev),
        Response::Cas { succeeded, rev, .. } => (rev - i64::from(*succeeded), *rev),
        Response::LeaseNotFound => None?,
    })
}

/// A violation visible without searching, at the return of its culprit.
struct Direct {
    time: u64,
    culprit: usize,
    reason: String,
}

/// Violations every linearization would hit, found in O(n log n): every
/// answered op is pinned to the revision it was linearized at (see
/// [`pins`]), revisions never go back, so an op that returned before
/// another was called cannot have a later revision; no revision is made
/// twice; none is below the initial one; and with the truth, an answer
/// (of an op whose outcome does not depend on leases) must be what the
/// truth's state at its revision gives. The earliest by the culprit's
/// return.
fn direct_check(ops: &[Operation], init: &KvState, truth: Option<&Truth>) -> Option<Direct> {
    let mut best: Option<Direct> = None;
    let mut note = |time: u64, culprit: usize, reason: String| {
        if best.as_ref().is_none_or(|b| time < b.time) {
            best = Some(Direct {
                time,
                culprit,
                reason,
            });
        }
    };
    let pinned: Vec<(usize, i64, i64, u64)> = ops
        .iter()
        .enumerate()
        .filter_map(|(i, o)| {
            let (pre, post) = pins(o.resp.as_ref()?)?;
            Some((i, pre, post, o.ret?))
        })
        .collect();
    let mut made: std::collections::HashMap<i64, (usize, u64)> = Default::default();
    for &(i, pre, post, ret) in &pinned {
        if pre < init.rev {
            note(
                ret,
                i,
                format!(
                    "answered from revision {pre}, below the initial revision {}",
                    init.rev
                ),
            );
        }
        if post != pre {
            if let Some(&(j, rj)) = made.get(&post) {
                let (c, w) = if rj > ret { (j, i) } else { (i, j) };
                note(
                    rj.max(ret),
                    c,
                    format!("revision {post} made twice, also by {}", ops[w]),
                );
            } else {
                made.insert(post, (i, ret));
            }
        }
        let Some(t) = truth else { continue };
        let op = &ops[i];
        let lease_free = match &op.req {
            Request::Get { .. }
            | Request::Range { .. }
            | Request::Delete { .. }
            | Request::Cas { .. } => true,
            Request::Put { lease, .. } => *lease == 0,
            Request::LeaseGrant { .. } | Request::LeaseRevoke { .. } => false,
        };
        if !lease_free {
            continue;
        }
        let Some(keys) = t.state_at(pre) else {
            note(
                ret,
                i,
                format!(
                    "answered from revision {pre}, beyond the watch history (last {})",
                    t.last_rev()
                ),
            );
            continue;
        };
        let mut s = KvState {
            rev: pre,
            keys: keys.clone(),
            leases: Default::default(),
        };
        let expected = s.apply(&op.req);
        if op.resp.as_ref() != Some(&expected) {
            note(
                ret,
                i,
                format!("the state at revision {pre} (watch history) answers {expected:?}"),
            );
        } else if post != pre && t.state_at(post) != Some(&s.keys) {
            note(
                ret,
                i,
                format!("revision {post} of the watch history is not this write"),
            );
        }
    }
    // Real time: the highest revision returned before each call.
    let mut by_ret: Vec<(u64, i64, usize)> = pinned
        .iter()
        .map(|&(i, _, post, ret)| (ret, post, i))
        .collect();
    by_ret.sort_unstable();
    let mut by_call: Vec<(u64, usize, i64)> = pinned
        .iter()
        .map(|&(i, pre, _, _)| (ops[i].call, i, pre))
        .collect();
    by_call.sort_unstable();
    let mut k = 0;
    let mut max: Option<(i64, usize)> = None;
    for (call, i, pre) in by_call {
        while k < by_ret.len() && by_ret[k].0 < call {
            if max.is_none_or(|(m, _)| by_ret[k].1 > m) {
                max = Some((by_ret[k].1, by_ret[k].2));
            }
            k += 1;
        }
        if let Some((m, a)) = max {
            if pre < m {
                note(
                    ops[i].ret.unwrap_or(u64::MAX),
                    i,
                    format!("answered from revision {pre}, but was called after this returned revision {m}: {}", ops[a]),
                );
            }
        }
    }
    best
}

/// The minimal failing prefix of `seg` (which fails from `start`, the
/// states `prior` can end in): binary search over cut times (up to
/// `known_fail`, a time the prefix is known to fail at). A prefix fails
/// when [`direct_check`] finds a violation in it or the search does.
#[allow(clippy::too_many_arguments)]
fn minimize(
    prior: &[Operation],
    seg: &[Operation],
    start: &StateSet,
    init: &KvState,
    truth: Option<&Truth>,
    longest: usize,
    b: &mut Budget,
    known_fail: Option<u64>,
) -> Violation {
    let mut times: Vec<u64> = seg
        .iter()
        .flat_map(|o| [Some(o.call), o.ret])
        .flatten()
        .filter(|&t| t != u64::MAX && known_fail.is_none_or(|k| t <= k))
        .collect();
    times.push(known_fail.unwrap_or(u64::MAX));
    times.sort_unstable();
    times.dedup();
    // The last time fails. A prefix search that runs out of budget counts
    // as failing, so the prefix found is then possibly not the smallest one.
    let (mut lo, mut hi) = (0usize, times.len() - 1);
    let mut pb = Budget {
        steps: 0,
        limit: b.limit,
        deadline: Instant::now() + TIME_LIMIT / 2,
    };
    let with_prior = |p: &[Operation]| -> Vec<Operation> {
        let mut all: Vec<Operation> = prior.to_vec();
        all.extend(p.iter().cloned());
        all.sort_by_key(|o| o.call);
        all
    };
    while lo < hi {
        let mid = (lo + hi) / 2;
        let p = prefix_at(seg, times[mid]);
        let all = with_prior(&p);
        if direct_check(&all, init, truth).is_some() {
            hi = mid;
            continue;
        }
        let claimed = claimed_of(&all);
        match Search::new(&p, truth, &claimed).run(start, Mode::FindOne, &mut pb) {
            Outcome::Ok(_) => lo = mid + 1,
            _ => hi = mid,
        }
    }
    b.steps += pb.steps;
    let p = prefix_at(seg, times[hi]);
    let prefix = with_prior(&p);
    let (culprit, reason) = match direct_check(&prefix, init, truth) {
        Some(d) => (prefix[d.culprit].clone(), Some(d.reason)),
        None => (
            p.iter()
                .rfind(|o| o.ret == Some(times[hi]) || o.call == times[hi])
                .cloned()
                .unwrap_or_else(|| p[p.len() - 1].clone()),
            None,
        ),
    };
    Violation {
        prefix,
        culprit,
        reason,
        longest_linearized: longest,
    }
}

/// The response's revision, if it carries one.
pub fn response_rev(r: &Response) -> Option<i64> {
    match r {
        Response::Get { rev, .. }
        | Response::Range { rev, .. }
        | Response::Put { rev }
        | Response::Delete { rev, .. }
        | Response::Cas { rev, .. }
        | Response::LeaseGrant { rev }
        | Response::LeaseRevoke { rev } => Some(*rev),
        Response::LeaseNotFound => None,
    }
}
