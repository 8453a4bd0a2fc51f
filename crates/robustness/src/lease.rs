//! The lease check: one client grants a lease (TTL a few seconds), puts a
//! key on it (outside the traffic prefix) and keeps the lease alive with
//! keepalives through the scenario's faults (one keepalive client per
//! member); a read of the key now and then
//! and a watch on the key record what the cluster shows. After the cluster
//! has been healed the keepalives stop and the key is polled until it is
//! gone. [`check`] then requires:
//!
//! * **never early**: a successful keepalive (TTL > 0) called at `c` renews
//!   the lease no earlier than `c`, so the key must not be deleted before
//!   `c + TTL`. The deletion is observed no later than the receipt of the
//!   DELETE event or the return of a read that did not find the key; an
//!   observation before `c + TTL` for any successful keepalive is an early
//!   expiry (a keepalive succeeding after the key was seen gone included);
//! * **not late**: once keepalives stop, the key is deleted within
//!   `TTL + 2 election timeouts` of the end of the last keepalive (its
//!   return, or call + request timeout if its outcome is unknown). A read
//!   that still finds the key although it was *called* after that deadline
//!   (so the deletion had not happened by its call) is a late expiry, and
//!   so is a key never seen deleted. A leader elected after the last
//!   keepalive re-grants every lease its TTL plus an election timeout
//!   (etcd's `Promote`, retcd's too), so the deadline counts from the
//!   latest leader change seen before it: every member's keepalive client
//!   asks its member for the leader and term (`Status`) each round, and
//!   so does the wait for the expiry after them; a change is recorded when
//!   a member first names a leader at a term above every term named before
//!   (another member, or the same one elected again after a check-quorum
//!   step-down; seen after the election, so never earlier than it).
//!
//! All times are nanoseconds on the run's [`crate::traffic::Clock`].

/// One keepalive request of the lease.
#[derive(Clone, Debug, PartialEq)]
pub struct KeepAlive {
    pub call: u64,
    /// Return time; `None` when the outcome is unknown (timeout, broken stream).
    pub ret: Option<u64>,
    /// Whether it returned a TTL > 0 (the lease existed and was renewed).
    pub ok: bool,
}

/// One linearizable read of the lease's key.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyRead {
    pub call: u64,
    pub ret: u64,
    pub found: bool,
}

/// Everything the lease check needs, recorded during a run.
#[derive(Clone, Debug, Default)]
pub struct LeaseRecord {
    pub key: String,
    pub lease: i64,
    /// The lease's TTL in ns.
    pub ttl: u64,
    /// The allowed lateness after the TTL: 2 election timeouts, in ns.
    pub grace: u64,
    /// The request timeout of a keepalive, in ns (bounds an unknown one).
    pub request_timeout: u64,
    /// When the key's put returned (the key exists from then on).
    pub put_ret: u64,
    /// When the keepalive loop was stopped (no keepalive called after it).
    pub keepalives_stopped: Option<u64>,
    pub keepalives: Vec<KeepAlive>,
    pub reads: Vec<KeyRead>,
    /// Receipt times of DELETE events of the key on the lease watcher.
    pub delete_events: Vec<u64>,
    /// Receipt times of PUT events of the key (only the initial put is
    /// before the watch starts, so any is a violation).
    pub put_events: Vec<u64>,
    /// (return time of a `Status`, the leader it named (0: none), its
    /// raft term).
    pub leaders_seen: Vec<(u64, u64, u64)>,
}

impl LeaseRecord {
    /// The earliest time by which the key was observed gone.
    pub fn observed_deleted(&self) -> Option<u64> {
        let reads = self
            .reads
            .iter()
            .filter(|r| !r.found && r.call >= self.put_ret)
            .map(|r| r.ret);
        self.delete_events.iter().copied().chain(reads).min()
    }

    /// The end of the last keepalive: after it the lease is not renewed.
    pub fn last_keepalive_end(&self) -> Option<u64> {
        self.keepalives
            .iter()
            .map(|k| match (k.ok, k.ret) {
                (true, Some(r)) => r,
                // a failed one may still have been applied
                _ => k.call + self.request_timeout,
            })
            .max()
    }

