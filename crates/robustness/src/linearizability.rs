//! Linearizability checking of a KV history: the Wing & Gong / Lowe search
//! (as in porcupine) over [`crate::model`], with a cache of
//! (linearized set, state set) pairs already explored.
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

const NIL: usize = usize::MAX;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Find one linearization of the mandatory operations.
    FindOne,
    /// Find every state the segment can end in (all events consumed).
    Enumerate,
}

enum Outcome {
    Ok(StateSet),
    Fail { longest: usize },
    OverBudget,
}

struct Budget {
    steps: u64,
    limit: u64,
    deadline: Instant,
}

impl Budget {
    fn tick(&mut self) -> bool {
        self.steps += 1;
        self.steps <= self.limit
            && !(self.steps.is_multiple_of(4096) && Instant::now() > self.deadline)
    }
}

/// Whether a response with this revision is possible from a state at
/// revision `cur` (the model checks the rest).
fn rev_possible(resp: &Response, cur: i64) -> bool {
    match resp {
        Response::Get { rev, .. } | Response::Range { rev, .. } | Response::LeaseGrant { rev } => {
            *rev == cur
        }
        Response::Put { rev } => *rev == cur + 1,
        Response::Delete { deleted, rev } => *rev == cur + i64::from(*deleted > 0),
        Response::Cas { succeeded, rev, .. } => *rev == cur + i64::from(*succeeded),
        Response::LeaseRevoke { rev } => *rev == cur || *rev == cur + 1,
        Response::LeaseNotFound => true,
    }
}

