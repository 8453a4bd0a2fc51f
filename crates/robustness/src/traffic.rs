//! The traffic generator: concurrent clients doing a seeded random mix of
//! etcd requests with unique values, recording every call and return, and
//! watchers recording every response of their streams.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue, LeaseGrantOptions,
    PutOptions, Txn, TxnOp, TxnOpResponse, WatchFilterType, WatchOptions,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::history::{History, Kv, Operation, Request, Response, StaleRead};
use crate::watch::{EventKind, Filter, WatchEvent, WatchItem, WatchRecord};

/// One clock for the whole run (call/return times are nanoseconds on it).
#[derive(Clone, Copy, Debug)]
pub struct Clock(Instant);

impl Clock {
    pub fn new() -> Clock {
        Clock(Instant::now())
    }
    pub fn now(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

#[derive(Clone, Debug)]
pub struct TrafficConfig {
    pub clients: usize,
    pub keys: usize,
    /// Every key is `prefix` + `k{i}`.
    pub prefix: String,
    pub request_timeout: Duration,
    /// Pause between two requests of one client: uniform in 0..=this.
    pub think_time: Duration,
    /// Each client stops after this many requests.
    pub max_ops_per_client: usize,
    /// Whether client 0 compacts now and then (to `rev - 100`).
    pub compaction: bool,
    /// The Kubernetes-like profile: mostly CAS updates of few objects,
    /// lists of the prefix, rare deletes.
    pub kubernetes: bool,
}

impl Default for TrafficConfig {
    fn default() -> Self {
        TrafficConfig {
            clients: 6,
            keys: 10,
            prefix: "/rb/".into(),
            request_timeout: Duration::from_secs(3),
            think_time: Duration::from_millis(4),
            max_ops_per_client: 100_000,
            compaction: true,
            kubernetes: false,
        }
    }
}

/// A client of `endpoints` (1 s connect, `timeout` per request); the
/// connect itself is bounded by `timeout` too.
pub async fn connect(
    endpoints: &[String],
    timeout: Duration,
) -> Result<Client, etcd_client::Error> {
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_timeout(timeout);
    match tokio::time::timeout(timeout, Client::connect(endpoints, Some(opts))).await {
        Ok(r) => r,
        Err(_) => Err(etcd_client::Error::IoError(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "connect timed out",
        ))),
    }
}

/// `fut` bounded by `d` (an elapsed timeout is an `IoError(TimedOut)`).
pub async fn bounded<T>(
    d: Duration,
    fut: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, etcd_client::Error> {
    match tokio::time::timeout(d, fut).await {
        Ok(r) => r,
        Err(_) => Err(etcd_client::Error::IoError(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "request timed out",
        ))),
    }
}

pub fn kv_of(kv: &KeyValue) -> Kv {
    Kv {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        value: String::from_utf8_lossy(kv.value()).into_owned(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        version: kv.version(),
        lease: kv.lease(),
    }
}

fn is_lease_not_found(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s) if s.message().contains("lease not found"))
}

fn rev_of(h: Option<&etcd_client::ResponseHeader>) -> i64 {
    h.map(|h| h.revision()).unwrap_or(-1)
}

/// Counters of a run, for the report.
#[derive(Debug, Default, Clone)]
pub struct TrafficStats {
    pub ok: usize,
    pub unknown: usize,
    pub failed_reads: usize,
    pub compactions: usize,
}

struct ClientState {
    id: usize,
    rng: StdRng,
    seq: u64,
    granted: Vec<i64>,
    revoked: Vec<i64>,
    last_mod: std::collections::HashMap<String, i64>,
    last_rev: i64,
    compacted: i64,
}