    /// When a new leadership was first named, in order: a leader named at
    /// a term above every term a leader was named at before (another
    /// member, or the same one elected again after stepping down: either
    /// promotes its lessor and re-grants every lease).
    pub fn leader_changes(&self) -> Vec<u64> {
        let mut seen = self.leaders_seen.clone();
        seen.sort_unstable();
        let mut top: Option<u64> = None;
        let mut out = Vec::new();
        for (t, leader, term) in seen {
            if leader == 0 || top.is_some_and(|top| term <= top) {
                continue;
            }
            if top.is_some() {
                out.push(t);
            }
            top = Some(term);
        }
        out
    }

    /// The deadline of the expiry once keepalives stopped: TTL + grace
    /// after the last keepalive, or after a leader change within that time
    /// (which re-grants the TTL), whichever is later.
    pub fn expiry_deadline(&self) -> u64 {
        let mut from = self
            .last_keepalive_end()
            .unwrap_or(self.put_ret)
            .max(self.put_ret);
        let changes = self.leader_changes();
        loop {
            let deadline = from + self.ttl + self.grace;
            match changes
                .iter()
                .copied()
                .filter(|&c| c > from && c <= deadline)
                .max()
            {
                Some(c) => from = c,
                None => return deadline,
            }
        }
    }
}

fn ms(ns: u64) -> String {
    format!("{:.3} s", ns as f64 / 1e9)
}

