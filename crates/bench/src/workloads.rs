//! etcd benchmark's request workloads: put, range, txn-put, txn-mixed,
//! lease-keepalive, stm, watch-get. Each builds the requests etcd's Go tool
//! builds (same key encoding, same defaults) and hands them to
//! [`crate::runner::run`].

use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp, WatchOptions};
use rand::Rng;

use crate::report::Report;
use crate::runner::{run, Drive};

/// Key and value shape (etcd's `--key-size`, `--val-size`,
/// `--key-space-size`, `--sequential-keys`).
#[derive(Debug, Clone)]
pub struct KeyOpts {
    pub key_size: usize,
    pub val_size: usize,
    pub key_space_size: u64,
    pub sequential_keys: bool,
}

impl KeyOpts {
    /// The key for request `i`: like etcd, a `key_size`-byte zeroed buffer
    /// with the key number written as a (zig-zag) varint at its start.
    pub fn key(&self, i: u64) -> Vec<u8> {
        let space = self.key_space_size.max(1);
        let n = if self.sequential_keys {
            i % space
        } else {
            rand::rng().random_range(0..space)
        };
        encode_key(n, self.key_size)
    }

    pub fn value(&self) -> Vec<u8> {
        vec![b'x'; self.val_size]
    }
}

/// etcd's `binary.PutVarint(k, n)` into a zeroed `size`-byte key (never
/// shorter than the varint itself).
pub fn encode_key(n: u64, size: usize) -> Vec<u8> {
    let mut zz = (n as i64 as u64) << 1; // zig-zag of a non-negative number
    let mut k = Vec::with_capacity(size.max(10));
    loop {
        let b = (zz & 0x7f) as u8;
        zz >>= 7;
        if zz == 0 {
            k.push(b);
            break;
        }
        k.push(b | 0x80);
    }
    if k.len() < size {
        k.resize(size, 0);
    }
    k
}

/// `put`: `total` puts of random (or sequential) keys.
pub async fn put(clients: &[Client], d: &Drive, k: &KeyOpts) -> Report {
    let val = Arc::new(k.value());
    let k = Arc::new(k.clone());
    run("put", d, |c| {
        let kv = clients[c % clients.len()].kv_client();
        let val = val.clone();
        let k = k.clone();
        move |i| {
            let mut kv = kv.clone();
            let key = k.key(i);
            let val = (*val).clone();
            async move {
                kv.put(key, val, None).await?;
                Ok(())
            }
        }
    })
    .await
}

/// `range key [end]`: `total` ranges, linearizable (`l`) or serializable (`s`).
pub async fn range(
    clients: &[Client],
    d: &Drive,
    key: Vec<u8>,
    end: Option<Vec<u8>>,
    serializable: bool,
    limit: i64,
    count_only: bool,
) -> Report {
    let mut opts = GetOptions::new();
    if let Some(end) = end {
        opts = opts.with_range(end);
    }
    if serializable {
        opts = opts.with_serializable();
    }
    if limit > 0 {
        opts = opts.with_limit(limit);
    }
    if count_only {
        opts = opts.with_count_only();
    }
    let key = Arc::new(key);
    run("range", d, |c| {
        let kv = clients[c % clients.len()].kv_client();
        let key = key.clone();
        let opts = opts.clone();
        move |_| {
            let mut kv = kv.clone();
            let key = (*key).clone();
            let opts = opts.clone();
            async move {
                kv.get(key, Some(opts)).await?;
                Ok(())
            }
        }
    })
    .await
}

/// `txn-put`: transactions of `txn_ops` puts each (no compares), on
/// distinct keys drawn like `put`'s.
pub async fn txn_put(clients: &[Client], d: &Drive, k: &KeyOpts, txn_ops: usize) -> Report {
    let val = Arc::new(k.value());
    let k = Arc::new(k.clone());
    let ops = txn_ops.max(1) as u64;
    run("txn-put", d, |c| {
        let kv = clients[c % clients.len()].kv_client();
        let val = val.clone();
        let k = k.clone();
        move |i| {
            let mut kv = kv.clone();
            let mut keys: Vec<Vec<u8>> = Vec::with_capacity(ops as usize);
            for j in 0..ops {
                let key = k.key(i * ops + j);
                if !keys.contains(&key) {
                    keys.push(key);
                }
            }
            let puts: Vec<TxnOp> = keys
                .into_iter()
                .map(|key| TxnOp::put(key, (*val).clone(), None))
                .collect();
            async move {
                kv.txn(Txn::new().and_then(puts)).await?;
                Ok(())
            }
        }
    })
    .await
}