/// Runs `cfg.clients` clients against `endpoints` until `stop` is set;
/// `member_endpoints[i]` is used for serializable reads from member i.
pub async fn run_traffic(
    endpoints: Vec<String>,
    member_endpoints: Vec<String>,
    cfg: TrafficConfig,
    seed: u64,
    clock: Clock,
    stop: Arc<AtomicBool>,
) -> (History, TrafficStats) {
    let mut tasks = Vec::new();
    for c in 0..cfg.clients {
        let (eps, meps, cfg, stop) = (
            endpoints.clone(),
            member_endpoints.clone(),
            cfg.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            run_client(c, eps, meps, cfg, seed, clock, stop).await
        }));
    }
    let mut h = History::default();
    let mut stats = TrafficStats::default();
    for t in tasks {
        if let Ok((ops, stale, compactions, st)) = t.await {
            h.ops.extend(ops);
            h.compactions.extend(compactions);
            h.stale_reads.extend(stale);
            stats.ok += st.ok;
            stats.unknown += st.unknown;
            stats.failed_reads += st.failed_reads;
            stats.compactions += st.compactions;
        }
    }
    h.ops.sort_by_key(|o| o.call);
    (h, stats)
}

async fn run_client(
    id: usize,
    endpoints: Vec<String>,
    member_endpoints: Vec<String>,
    cfg: TrafficConfig,
    seed: u64,
    clock: Clock,
    stop: Arc<AtomicBool>,
) -> (Vec<Operation>, Vec<StaleRead>, Vec<i64>, TrafficStats) {
    let mut st = ClientState {
        id,
        rng: StdRng::seed_from_u64(seed ^ (0x5851_f42d_4c95_7f2d_u64.wrapping_mul(id as u64 + 1))),
        seq: 0,
        granted: Vec::new(),
        revoked: Vec::new(),
        last_mod: Default::default(),
        last_rev: 0,
        compacted: 0,
    };
    let mut ops = Vec::new();
    let mut stale = Vec::new();
    let mut compactions = Vec::new();
    let mut stats = TrafficStats::default();
    let mut client: Option<Client> = None;
    let mut members: Vec<Option<Client>> = vec![None; member_endpoints.len()];
    while !stop.load(Ordering::Relaxed) && ops.len() < cfg.max_ops_per_client {
        if client.is_none() {
            match tokio::time::timeout(
                cfg.request_timeout,
                connect(&endpoints, cfg.request_timeout),
            )
            .await
            {
                Ok(Ok(c)) => client = Some(c),
                _ => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            }
        }
        let cl = client.as_mut().expect("connected");
        let think = cfg.think_time.as_micros() as u64;
        if think > 0 {
            let us = st.rng.random_range(0..=think);
            tokio::time::sleep(Duration::from_micros(us)).await;
        }
        let roll = st.rng.random_range(0..100u32);
        let key = format!("{}k{}", cfg.prefix, st.rng.random_range(0..cfg.keys));
        st.seq += 1;
        let value = format!("c{}-{}", st.id, st.seq);
        // Serializable read from one member.
        let stale_cut = if cfg.kubernetes { 5 } else { 8 };
        if roll < stale_cut && !member_endpoints.is_empty() {
            let m = st.rng.random_range(0..member_endpoints.len());
            if members[m].is_none() {
                members[m] = tokio::time::timeout(
                    cfg.request_timeout,
                    connect(&member_endpoints[m..=m], cfg.request_timeout),
                )
                .await
                .ok()
                .and_then(|r| r.ok());
            }
            if let Some(mc) = members[m].as_mut() {
                let get = mc.get(key.clone(), Some(GetOptions::new().with_serializable()));
                match tokio::time::timeout(cfg.request_timeout, get)
                    .await
                    .map_err(|_| ())
                    .and_then(|r| r.map_err(|_| ()))
                {
                    Ok(r) => stale.push(StaleRead {
                        member: m,
                        key,
                        rev: rev_of(r.header()),
                        kv: r.kvs().first().map(kv_of),
                    }),
                    Err(_) => {
                        stats.failed_reads += 1;
                        members[m] = None;
                    }
                }
            }
            continue;
        }
        // Compaction (client 0 only), not part of the KV model.
        if id == 0 && cfg.compaction && roll < stale_cut + 4 && st.last_rev - 100 > st.compacted {
            let to = st.last_rev - 100;
            compactions.push(to);
            if let Ok(Ok(_)) = tokio::time::timeout(cfg.request_timeout, cl.compact(to, None)).await
            {
                st.compacted = to;
                stats.compactions += 1;
            }
            continue;
        }
        let req = if cfg.kubernetes {
            match roll {
                0..=34 => Request::Cas {
                    expected_mod_rev: st.last_mod.get(&key).copied().unwrap_or(0),
                    key,
                    value,
                },
                35..=54 => Request::Range {
                    prefix: cfg.prefix.clone(),
                },
                55..=74 => Request::Get { key },
                75..=94 => Request::Cas {
                    key,
                    expected_mod_rev: 0,
                    value,
                },
                _ => Request::Delete { key },
            }
        } else {
            match roll {
                0..=29 => Request::Get { key },
                30..=37 => Request::Range {
                    prefix: cfg.prefix.clone(),
                },
                38..=59 => Request::Put {
                    key,
                    value,
                    lease: 0,
                },
                60..=67 => Request::Delete { key },
                68..=81 => Request::Cas {
                    expected_mod_rev: if st.rng.random_bool(0.7) {
                        st.last_mod.get(&key).copied().unwrap_or(0)
                    } else {
                        st.rng.random_range(0..=st.last_rev.max(1))
                    },
                    key,
                    value,
                },
                82..=86 => Request::LeaseGrant {
                    id: ((st.id as i64 + 1) << 32) | st.seq as i64,
                },
                87..=94 => {
                    let lease = if !st.granted.is_empty() && st.rng.random_bool(0.9) {
                        st.granted[st.rng.random_range(0..st.granted.len())]
                    } else if !st.revoked.is_empty() {
                        st.revoked[st.rng.random_range(0..st.revoked.len())]
                    } else {
                        ((st.id as i64 + 1) << 32) | 0x0fff_ffff
                    };
                    Request::Put { key, value, lease }
                }
                _ => {
                    if st.granted.is_empty() {
                        Request::Get { key }
                    } else {
                        let i = st.rng.random_range(0..st.granted.len());
                        Request::LeaseRevoke { id: st.granted[i] }
                    }
                }
            }
        };
        let call = clock.now();
        let res = tokio::time::timeout(
            cfg.request_timeout + Duration::from_secs(1),
            execute(cl, &req),
        )
        .await;
        let ret = clock.now();
        let resp = match res {
            Ok(Ok(r)) => Some(r),
            Ok(Err(e)) if is_lease_not_found(&e) => Some(Response::LeaseNotFound),
            Ok(Err(_)) | Err(_) => None,
        };
        // Bookkeeping for the next choices.
        match (&req, &resp) {
            (Request::LeaseGrant { id }, _) => st.granted.push(*id),
            (Request::LeaseRevoke { id }, _) => {
                st.granted.retain(|x| x != id);
                st.revoked.push(*id);
            }
            _ => {}
        }
        match &resp {
            Some(Response::Get { kv, rev }) => {
                st.last_rev = st.last_rev.max(*rev);
                if let (Request::Get { key }, Some(kv)) = (&req, kv) {
                    st.last_mod.insert(key.clone(), kv.mod_revision);
                }
            }
            Some(Response::Put { rev })
            | Some(Response::Delete { rev, .. })
            | Some(Response::Range { rev, .. }) => {
                st.last_rev = st.last_rev.max(*rev);
                if let Request::Put { key, .. } = &req {
                    st.last_mod.insert(key.clone(), *rev);
                }
            }
            Some(Response::Cas { succeeded, kv, rev }) => {
                st.last_rev = st.last_rev.max(*rev);
                if let Request::Cas { key, .. } = &req {
                    let m = if *succeeded {
                        *rev
                    } else {
                        kv.as_ref().map(|k| k.mod_revision).unwrap_or(0)
                    };
                    st.last_mod.insert(key.clone(), m);
                }
            }
            _ => {}
        }
        let is_read = matches!(req, Request::Get { .. } | Request::Range { .. });
        match (&resp, is_read) {
            (None, true) => {
                stats.failed_reads += 1;
                let ms = st.rng.random_range(50..=150);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                continue;
            }
            (None, false) => {
                stats.unknown += 1;
                // The channel may be broken: reconnect next time, after a pause.
                client = None;
                let ms = st.rng.random_range(50..=150);
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            _ => stats.ok += 1,
        }
        ops.push(Operation {
            client: id,
            req,
            call,
            ret: resp.as_ref().map(|_| ret),
            resp,
        });
    }
    (ops, stale, compactions, stats)
}

/// Sends one request and converts the answer into the model's terms.
pub async fn execute(cl: &mut Client, req: &Request) -> Result<Response, etcd_client::Error> {
    Ok(match req {
        Request::Get { key } => {
            let r = cl.get(key.clone(), None).await?;
            Response::Get {
                kv: r.kvs().first().map(kv_of),
                rev: rev_of(r.header()),
            }
        }
        Request::Range { prefix } => {
            let r = cl
                .get(prefix.clone(), Some(GetOptions::new().with_prefix()))
                .await?;
            Response::Range {
                kvs: r.kvs().iter().map(kv_of).collect(),
                rev: rev_of(r.header()),
            }
        }
        Request::Put { key, value, lease } => {
            let opts = (*lease != 0).then(|| PutOptions::new().with_lease(*lease));
            let r = cl.put(key.clone(), value.clone(), opts).await?;
            Response::Put {
                rev: rev_of(r.header()),
            }
        }
        Request::Delete { key } => {
            let r = cl.delete(key.clone(), None).await?;
            Response::Delete {
                deleted: r.deleted(),
                rev: rev_of(r.header()),
            }
        }
        Request::Cas {
            key,
            expected_mod_rev,
            value,
        } => {
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    key.clone(),
                    CompareOp::Equal,
                    *expected_mod_rev,
                )])
                .and_then([TxnOp::put(key.clone(), value.clone(), None)])
                .or_else([TxnOp::get(key.clone(), None)]);
            let r = cl.txn(txn).await?;
            let kv = if r.succeeded() {
                None
            } else {
                r.op_responses().iter().find_map(|o| match o {
                    TxnOpResponse::Get(g) => g.kvs().first().map(kv_of),
                    _ => None,
                })
            };
            Response::Cas {
                succeeded: r.succeeded(),
                kv,
                rev: rev_of(r.header()),
            }
        }
        Request::LeaseGrant { id } => {
            let r = cl
                .lease_grant(3600, Some(LeaseGrantOptions::new().with_id(*id)))
                .await?;
            Response::LeaseGrant {
                rev: rev_of(r.header()),
            }
        }
        Request::LeaseRevoke { id } => {
            let r = cl.lease_revoke(*id).await?;
            Response::LeaseRevoke {
                rev: rev_of(r.header()),
            }
        }
    })
}