/// Checks a lease record; the violations found (empty = fine).
pub fn check(r: &LeaseRecord) -> Vec<String> {
    let mut v = Vec::new();
    let name = format!("lease {:x} (key {})", r.lease, r.key);
    for t in &r.put_events {
        v.push(format!("{name}: unexpected PUT event at {}", ms(*t)));
    }
    let obs = r.observed_deleted();
    if let Some(obs) = obs {
        // Never early: every successful keepalive renews the lease for TTL.
        if let Some(k) = r
            .keepalives
            .iter()
            .filter(|k| k.ok && k.call + r.ttl > obs)
            .max_by_key(|k| k.call)
        {
            v.push(format!(
                "{name}: expired early: the key was seen deleted at {} but a keepalive called at {} succeeded (TTL {}, so not before {})",
                ms(obs),
                ms(k.call),
                ms(r.ttl),
                ms(k.call + r.ttl)
            ));
        }
    }
    let Some(stopped) = r.keepalives_stopped else {
        return v;
    };
    // Not late: deleted within TTL + grace of the last keepalive.
    let deadline = r.expiry_deadline();
    if let Some(rd) = r
        .reads
        .iter()
        .filter(|rd| rd.found && rd.call > deadline)
        .max_by_key(|rd| rd.call)
    {
        v.push(format!(
            "{name}: expired late: still found by a read called at {}, the deadline was {} (last keepalive ended {}, TTL {}, grace {}, leader changes seen at [{}], the last leader seen at {})",
            ms(rd.call),
            ms(deadline),
            ms(r.last_keepalive_end().unwrap_or(r.put_ret)),
            ms(r.ttl),
            ms(r.grace),
            r.leader_changes().into_iter().map(ms).collect::<Vec<_>>().join(", "),
            r.leaders_seen.iter().map(|l| l.0).max().map(ms).unwrap_or_default()
        ));
        // the last keepalives, to tell a late renewal from a late revoke
        let mut last: Vec<&KeepAlive> = r.keepalives.iter().collect();
        last.sort_by_key(|k| k.call);
        let tail = &last[last.len().saturating_sub(8)..];
        let diag = format!(
            "; the last keepalives (call -> return, renewed): {}; reads found the key until {}",
            tail.iter()
                .map(|k| format!(
                    "{} -> {} {}",
                    ms(k.call),
                    k.ret.map(ms).unwrap_or_else(|| "?".into()),
                    k.ok
                ))
                .collect::<Vec<_>>()
                .join(", "),
            r.reads
                .iter()
                .filter(|rd| rd.found)
                .map(|rd| rd.ret)
                .max()
                .map(ms)
                .unwrap_or_default()
        );
        if let Some(m) = v.last_mut() {
            m.push_str(&diag);
        }
    } else if obs.is_none() {
        v.push(format!(
            "{name}: never seen deleted after the keepalives stopped at {} (deadline {})",
            ms(stopped),
            ms(deadline)
        ));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    /// TTL 3 s, grace 1 s; keepalives every 0.5 s from 1 s to 10 s.
    fn base() -> LeaseRecord {
        let mut r = LeaseRecord {
            key: "/rbl/key".into(),
            lease: 1,
            ttl: 3 * S,
            grace: S,
            request_timeout: S,
            put_ret: S / 2,
            ..Default::default()
        };
        let mut t = S;
        while t <= 10 * S {
            r.keepalives.push(KeepAlive {
                call: t,
                ret: Some(t + S / 100),
                ok: true,
            });
            r.reads.push(KeyRead {
                call: t + S / 10,
                ret: t + S / 10 + S / 100,
                found: true,
            });
            t += S / 2;
        }
        r.keepalives_stopped = Some(10 * S + S / 10);
        r
    }

    /// The last keepalive returns at 10.01 s: deadline 14.01 s.
    fn poll_until(r: &mut LeaseRecord, gone_at: u64) {
        let mut t = 10 * S + S / 5;
        while t < 20 * S {
            let found = t < gone_at;
            r.reads.push(KeyRead {
                call: t,
                ret: t + S / 100,
                found,
            });
            if !found {
                r.delete_events.push(gone_at + S / 200);
                return;
            }
            t += S / 10;
        }
    }

    #[test]
    fn correct_expiry_passes() {
        let mut r = base();
        poll_until(&mut r, 13 * S + S / 2); // 3.49 s after the last keepalive
        assert_eq!(check(&r), Vec::<String>::new());
    }

    #[test]
    fn expiry_right_at_ttl_passes() {
        let mut r = base();
        poll_until(&mut r, 13 * S + S / 100 + 1);
        assert_eq!(check(&r), Vec::<String>::new());
    }

    #[test]
    fn keepalive_failures_during_faults_pass() {
        // Keepalives fail for 2 s (< TTL) in the middle: no expiry allowed
        // and none happens; the check passes.
        let mut r = base();
        for k in r.keepalives.iter_mut() {
            if k.call > 4 * S && k.call < 6 * S {
                k.ok = false;
                k.ret = None;
            }
        }
        r.reads.retain(|rd| !(rd.call > 4 * S && rd.call < 6 * S));
        poll_until(&mut r, 13 * S + S / 2);
        assert_eq!(check(&r), Vec::<String>::new());
    }

    #[test]
    fn early_expiry_while_keepalives_flow_is_detected() {
        // The key disappears at 6 s (a DELETE event) while keepalives succeed.
        let mut r = base();
        r.delete_events.push(6 * S);
        for rd in r.reads.iter_mut() {
            if rd.call > 6 * S {
                rd.found = false;
            }
        }
        let v = check(&r);
        assert!(v.iter().any(|s| s.contains("expired early")), "{v:?}");
    }

    #[test]
    fn early_expiry_seen_only_by_a_read_is_detected() {
        let mut r = base();
        r.reads.push(KeyRead {
            call: 7 * S,
            ret: 7 * S + S / 100,
            found: false,
        });
        let v = check(&r);
        assert!(v.iter().any(|s| s.contains("expired early")), "{v:?}");
    }

    #[test]
    fn early_expiry_after_keepalives_stop_is_detected() {
        // Keepalives stop at 10 s; the key is gone at 12 s < 10 s + TTL.
        let mut r = base();
        poll_until(&mut r, 12 * S);
        let v = check(&r);
        assert!(v.iter().any(|s| s.contains("expired early")), "{v:?}");
    }

    #[test]
    fn late_expiry_is_detected() {
        // Deadline 14.01 s; the key is still found at 14.5 s, gone at 16 s.
        let mut r = base();
        poll_until(&mut r, 16 * S);
        let v = check(&r);
        assert!(v.iter().any(|s| s.contains("expired late")), "{v:?}");
        assert!(!v.iter().any(|s| s.contains("early")), "{v:?}");
    }

    #[test]
    fn a_leader_change_after_the_last_keepalive_moves_the_deadline() {
        // Deadline 14.01 s; a new leader named at 12 s re-grants the TTL:
        // the key found at 14.5 s and gone at 16 s is on time (12 + TTL 3 + grace 1).
        let mut r = base();
        r.leaders_seen = vec![(S, 1, 2), (5 * S, 1, 2), (12 * S, 2, 3), (13 * S, 2, 3)];
        poll_until(&mut r, 16 * S);
        assert_eq!(r.leader_changes(), vec![12 * S]);
        assert_eq!(check(&r), Vec::<String>::new());
        // one seen only before the last keepalive does not move it
        let mut r = base();
        r.leaders_seen = vec![(S, 1, 2), (5 * S, 2, 3), (13 * S, 0, 4)];
        poll_until(&mut r, 16 * S);
        assert_eq!(r.leader_changes(), vec![5 * S]);
        let v = check(&r);
        assert!(v.iter().any(|s| s.contains("expired late")), "{v:?}");
    }

    #[test]
    fn the_same_leader_elected_again_moves_the_deadline_a_lagging_member_does_not() {
        // member 1 steps down and is elected again at term 3 at 12 s
        let mut r = base();
        r.leaders_seen = vec![(S, 1, 2), (11 * S, 0, 3), (12 * S, 1, 3)];
        poll_until(&mut r, 16 * S);
        assert_eq!(r.leader_changes(), vec![12 * S]);
        assert_eq!(check(&r), Vec::<String>::new());
        // a member still naming the old leadership after the new one was
        // seen is not another change
        let mut r = base();
        r.leaders_seen = vec![(S, 1, 2), (5 * S, 2, 3), (6 * S, 1, 2), (7 * S, 2, 3)];
        assert_eq!(r.leader_changes(), vec![5 * S]);
    }

    #[test]
    fn never_expiring_is_detected() {
        let mut r = base();
        poll_until(&mut r, u64::MAX);
        let v = check(&r);
        assert!(v.iter().any(|s| s.contains("expired late")), "{v:?}");
        // and without any read after the deadline either
        let mut r = base();
        let v = check(&r);
        assert!(v.iter().any(|s| s.contains("never seen deleted")), "{v:?}");
        r.keepalives_stopped = None;
        assert_eq!(check(&r), Vec::<String>::new());
    }

    #[test]
    fn unknown_last_keepalive_extends_the_deadline() {
        // The last keepalive timed out: it may have been applied up to its
        // call + request timeout (11 s), so expiry by 15 s is in time.
        let mut r = base();
        let last = r.keepalives.last_mut().unwrap();
        last.ok = false;
        last.ret = None;
        poll_until(&mut r, 14 * S + S / 2);
        assert_eq!(check(&r), Vec::<String>::new());
    }

    #[test]
    fn unexpected_put_event_is_detected() {
        let mut r = base();
        poll_until(&mut r, 13 * S + S / 2);
        r.put_events.push(5 * S);
        let v = check(&r);
        assert!(v.iter().any(|s| s.contains("unexpected PUT")), "{v:?}");
    }
}

// ---- the lease client of a run ----

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, EventType, LeaseGrantOptions, PutOptions, WatchOptions};