/// `txn-mixed key [end]`: reads (ranges over `[key, end)`) and writes (puts
/// of random keys) mixed `rw_ratio` : 1; one report for each.
pub async fn txn_mixed(
    clients: &[Client],
    d: &Drive,
    k: &KeyOpts,
    key: Vec<u8>,
    end: Option<Vec<u8>>,
    serializable: bool,
    rw_ratio: f64,
) -> (Report, Report) {
    use hdrhistogram::Histogram;
    use std::sync::Mutex;
    let mut opts = GetOptions::new();
    if let Some(end) = end {
        opts = opts.with_range(end);
    }
    if serializable {
        opts = opts.with_serializable();
    }
    let reads: Arc<Mutex<Histogram<u64>>> = Arc::new(Mutex::new(crate::report::new_histogram()));
    let writes: Arc<Mutex<Histogram<u64>>> = Arc::new(Mutex::new(crate::report::new_histogram()));
    let val = Arc::new(k.value());
    let k = Arc::new(k.clone());
    let key = Arc::new(key);
    let p_read = rw_ratio / (rw_ratio + 1.0);
    let all = run("txn-mixed", d, |c| {
        let kv = clients[c % clients.len()].kv_client();
        let (val, k, key, opts) = (val.clone(), k.clone(), key.clone(), opts.clone());
        let (reads, writes) = (reads.clone(), writes.clone());
        move |i| {
            let mut kv = kv.clone();
            let is_read = rand::rng().random_bool(p_read.clamp(0.0, 1.0));
            let wkey = k.key(i);
            let (val, key, opts) = ((*val).clone(), (*key).clone(), opts.clone());
            let (reads, writes) = (reads.clone(), writes.clone());
            async move {
                let t = std::time::Instant::now();
                if is_read {
                    kv.get(key, Some(opts)).await?;
                    let ns = t.elapsed().as_nanos().max(1) as u64;
                    reads.lock().expect("not poisoned").saturating_record(ns);
                } else {
                    kv.put(wkey, val, None).await?;
                    let ns = t.elapsed().as_nanos().max(1) as u64;
                    writes.lock().expect("not poisoned").saturating_record(ns);
                }
                Ok(())
            }
        }
    })
    .await;
    let elapsed = std::time::Duration::from_secs_f64(all.total_secs);
    let r = reads.lock().expect("not poisoned");
    let w = writes.lock().expect("not poisoned");
    let share = |n: u64| all.client_cpu_secs * n as f64 / (r.len() + w.len()).max(1) as f64;
    (
        Report::from_histogram("txn-mixed reads", &r, elapsed, 0, None, share(r.len())),
        Report::from_histogram(
            "txn-mixed writes",
            &w,
            elapsed,
            all.errors,
            all.first_error.clone(),
            share(w.len()),
        ),
    )
}

/// `lease-keepalive`: each client grants one lease, then every request is
/// one keep-alive round trip on that client's keep-alive stream.
pub async fn lease_keepalive(clients: &[Client], d: &Drive) -> Result<Report> {
    use tokio::sync::Mutex;
    let mut states = Vec::with_capacity(d.clients);
    for c in 0..d.clients.max(1) {
        let mut lc = clients[c % clients.len()].lease_client();
        let id = lc.grant(60, None).await?.id();
        let (keeper, stream) = lc.keep_alive(id).await?;
        states.push(Arc::new(Mutex::new((keeper, stream))));
    }
    Ok(run("lease-keepalive", d, |c| {
        let st = states[c].clone();
        move |_| {
            let st = st.clone();
            async move {
                let mut g = st.lock().await;
                let (keeper, stream) = &mut *g;
                keeper.keep_alive().await?;
                match stream.message().await? {
                    Some(r) if r.ttl() > 0 => Ok(()),
                    Some(_) => Err(anyhow!("lease expired")),
                    None => Err(anyhow!("keep-alive stream closed")),
                }
            }
        }
    })
    .await)
}

/// `stm`: software transactional memory as etcd's concurrency.STM does
/// (serializable isolation): read `keys_per_txn` random keys out of
/// `keys`, then commit puts of all of them guarded by `mod_revision`
/// compares; a failed commit is retried. One request = one committed txn.
pub async fn stm(
    clients: &[Client],
    d: &Drive,
    keys: u64,
    keys_per_txn: usize,
    val_size: usize,
) -> Report {
    let mut r = {
        let conflicts = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let cf = conflicts.clone();
        let mut r = run("stm", d, move |c| {
            let kv = clients[c % clients.len()].kv_client();
            let conflicts = cf.clone();
            move |_| {
                let mut kv = kv.clone();
                let mut rng = rand::rng();
                let mut ks: Vec<Vec<u8>> = Vec::new();
                while ks.len() < keys_per_txn.max(1).min(keys.max(1) as usize) {
                    let k = format!("stm/{:08}", rng.random_range(0..keys.max(1))).into_bytes();
                    if !ks.contains(&k) {
                        ks.push(k);
                    }
                }
                let conflicts = conflicts.clone();
                async move {
                    for _attempt in 0..100 {
                        let mut cmps = Vec::with_capacity(ks.len());
                        let mut puts = Vec::with_capacity(ks.len());
                        for k in &ks {
                            let resp = kv.get(k.clone(), None).await?;
                            let rev = resp.kvs().first().map(|kv| kv.mod_revision()).unwrap_or(0);
                            cmps.push(Compare::mod_revision(k.clone(), CompareOp::Equal, rev));
                            puts.push(TxnOp::put(k.clone(), vec![b'v'; val_size], None));
                        }
                        let resp = kv.txn(Txn::new().when(cmps).and_then(puts)).await?;
                        if resp.succeeded() {
                            return Ok(());
                        }
                        conflicts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    bail!("stm: 100 conflicting attempts")
                }
            }
        })
        .await;
        r.extra.insert(
            "conflicts".into(),
            conflicts.load(std::sync::atomic::Ordering::Relaxed).into(),
        );
        r
    };
    r.name = "stm".into();
    r
}

/// `watch-get`: `watchers` watch streams on `key`, then `total` gets of it.
pub async fn watch_get(
    clients: &[Client],
    d: &Drive,
    key: Vec<u8>,
    watchers: usize,
) -> Result<Report> {
    let mut keep = Vec::with_capacity(watchers);
    for w in 0..watchers {
        let mut wc = clients[w % clients.len()].watch_client();
        let mut s = wc.watch(key.clone(), Some(WatchOptions::new())).await?;
        s.message().await?;
        keep.push(s);
    }
    let key = Arc::new(key);
    let r = run("watch-get", d, |c| {
        let kv = clients[c % clients.len()].kv_client();
        let key = key.clone();
        move |_| {
            let mut kv = kv.clone();
            let key = (*key).clone();
            async move {
                kv.get(key, None).await?;
                Ok(())
            }
        }
    })
    .await;
    drop(keep);
    Ok(r)
}
