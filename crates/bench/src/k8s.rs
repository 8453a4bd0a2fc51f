//! `k8s`: the traffic kube-apiserver sends to etcd.
//!
//! Objects live under `/registry/<kind>/<namespace>/<name>`. As
//! kube-apiserver's etcd3 store does:
//! * **create**: `txn(create_revision(key) = 0) then put else get`
//! * **update** (GuaranteedUpdate): `txn(mod_revision(key) = R) then put else get`,
//!   where R is the revision this client last saw for the object; a failed
//!   compare (someone else updated it) refreshes R from the `get` and counts
//!   as a conflict;
//! * **delete**: `txn(mod_revision(key) = R) then delete else get`;
//! * **get**: a linearizable range of one key;
//! * **list**: paginated — `limit` keys per page, the next page starts at the
//!   last key + `\0` and reads at the first page's revision (a consistent
//!   snapshot, as the apiserver's `continue` token does);
//! * **watch**: prefix watches on `/registry/<kind>/` from the revision of an
//!   initial list (the informer's list-then-watch).
//!
//! One request is one of these operations; a list counts as one request
//! however many pages it reads.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, KvClient, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use hdrhistogram::Histogram;
use rand::Rng;

use crate::report::{new_histogram, Report};
use crate::runner::{run, Drive};

#[derive(Debug, Clone)]
pub struct K8sOpts {
    pub kinds: Vec<String>,
    pub namespaces: usize,
    /// Objects created before the timed run (spread over kinds and namespaces).
    pub objects: usize,
    pub object_size: usize,
    pub list_limit: i64,
    pub watchers: usize,
    /// Weights of create, update, get, list, delete.
    pub mix: [u32; 5],
}

const OPS: [&str; 5] = ["create", "update", "get", "list", "delete"];

/// Parses `create=10,update=75,get=8,list=2,delete=5`.
pub fn parse_mix(s: &str) -> Result<[u32; 5]> {
    let mut mix = [0u32; 5];
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| anyhow!("bad mix entry {part:?}"))?;
        let i = OPS.iter().position(|o| *o == k.trim()).ok_or_else(|| {
            anyhow!("unknown op {k:?} in mix (create, update, get, list, delete)")
        })?;
        mix[i] = v.trim().parse()?;
    }
    if mix.iter().sum::<u32>() == 0 {
        bail!("mix has no weight");
    }
    Ok(mix)
}

struct World {
    o: K8sOpts,
    /// Slot → last mod_revision this benchmark saw (0 = does not exist).
    slots: Vec<Mutex<i64>>,
    value: Vec<u8>,
    hists: Vec<Mutex<Histogram<u64>>>,
    conflicts: AtomicU64,
}

impl World {
    fn key(&self, s: usize) -> Vec<u8> {
        let k = self.o.kinds.len();
        let kind = &self.o.kinds[s % k];
        let ns = (s / k) % self.o.namespaces.max(1);
        format!("/registry/{kind}/ns-{ns}/obj-{s:07}").into_bytes()
    }
    fn get(&self, s: usize) -> i64 {
        *self.slots[s].lock().expect("not poisoned")
    }
    fn set(&self, s: usize, rev: i64) {
        *self.slots[s].lock().expect("not poisoned") = rev;
    }
}

fn prefix_end(p: &[u8]) -> Vec<u8> {
    let mut e = p.to_vec();
    while let Some(last) = e.pop() {
        if last < 0xff {
            e.push(last + 1);
            return e;
        }
    }
    vec![0]
}

/// The revision the txn's else-branch `get` saw for the key (0 = absent).
fn else_rev(resp: &etcd_client::TxnResponse) -> i64 {
    for r in resp.op_responses() {
        if let TxnOpResponse::Get(g) = r {
            return g.kvs().first().map(|kv| kv.mod_revision()).unwrap_or(0);
        }
    }
    0
}

async fn create(kv: &mut KvClient, w: &World, s: usize) -> Result<()> {
    let key = w.key(s);
    let txn = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(key.clone(), w.value.clone(), None)])
        .or_else([TxnOp::get(key, None)]);
    let resp = kv.txn(txn).await?;
    if resp.succeeded() {
        w.set(s, resp.header().map(|h| h.revision()).unwrap_or(0));
    } else {
        w.conflicts.fetch_add(1, Ordering::Relaxed);
        w.set(s, else_rev(&resp));
    }
    Ok(())
}