use crate::traffic::{bounded, connect, Clock};

/// The lease client's settings.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// The key put on the lease; outside the traffic prefix, so the KV and
    /// watch checks of the prefix never see it.
    pub key: String,
    /// A lease ID no traffic client uses (theirs are `(client + 1) << 32 | seq`).
    pub lease: i64,
    pub ttl_secs: i64,
    /// 2 election timeouts.
    pub grace: Duration,
    pub request_timeout: Duration,
    pub keepalive_every: Duration,
    pub read_every: Duration,
}

impl LeaseConfig {
    /// TTL 4 s; `election_timeout` from the cluster's flags.
    pub fn new(election_timeout: Duration) -> LeaseConfig {
        LeaseConfig {
            key: "/rblease/key".into(),
            lease: 0x7e57_0000_0000_0001,
            ttl_secs: 4,
            grace: 2 * election_timeout,
            request_timeout: Duration::from_secs(1),
            keepalive_every: Duration::from_millis(400),
            read_every: Duration::from_millis(300),
        }
    }
}

/// The running lease client: keepalives + reads, and a watcher on the key.
pub struct LeaseKeeper {
    cfg: LeaseConfig,
    endpoints: Vec<String>,
    clock: Clock,
    rec: Arc<Mutex<LeaseRecord>>,
    stop_keepalives: Arc<AtomicBool>,
    stop_watch: Arc<AtomicBool>,
    keepalive_task: tokio::task::JoinHandle<()>,
    watch_task: tokio::task::JoinHandle<()>,
}

async fn get_found(cl: &mut Client, key: &str, d: Duration) -> Result<bool, etcd_client::Error> {
    let r = bounded(d, cl.get(key, None)).await?;
    Ok(!r.kvs().is_empty())
}