/// The revision an answered operation claims to have made.
fn claimed_rev(op: &Operation) -> Option<i64> {
    match op.resp.as_ref()? {
        Response::Put { rev } => Some(*rev),
        Response::Delete { deleted, rev } if *deleted > 0 => Some(*rev),
        Response::Cas {
            succeeded: true,
            rev,
            ..
        } => Some(*rev),
        _ => None,
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum FrameKind {
    /// Linearized at a call event, one choice among the candidates.
    Choice,
    /// Linearized where nothing else needs trying: if the search fails
    /// after it, it fails from before it too.
    Forced,
    /// An optional op linearized at its return event (its last moment).
    AtRet,
    /// An optional op skipped at its return event (it did not happen).
    Skip,
}

/// One step of the search: the op consumed and how to undo it. For a
/// `Choice`, the candidates of the configuration it left and which one it
/// took, so the search goes on with the next one after a backtrack.
struct Frame {
    kind: FrameKind,
    call_ev: usize,
    prev: StateSet,
    prev_forced: Option<i64>,
    cands: Vec<usize>,
    pos: usize,
}

/// The search's position: what is consumed and the possible states.
struct Config {
    state: StateSet,
    linearized: Vec<u64>,
    mandatory_left: usize,
    /// A lease-only optional op of this lease was just linearized for the
    /// op that needs it: the next op linearized must use this lease.
    forced: Option<i64>,
    frames: Vec<Frame>,
}

/// Where the scan goes on after a backtrack.
enum Resume {
    /// Scan these candidates of the restored configuration from `pos`.
    Scan(Vec<usize>, usize),
    /// A new configuration (a skip was pushed): compute its candidates.
    Fresh,
    /// Nothing left to try.
    Exhausted,
}

struct Search<'a> {
    ops: &'a [Operation],
    truth: Option<&'a Truth>,
    claimed: &'a HashSet<i64>,
    optional: Vec<bool>,
    /// Scan order class: answered ops that change nothing first, then other
    /// answered ops, then optional ones.
    class: Vec<u8>,
    /// The lease an answered op uses (put with a lease, grant, revoke).
    lease_ref: Vec<Option<i64>>,
    /// The lease of an optional grant or revoke.
    free_lease: Vec<Option<i64>>,
    /// An answered grant/revoke no other op using its lease overlaps.
    lease_solo: Vec<bool>,
    // Events: index 0 is the head sentinel, then 2 per op.
    next: Vec<usize>,
    prev: Vec<usize>,
    op_of: Vec<usize>,
    is_call: Vec<bool>,
    /// For a call event its return event, for a return event its call event.
    pair: Vec<usize>,
    cache: HashSet<(Vec<u64>, u64)>,
    longest: usize,
}

fn lease_of(req: &Request) -> Option<i64> {
    match req {
        Request::Put { lease, .. } if *lease != 0 => Some(*lease),
        Request::LeaseRevoke { id } | Request::LeaseGrant { id } => Some(*id),
        _ => None,
    }
}

impl<'a> Search<'a> {
    fn new(
        ops: &'a [Operation],
        truth: Option<&'a Truth>,
        claimed: &'a HashSet<i64>,
    ) -> Search<'a> {
        let mut evs: Vec<(u64, bool, usize)> = Vec::with_capacity(ops.len() * 2);
        for (i, o) in ops.iter().enumerate() {
            evs.push((o.call, true, i));
            evs.push((o.ret.unwrap_or(u64::MAX), false, i));
        }
        // At equal times calls come first: the more permissive order.
        evs.sort_by_key(|&(t, call, i)| (t, !call, i));
        let n = evs.len() + 1;
        let optional: Vec<bool> = ops.iter().map(|o| o.resp.is_none()).collect();
        let class = ops
            .iter()
            .map(|o| match &o.resp {
                None => 2,
                Some(
                    Response::Get { .. }
                    | Response::Range { .. }
                    | Response::LeaseNotFound
                    | Response::Delete { deleted: 0, .. }
                    | Response::Cas {
                        succeeded: false, ..
                    },
                ) => 0,
                Some(_) => 1,
            })
            .collect();
        let lease_ref: Vec<Option<i64>> = ops
            .iter()
            .map(|o| o.resp.as_ref().and(lease_of(&o.req)))
            .collect();
        // Ops by lease, to find overlapping users of a lease.
        let mut by_lease: std::collections::HashMap<i64, Vec<usize>> = Default::default();
        for (i, o) in ops.iter().enumerate() {
            if let Some(l) = lease_of(&o.req) {
                by_lease.entry(l).or_default().push(i);
            }
        }
        let overlaps = |a: &Operation, b: &Operation| {
            a.call < b.ret.unwrap_or(u64::MAX) && b.call < a.ret.unwrap_or(u64::MAX)
        };
        let lease_solo = ops
            .iter()
            .enumerate()
            .map(|(i, o)| {
                matches!(
                    o.resp,
                    Some(Response::LeaseGrant { .. } | Response::LeaseRevoke { .. })
                ) && lease_of(&o.req).is_some_and(|l| {
                    by_lease[&l]
                        .iter()
                        .all(|&j| j == i || !overlaps(o, &ops[j]))
                })
            })
            .collect();
        let mut s = Search {
            ops,
            truth,
            claimed,
            class,
            lease_ref,
            free_lease: ops
                .iter()
                .map(|o| match o.req {
                    Request::LeaseGrant { id } | Request::LeaseRevoke { id }
                        if o.resp.is_none() =>
                    {
                        Some(id)
                    }
                    _ => None,
                })
                .collect(),
            lease_solo,
            optional,
            next: vec![NIL; n],
            prev: vec![NIL; n],
            op_of: vec![0; n],
            is_call: vec![false; n],
            pair: vec![NIL; n],
            cache: HashSet::new(),
            longest: 0,
        };
        let mut call_ev = vec![0; ops.len()];
        let mut ret_ev = vec![0; ops.len()];
        for (j, &(_, call, i)) in evs.iter().enumerate() {
            let e = j + 1;
            s.op_of[e] = i;
            s.is_call[e] = call;
            if call {
                call_ev[i] = e;
            } else {
                ret_ev[i] = e;
            }
        }
        for e in 1..n {
            let i = s.op_of[e];
            s.pair[e] = if s.is_call[e] { ret_ev[i] } else { call_ev[i] };
        }
        for e in 0..n {
            s.next[e] = if e + 1 < n { e + 1 } else { NIL };
            s.prev[e] = if e == 0 { NIL } else { e - 1 };
        }
        s
    }

    fn unlink(&mut self, e: usize) {
        let (p, n) = (self.prev[e], self.next[e]);
        self.next[p] = n;
        if n != NIL {
            self.prev[n] = p;
        }
    }

    fn relink(&mut self, e: usize) {
        let (p, n) = (self.prev[e], self.next[e]);
        self.next[p] = e;
        if n != NIL {
            self.prev[n] = e;
        }
    }

    /// A step that makes a new revision must make the truth's state there;
    /// an optional op may not take a revision an answered op claims.
    fn allowed(&self, old: &KvState, new: &KvState, optional: bool) -> bool {
        let Some(truth) = self.truth else {
            return true;
        };
        if new.rev == old.rev {
            return true;
        }
        if optional && self.claimed.contains(&new.rev) {
            return false;
        }
        truth.state_at(new.rev).is_some_and(|s| *s == new.keys)
    }

    /// The successors of `set` when op `i` is linearized now, whether a
    /// revision was made and whether anything changed; `None` when it
    /// cannot be linearized now.
    fn try_step(&self, set: &StateSet, i: usize) -> Option<(StateSet, bool, bool)> {
        let op = &self.ops[i];
        let optional = self.optional[i];
        if let Some(resp) = &op.resp {
            if !set.states.iter().any(|(_, s)| rev_possible(resp, s.rev)) {
                return None;
            }
        }
        let mut out = Vec::new();
        let mut new_rev = false;
        let mut tmp = Vec::new();
        for (_, s) in &set.states {
            tmp.clear();
            s.step(&op.req, op.resp.as_ref(), &mut tmp);
            for n in tmp.drain(..) {
                if !self.allowed(s, &n, optional) {
                    continue;
                }
                new_rev |= n.rev != s.rev;
                out.push((n.hash64(), n));
            }
        }
        if out.is_empty() {
            return None;
        }
        out.sort_by_key(|(h, _)| *h);
        out.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
        let changed = out.len() != set.states.len()
            || out
                .iter()
                .zip(&set.states)
                .any(|(a, b)| a.0 != b.0 || a.1 != b.1);
        // An optional op that changes nothing is no better than leaving it
        // pending (and skipping it at its return).
        if optional && !changed {
            return None;
        }
        Some((StateSet { states: out }, new_rev, changed))
    }

    /// The candidates of the current configuration (calls before the first
    /// pending return), in scan order, and that return event.
    fn candidates(&self, forced: Option<i64>) -> (Vec<usize>, usize) {
        let mut cands = Vec::new();
        let mut e = self.next[0];
        while e != NIL && self.is_call[e] {
            let i = self.op_of[e];
            if forced.is_none() || self.lease_ref[i] == forced {
                cands.push(e);
            }
            e = self.next[e];
        }
        cands.sort_by_key(|&e| self.class[self.op_of[e]]);
        (cands, e)
    }

    /// Whether an answered op using lease `l` is among the candidates.
    fn lease_user_pending(&self, cands: &[usize], l: i64) -> bool {
        cands
            .iter()
            .any(|&e| self.lease_ref[self.op_of[e]] == Some(l))
    }

    /// Among identical optional ops pending together, only the one that
    /// must be decided first (earliest return, then index) is tried: any
    /// order using another can use that one instead.
    fn first_of_twins(&self, cands: &[usize], i: usize) -> bool {
        let (a, ka) = (&self.ops[i], (self.ops[i].ret.unwrap_or(u64::MAX), i));
        cands.iter().all(|&e| {
            let j = self.op_of[e];
            j == i
                || !self.optional[j]
                || self.ops[j].req != a.req
                || (self.ops[j].ret.unwrap_or(u64::MAX), j) > ka
        })
    }

    fn key(linearized: &[u64], state: &StateSet, forced: Option<i64>) -> (Vec<u64>, u64) {
        let f = forced.map_or(0, |l| (l as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        (linearized.to_vec(), state.hash64() ^ f)
    }

    /// Moves to the configuration with the op of `call_ev` consumed and
    /// `ns` as states, unless that one was explored already.
    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        c: &mut Config,
        kind: FrameKind,
        call_ev: usize,
        ns: StateSet,
        forced: Option<i64>,
        cands: &[usize],
        pos: usize,
    ) -> bool {
        let i = self.op_of[call_ev];
        c.linearized[i / 64] |= 1 << (i % 64);
        if !self.cache.insert(Self::key(&c.linearized, &ns, forced)) {
            c.linearized[i / 64] &= !(1 << (i % 64));
            return false;
        }
        c.frames.push(Frame {
            kind,
            call_ev,
            prev: std::mem::replace(&mut c.state, ns),
            prev_forced: std::mem::replace(&mut c.forced, forced),
            cands: if kind == FrameKind::Choice {
                cands.to_vec()
            } else {
                Vec::new()
            },
            pos,
        });
        if !self.optional[i] {
            c.mandatory_left -= 1;
        }
        self.longest = self.longest.max(c.frames.len());
        self.unlink(call_ev);
        self.unlink(self.pair[call_ev]);
        true
    }

    /// Undoes frames until one leaves another choice.
    fn backtrack(&mut self, c: &mut Config) -> Resume {
        loop {
            let Some(f) = c.frames.pop() else {
                return Resume::Exhausted;
            };
            let i = self.op_of[f.call_ev];
            c.state = f.prev;
            c.forced = f.prev_forced;
            c.linearized[i / 64] &= !(1 << (i % 64));
            if !self.optional[i] {
                c.mandatory_left += 1;
            }
            self.relink(self.pair[f.call_ev]);
            self.relink(f.call_ev);
            match f.kind {
                FrameKind::Choice => return Resume::Scan(f.cands, f.pos + 1),
                FrameKind::Forced | FrameKind::Skip => continue,
                FrameKind::AtRet => {
                    // Not there: then it did not happen.
                    let st = c.state.clone();
                    if self.push(c, FrameKind::Skip, f.call_ev, st, None, &[], 0) {
                        return Resume::Fresh;
                    }
                }
            }
        }
    }

    fn run(&mut self, start: &StateSet, mode: Mode, budget: &mut Budget) -> Outcome {
        let mut c = Config {
            state: start.clone(),
            linearized: vec![0u64; self.ops.len().div_ceil(64)],
            mandatory_left: self.optional.iter().filter(|o| !**o).count(),
            forced: None,
            frames: Vec::new(),
        };
        let mut ends: Vec<(u64, KvState)> = Vec::new();
        'fresh: loop {
            let done = match mode {
                Mode::FindOne => c.mandatory_left == 0 && c.forced.is_none(),
                Mode::Enumerate => self.next[0] == NIL,
            };
            let (mut cands, mut pos) = if done {
                if mode == Mode::FindOne {
                    return Outcome::Ok(c.state);
                }
                ends.extend(c.state.states.iter().cloned());
                ends.sort_by_key(|(h, _)| *h);
                ends.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
                if ends.len() > MAX_STATES {
                    return Outcome::OverBudget;
                }
                match self.backtrack(&mut c) {
                    Resume::Scan(cands, pos) => (cands, pos),
                    Resume::Fresh => continue 'fresh,
                    Resume::Exhausted => break 'fresh,
                }
            } else {
                (self.candidates(c.forced).0, 0)
            };
            loop {
                // The candidates of this configuration, from `pos`.
                let mut dead = false;
                while pos < cands.len() {
                    if !budget.tick() {
                        return Outcome::OverBudget;
                    }
                    let e = cands[pos];
                    let i = self.op_of[e];
                    if let Some((ns, new_rev, changed)) = self.try_step(&c.state, i) {
                        if ns.states.len() > MAX_STATES {
                            return Outcome::OverBudget;
                        }
                        let mut kind = FrameKind::Choice;
                        let mut forced = None;
                        let mut ok = true;
                        if !self.optional[i] {
                            // An answered op that changes nothing, or a lease op
                            // nothing else using its lease overlaps, commutes
                            // with everything pending: taking it now loses nothing.
                            if !changed || (self.lease_solo[i] && !new_rev) {
                                kind = FrameKind::Forced;
                            }
                        } else if let (Some(l), false) = (self.free_lease[i], new_rev) {
                            // A lease-only optional op commutes with every op not
                            // using its lease: right before one that does (or at
                            // its return event), nowhere else.
                            ok = c.forced.is_none() && self.lease_user_pending(&cands, l);
                            forced = Some(l);
                        } else {
                            ok = self.first_of_twins(&cands, i);
                        }
                        if ok {
                            if self.push(&mut c, kind, e, ns, forced, &cands, pos) {
                                continue 'fresh;
                            }
                            if kind == FrameKind::Forced {
                                // Explored before from here on: nothing else to try.
                                dead = true;
                                break;
                            }
                        }
                    }
                    pos += 1;
                }
                // Every candidate tried: the first pending return event.
                let (_, ret_ev) = self.candidates(c.forced);
                if !dead && ret_ev != NIL && c.forced.is_none() && self.optional[self.op_of[ret_ev]]
                {
                    let i = self.op_of[ret_ev];
                    let call_ev = self.pair[ret_ev];
                    // Its last chance: take effect now, or never. (A lease-only
                    // step here is never needed: every op using the lease was
                    // called before this bound, and it was tried right before
                    // each of them.)
                    if let Some((ns, new_rev, _)) = self.try_step(&c.state, i) {
                        if self.free_lease[i].is_none() || new_rev {
                            if ns.states.len() > MAX_STATES {
                                return Outcome::OverBudget;
                            }
                            if self.push(&mut c, FrameKind::AtRet, call_ev, ns, None, &[], 0) {
                                continue 'fresh;
                            }
                        }
                    }
                    let st = c.state.clone();
                    if self.push(&mut c, FrameKind::Skip, call_ev, st, None, &[], 0) {
                        continue 'fresh;
                    }
                }
                match self.backtrack(&mut c) {
                    Resume::Scan(cs, p) => {
                        cands = cs;
                        pos = p;
                    }
                    Resume::Fresh => continue 'fresh,
                    Resume::Exhausted => break 'fresh,
                }
            }
        }
        if ends.is_empty() {
            Outcome::Fail {
                longest: self.longest,
            }
        } else {
            Outcome::Ok(StateSet { states: ends })
        }
    }
}

/// The most possible states the search keeps at once (unknown outcomes
/// multiply them) before it gives up.
pub const MAX_STATES: usize = 4096;

/// Default step budget of a check (seconds of search in a debug build).
pub const DEFAULT_BUDGET: u64 = 5_000_000;

/// Wall-clock limit of one [`check`] (the search and the prefix minimisation).
pub const TIME_LIMIT: Duration = Duration::from_secs(30);

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