async fn update(kv: &mut KvClient, w: &World, s: usize, rev: i64, delete: bool) -> Result<()> {
    let key = w.key(s);
    let then = if delete {
        TxnOp::delete(key.clone(), None)
    } else {
        TxnOp::put(key.clone(), w.value.clone(), None)
    };
    let txn = Txn::new()
        .when([Compare::mod_revision(key.clone(), CompareOp::Equal, rev)])
        .and_then([then])
        .or_else([TxnOp::get(key, None)]);
    let resp = kv.txn(txn).await?;
    if resp.succeeded() {
        w.set(
            s,
            if delete {
                0
            } else {
                resp.header().map(|h| h.revision()).unwrap_or(0)
            },
        );
    } else {
        w.conflicts.fetch_add(1, Ordering::Relaxed);
        w.set(s, else_rev(&resp));
    }
    Ok(())
}

/// A paginated list of `prefix`; returns (objects, revision).
async fn list(kv: &mut KvClient, prefix: &[u8], limit: i64) -> Result<(usize, i64)> {
    let end = prefix_end(prefix);
    let mut from = prefix.to_vec();
    let mut rev = 0;
    let mut n = 0;
    loop {
        let mut opts = GetOptions::new().with_range(end.clone()).with_limit(limit);
        if rev > 0 {
            opts = opts.with_revision(rev);
        }
        let resp = kv.get(from.clone(), Some(opts)).await?;
        if rev == 0 {
            rev = resp.header().map(|h| h.revision()).unwrap_or(0);
        }
        n += resp.kvs().len();
        match resp.kvs().last() {
            Some(last) if resp.more() => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => return Ok((n, rev)),
        }
    }
}

/// The workload's objects and informers, set up once; [`K8sLoad::run`]
/// then drives the operations (once for the `k8s` command, interval after
/// interval for the soak).
pub struct K8sLoad {
    world: Arc<World>,
    nslots: usize,
    events: Arc<AtomicU64>,
    watch_tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for K8sLoad {
    fn drop(&mut self) {
        for t in &self.watch_tasks {
            t.abort();
        }
    }
}

impl K8sLoad {
    /// Creates the initial objects (`d.clients`, at most 64, at a time, not
    /// timed), then starts the informers: each lists its kind, then watches
    /// it from the list revision.
    pub async fn setup(clients: &[Client], d: &Drive, o: &K8sOpts) -> Result<K8sLoad> {
        if o.kinds.is_empty() {
            bail!("k8s: no kinds");
        }
        let nslots = (o.objects * 2).max(16);
        let mut value = b"{\"apiVersion\":\"v1\",\"kind\":\"Object\",\"spec\":\"".to_vec();
        value.resize(o.object_size.max(value.len() + 2) - 2, b'x');
        value.extend_from_slice(b"\"}");
        let world = Arc::new(World {
            o: o.clone(),
            slots: (0..nslots).map(|_| Mutex::new(0)).collect(),
            value,
            hists: (0..5).map(|_| Mutex::new(new_histogram())).collect(),
            conflicts: AtomicU64::new(0),
        });
        let setup = Drive {
            clients: d.clients.min(64),
            total: o.objects as u64,
            rate: 0.0,
            progress: d.progress,
        };
        let r = run("k8s setup", &setup, |c| {
            let kv = clients[c % clients.len()].kv_client();
            let w = world.clone();
            move |i| {
                let mut kv = kv.clone();
                let w = w.clone();
                async move { create(&mut kv, &w, i as usize).await }
            }
        })
        .await;
        if r.errors > 0 {
            bail!("k8s setup: {} errors: {:?}", r.errors, r.first_error);
        }
        world.conflicts.store(0, Ordering::Relaxed);
        let events = Arc::new(AtomicU64::new(0));
        let mut watch_tasks = Vec::new();
        for wi in 0..o.watchers {
            let kind = &o.kinds[wi % o.kinds.len()];
            let prefix = format!("/registry/{kind}/").into_bytes();
            let mut kv = clients[wi % clients.len()].kv_client();
            let (_, rev) = list(&mut kv, &prefix, o.list_limit)
                .await
                .context("informer list")?;
            let mut wc = clients[wi % clients.len()].watch_client();
            let mut ws = wc
                .watch(
                    prefix.clone(),
                    Some(
                        WatchOptions::new()
                            .with_prefix()
                            .with_start_revision(rev + 1),
                    ),
                )
                .await?;
            let events = events.clone();
            watch_tasks.push(tokio::spawn(async move {
                while let Ok(Some(r)) = ws.message().await {
                    events.fetch_add(r.events().len() as u64, Ordering::Relaxed);
                }
            }));
        }
        Ok(K8sLoad {
            world,
            nslots,
            events,
            watch_tasks,
        })
    }