/// Grants the lease and puts the key (retrying for up to 20 s; call it
/// while the cluster is healthy), then starts keepalives, reads and the
/// watcher on the key.
pub async fn start(
    endpoints: Vec<String>,
    cfg: LeaseConfig,
    clock: Clock,
) -> Result<LeaseKeeper, String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let (put_ret, put_rev) = loop {
        let attempt = async {
            let mut cl = connect(&endpoints, Duration::from_secs(3)).await?;
            let g = bounded(
                Duration::from_secs(3),
                cl.lease_grant(
                    cfg.ttl_secs,
                    Some(LeaseGrantOptions::new().with_id(cfg.lease)),
                ),
            )
            .await;
            if let Err(e) = &g {
                // a grant retried after an unknown outcome may find the lease
                if !e.to_string().contains("lease already exists") {
                    g?;
                }
            }
            let p = bounded(
                Duration::from_secs(3),
                cl.put(
                    cfg.key.clone(),
                    "leased",
                    Some(PutOptions::new().with_lease(cfg.lease)),
                ),
            )
            .await?;
            Ok::<_, etcd_client::Error>((
                clock.now(),
                p.header().map(|h| h.revision()).unwrap_or(0),
            ))
        };
        match attempt.await {
            Ok(x) => break x,
            Err(e) if std::time::Instant::now() > deadline => {
                return Err(format!("lease grant + put failed: {e}"))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    let rec = Arc::new(Mutex::new(LeaseRecord {
        key: cfg.key.clone(),
        lease: cfg.lease,
        ttl: cfg.ttl_secs as u64 * 1_000_000_000,
        grace: cfg.grace.as_nanos() as u64,
        request_timeout: cfg.request_timeout.as_nanos() as u64,
        put_ret,
        ..Default::default()
    }));
    let stop_keepalives = Arc::new(AtomicBool::new(false));
    let stop_watch = Arc::new(AtomicBool::new(false));
    // One keepalive client per member: a fault that cuts one member from
    // the leader (a bridge partition) must not starve the lease for a TTL
    // while that member's keepalives fail, or the key would expire in the
    // middle of the run, a revision outside the traffic prefix that the
    // watch and linearizability checks of the prefix cannot account for.
    let keepalive_task = tokio::spawn({
        let (eps, cfg, rec, stop) = (
            endpoints.clone(),
            cfg.clone(),
            rec.clone(),
            stop_keepalives.clone(),
        );
        async move {
            let loops: Vec<_> = eps
                .iter()
                .map(|ep| {
                    tokio::spawn(keepalive_loop(
                        vec![ep.clone()],
                        cfg.clone(),
                        clock,
                        rec.clone(),
                        stop.clone(),
                    ))
                })
                .collect();
            for l in loops {
                let _ = l.await;
            }
        }
    });
    let watch_task = tokio::spawn(watch_loop(
        endpoints.clone(),
        cfg.key.clone(),
        put_rev + 1,
        clock,
        rec.clone(),
        stop_watch.clone(),
    ));
    Ok(LeaseKeeper {
        cfg,
        endpoints,
        clock,
        rec,
        stop_keepalives,
        stop_watch,
        keepalive_task,
        watch_task,
    })
}

async fn keepalive_loop(
    endpoints: Vec<String>,
    cfg: LeaseConfig,
    clock: Clock,
    rec: Arc<Mutex<LeaseRecord>>,
    stop: Arc<AtomicBool>,
) {
    let mut cl: Option<Client> = None;
    let mut keeper = None;
    let mut next_read = 0u64;
    while !stop.load(Ordering::SeqCst) {
        if cl.is_none() {
            cl = connect(&endpoints, cfg.request_timeout).await.ok();
            keeper = None;
        }
        let Some(c) = cl.as_mut() else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        if keeper.is_none() {
            match bounded(cfg.request_timeout, c.lease_keep_alive(cfg.lease)).await {
                Ok(k) => keeper = Some(k),
                Err(_) => {
                    cl = None;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            }
        }
        // which leader this member names, for the expiry deadline
        if let Ok(Ok(st)) = tokio::time::timeout(cfg.request_timeout, c.status()).await {
            let leader = st.leader();
            let term = st.raft_term();
            rec.lock()
                .unwrap()
                .leaders_seen
                .push((clock.now(), leader, term));
        }
        let (k, s) = keeper.as_mut().expect("keeper");
        let call = clock.now();
        let r = bounded(cfg.request_timeout, async {
            k.keep_alive().await?;
            s.message().await
        })
        .await;
        let ret = clock.now();
        let (ok, ret) = match r {
            Ok(Some(resp)) => (resp.ttl() > 0, Some(ret)),
            // a definite answer "not found" (TTL 0) is known; errors are not
            Ok(None) | Err(_) => (false, None),
        };
        if ret.is_none() {
            keeper = None;
            cl = None;
        }
        rec.lock()
            .unwrap()
            .keepalives
            .push(KeepAlive { call, ret, ok });
        if let Some(c) = cl.as_mut() {
            if clock.now() >= next_read {
                let call = clock.now();
                if let Ok(found) = get_found(c, &cfg.key, cfg.request_timeout).await {
                    let ret = clock.now();
                    rec.lock().unwrap().reads.push(KeyRead { call, ret, found });
                }
                next_read = clock.now() + cfg.read_every.as_nanos() as u64;
            }
        }
        tokio::time::sleep(cfg.keepalive_every).await;
    }
}

async fn watch_loop(
    endpoints: Vec<String>,
    key: String,
    mut resume: i64,
    clock: Clock,
    rec: Arc<Mutex<LeaseRecord>>,
    stop: Arc<AtomicBool>,
) {
    let mut member = 0;
    'outer: while !stop.load(Ordering::SeqCst) {
        let eps = &endpoints[member..=member];
        member = (member + 1) % endpoints.len();
        let Ok(mut cl) = connect(eps, Duration::from_secs(2)).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let opts = WatchOptions::new().with_start_revision(resume);
        let Ok(Ok(ws)) =
            tokio::time::timeout(Duration::from_secs(2), cl.watch(key.clone(), Some(opts))).await
        else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let (_tx, mut rx) = ws.split();
        loop {
            if stop.load(Ordering::SeqCst) {
                break 'outer;
            }
            let m = match tokio::time::timeout(Duration::from_millis(200), rx.message()).await {
                Err(_) => continue,
                Ok(Ok(Some(m))) => m,
                Ok(_) => break,
            };
            if m.canceled() {
                if m.compact_revision() > 0 {
                    resume = m.compact_revision();
                }
                break;
            }
            let now = clock.now();
            let mut r = rec.lock().unwrap();
            for e in m.events() {
                let rev = e.kv().map(|kv| kv.mod_revision()).unwrap_or(0);
                resume = resume.max(rev + 1);
                match e.event_type() {
                    EventType::Delete => r.delete_events.push(now),
                    EventType::Put => r.put_events.push(now),
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl LeaseKeeper {
    /// Stops the keepalives (call it once the cluster is healed), polls the
    /// key until it is gone (or the deadline + 3 s passed), stops the
    /// watcher and returns the record.
    pub async fn finish(self) -> LeaseRecord {
        self.stop_keepalives.store(true, Ordering::SeqCst);
        let _ = self.keepalive_task.await;
        let stopped = self.clock.now();
        let deadline = {
            let mut r = self.rec.lock().unwrap();
            r.keepalives_stopped = Some(stopped);
            r.expiry_deadline()
        };
        let mut give_up = deadline + 3_000_000_000;
        let mut cl: Option<Client> = None;
        while self.clock.now() < give_up {
            if cl.is_none() {
                cl = connect(&self.endpoints, self.cfg.request_timeout)
                    .await
                    .ok();
            }
            if let Some(c) = cl.as_mut() {
                // A leader elected after the keepalives stopped (the
                // cluster settling after the heal) re-grants the TTL too:
                // keep recording the leaders until the key is gone.
                if let Ok(Ok(st)) = tokio::time::timeout(self.cfg.request_timeout, c.status()).await
                {
                    let now = self.clock.now();
                    let mut r = self.rec.lock().unwrap();
                    r.leaders_seen.push((now, st.leader(), st.raft_term()));
                    give_up = give_up.max(r.expiry_deadline() + 3_000_000_000);
                }
                let call = self.clock.now();
                match get_found(c, &self.cfg.key, self.cfg.request_timeout).await {
                    Ok(found) => {
                        let ret = self.clock.now();
                        self.rec
                            .lock()
                            .unwrap()
                            .reads
                            .push(KeyRead { call, ret, found });
                        if !found {
                            break;
                        }
                    }
                    Err(_) => cl = None,
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // let the watcher get the DELETE event
        tokio::time::sleep(Duration::from_millis(500)).await;
        self.stop_watch.store(true, Ordering::SeqCst);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.watch_task).await;
        let r = self.rec.lock().unwrap().clone();
        r
    }
}