/// How a watcher is set up.
#[derive(Clone, Debug)]
pub struct WatcherConfig {
    pub id: usize,
    /// The member it watches first (it moves to the next one when that one fails).
    pub member: usize,
    pub filter: Filter,
    pub prev_kv: bool,
    pub prefix: String,
    pub start_rev: i64,
    /// Ask for a progress notification this often.
    pub progress_every: Duration,
    /// The run's clock (receipt times of event responses).
    pub clock: Clock,
}

/// Runs a watcher until it has seen `target` (once set > 0) or `deadline_after_target` passes after
/// the target is set, or `abort` is set.
pub async fn run_watcher(
    cfg: WatcherConfig,
    member_endpoints: Vec<String>,
    target: Arc<AtomicI64>,
    give_up: Duration,
    abort: Arc<AtomicBool>,
) -> WatchRecord {
    let mut rec = WatchRecord {
        id: cfg.id,
        member: cfg.member,
        filter: cfg.filter,
        prev_kv: cfg.prev_kv,
        start_rev: cfg.start_rev,
        items: Vec::new(),
    };
    let mut member = cfg.member;
    let mut resume = cfg.start_rev;
    let mut target_seen_at: Option<Instant> = None;
    let done = |resume: i64, target_seen_at: &mut Option<Instant>| -> bool {
        let t = target.load(Ordering::SeqCst);
        if t > 0 {
            if resume > t {
                return true;
            }
            let at = *target_seen_at.get_or_insert_with(Instant::now);
            if at.elapsed() > give_up {
                return true;
            }
        }
        abort.load(Ordering::SeqCst)
    };
    'outer: while !done(resume, &mut target_seen_at) {
        let eps = &member_endpoints[member..=member];
        let reason;
        match tokio::time::timeout(Duration::from_secs(3), connect(eps, Duration::from_secs(3)))
            .await
        {
            Err(_) => reason = "connect: timeout".to_string(),
            Ok(Err(e)) => reason = format!("connect: {e}"),
            Ok(Ok(mut cl)) => {
                let mut opts = WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(resume);
                if cfg.prev_kv {
                    opts = opts.with_prev_key();
                }
                match cfg.filter {
                    Filter::NoPut => opts = opts.with_filters([WatchFilterType::NoPut]),
                    Filter::NoDelete => opts = opts.with_filters([WatchFilterType::NoDelete]),
                    Filter::None => {}
                }
                match tokio::time::timeout(
                    Duration::from_secs(3),
                    cl.watch(cfg.prefix.clone(), Some(opts)),
                )
                .await
                {
                    Err(_) => reason = "watch: timeout".to_string(),
                    Ok(Err(e)) => reason = format!("watch: {e}"),
                    Ok(Ok(ws)) => {
                        let (mut tx, mut rx) = ws.split();
                        let mut tick = tokio::time::interval(cfg.progress_every);
                        let r = loop {
                            if done(resume, &mut target_seen_at) {
                                break 'outer;
                            }
                            tokio::select! {
                                _ = tick.tick() => {
                                    match tokio::time::timeout(Duration::from_secs(1), tx.request_progress()).await {
                                        Ok(Ok(())) => {}
                                        Ok(Err(e)) => break format!("progress request: {e}"),
                                        Err(_) => break "progress request: timeout".to_string(),
                                    }
                                }
                                m = tokio::time::timeout(Duration::from_millis(500), rx.message()) => {
                                    let m = match m { Err(_) => continue, Ok(m) => m };
                                    match m {
                                        Err(e) => break format!("stream: {e}"),
                                        Ok(None) => break "stream ended".to_string(),
                                        Ok(Some(resp)) => {
                                            if resp.created() && resp.events().is_empty() && !resp.canceled() {
                                                continue;
                                            }
                                            if resp.canceled() {
                                                if resp.compact_revision() > 0 {
                                                    rec.items.push(WatchItem::Compacted { compact_rev: resp.compact_revision() });
                                                    resume = resp.compact_revision();
                                                    continue 'outer;
                                                }
                                                break format!("canceled: {}", resp.cancel_reason());
                                            }
                                            let hrev = rev_of(resp.header());
                                            if resp.events().is_empty() {
                                                rec.items.push(WatchItem::Progress { rev: hrev });
                                                resume = resume.max(hrev + 1);
                                                continue;
                                            }
                                            let events: Vec<WatchEvent> = resp.events().iter().map(|e| {
                                                let kind = match e.event_type() { EventType::Put => EventKind::Put, EventType::Delete => EventKind::Delete };
                                                WatchEvent {
                                                    kind,
                                                    kv: e.kv().map(kv_of).unwrap_or(Kv { key: String::new(), value: String::new(), create_revision: 0, mod_revision: 0, version: 0, lease: 0 }),
                                                    prev_kv: e.prev_kv().map(kv_of),
                                                }
                                            }).collect();
                                            let last = events.iter().map(|e| e.kv.mod_revision).max().unwrap_or(0);
                                            resume = resume.max(last + 1);
                                            rec.items.push(WatchItem::Events { header_rev: hrev, events, time: cfg.clock.now() });
                                        }
                                    }
                                }
                            }
                        };
                        reason = r;
                    }
                }
            }
        }
        rec.items.push(WatchItem::Restart {
            resume_rev: resume,
            reason,
        });
        member = (member + 1) % member_endpoints.len();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    rec
}