    /// Watch events the informers received so far.
    pub fn events(&self) -> u64 {
        self.events.load(Ordering::Relaxed)
    }

    /// Runs `d.total` operations of the mix.
    pub async fn run(&self, clients: &[Client], d: &Drive) -> Report {
        let weights = self.world.o.mix;
        let wsum: u32 = weights.iter().sum();
        let nslots = self.nslots;
        run("k8s", d, |c| {
            let kv = clients[c % clients.len()].kv_client();
            let w = self.world.clone();
            move |_| {
                let mut kv = kv.clone();
                let w = w.clone();
                let mut rng = rand::rng();
                let mut x = rng.random_range(0..wsum);
                let mut op = 0;
                while x >= weights[op] {
                    x -= weights[op];
                    op += 1;
                }
                let s = rng.random_range(0..nslots);
                let kind = w.o.kinds[rng.random_range(0..w.o.kinds.len())].clone();
                let ns = rng.random_range(0..w.o.namespaces.max(1));
                let whole_kind = rng.random_bool(0.5);
                async move {
                    let t = Instant::now();
                    let rev = w.get(s);
                    // Creating an existing object or updating a missing one is
                    // turned into the operation that makes sense for the slot.
                    let op = match (op, rev) {
                        (0, r) if r > 0 => 1,
                        (1 | 4, 0) => 0,
                        (o, _) => o,
                    };
                    match op {
                        0 => create(&mut kv, &w, s).await?,
                        1 => update(&mut kv, &w, s, rev, false).await?,
                        2 => {
                            kv.get(w.key(s), None).await?;
                        }
                        3 => {
                            let prefix = if whole_kind {
                                format!("/registry/{kind}/")
                            } else {
                                format!("/registry/{kind}/ns-{ns}/")
                            };
                            list(&mut kv, prefix.as_bytes(), w.o.list_limit).await?;
                        }
                        _ => update(&mut kv, &w, s, rev, true).await?,
                    }
                    w.hists[op]
                        .lock()
                        .expect("not poisoned")
                        .saturating_record(t.elapsed().as_nanos().max(1) as u64);
                    Ok(())
                }
            }
        })
        .await
    }
}

/// Runs the workload; returns (all operations, per-operation reports, watch events report).
pub async fn k8s(
    clients: &[Client],
    d: &Drive,
    o: &K8sOpts,
) -> Result<(Report, Vec<Report>, Report)> {
    let load = K8sLoad::setup(clients, d, o).await?;
    let started = Instant::now();
    let mut all = load.run(clients, d).await;
    let world = load.world.clone();
    let elapsed = started.elapsed();
    // Let the watchers catch up briefly, then stop them.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let ev = load.events();
    drop(load);
    all.extra.insert(
        "conflicts".into(),
        world.conflicts.load(Ordering::Relaxed).into(),
    );
    let mut per_op = Vec::new();
    let mut counts = BTreeMap::new();
    for (i, name) in OPS.iter().enumerate() {
        let h = world.hists[i].lock().expect("not poisoned");
        counts.insert(name.to_string(), serde_json::Value::from(h.len()));
        per_op.push(Report::from_histogram(
            &format!("k8s {name}"),
            &h,
            elapsed,
            0,
            None,
            0.0,
        ));
    }
    all.extra.insert(
        "ops".into(),
        serde_json::Value::Object(counts.into_iter().collect()),
    );
    let mut evr =
        Report::from_histogram("k8s watch events", &new_histogram(), elapsed, 0, None, 0.0);
    evr.ops_per_sec = ev as f64 / elapsed.as_secs_f64().max(1e-9);
    evr.extra.insert("events_delivered".into(), ev.into());
    Ok((all, per_op, evr))
}
