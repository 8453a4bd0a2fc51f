//! `lock` and `elect`: clientv3's concurrency recipes (session, mutex,
//! election) run client-side over KV, lease and watch, as etcdctl does,
//! so retcdctl and etcdctl holders of the same lock or election exclude
//! each other.

use std::time::{Duration, Instant};

use etcd_client::proto::{PbKeyValue, PbRangeResponse, PbResponseHeader, PbTxnOpResponse};
use etcd_client::{
    Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, WatchOptions,
};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::watch;

use crate::client::{Conn, Exit, RpcError, EXIT_BAD_ARGS, EXIT_ERROR};
use crate::printer::Printer;
use crate::Ctx;

/// A recipe failure: what `err.Error()` says.
type R<T> = Result<T, String>;

fn rpc(e: etcd_client::Error) -> String {
    RpcError::from(e).message()
}

const CANCELED: &str = "context canceled";

/// SIGINT or SIGTERM (etcdctl's `signal.Notify(sigc, SIGINT, SIGTERM)`).
pub struct Signals {
    int: Signal,
    term: Signal,
}

impl Signals {
    pub fn new() -> Result<Signals, Exit> {
        let e = |e: std::io::Error| Exit::new(EXIT_ERROR, e.to_string());
        Ok(Signals {
            int: signal(SignalKind::interrupt()).map_err(e)?,
            term: signal(SignalKind::terminate()).map_err(e)?,
        })
    }

    pub async fn recv(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}

/// `concurrency.Session`: a lease kept alive until it expires (or the
/// keep-alive cannot reach the server for a whole TTL).
pub struct Session {
    pub lease: i64,
    done: watch::Receiver<bool>,
}

impl Session {
    pub async fn new(c: &Conn, ttl: i64) -> R<Session> {
        let ttl = if ttl > 0 { ttl } else { 60 };
        let mut l = c.client.lease_client();
        let id = c
            .unary(None, l.grant(ttl, None))
            .await
            .map_err(|e| e.message())?
            .0
            .id;
        let (mut keeper, mut stream) = l.keep_alive(id).await.map_err(rpc)?;
        let (tx, done) = watch::channel(false);
        tokio::spawn(async move {
            let mut last_ok = Instant::now();
            let mut ttl = ttl;
            loop {
                // clientv3 renews every TTL/3.
                tokio::time::sleep(Duration::from_millis((ttl as u64 * 1000 / 3).max(500))).await;
                let alive = async {
                    keeper.keep_alive().await.ok()?;
                    stream.message().await.ok().flatten()
                };
                let left = Duration::from_secs(ttl as u64).saturating_sub(last_ok.elapsed());
                match tokio::time::timeout(left, alive).await {
                    Ok(Some(r)) if r.ttl() <= 0 => break,
                    Ok(Some(r)) => {
                        last_ok = Instant::now();
                        ttl = r.ttl();
                    }
                    _ => {
                        if last_ok.elapsed() >= Duration::from_secs(ttl as u64) {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        match l.keep_alive(id).await {
                            Ok((k, s)) => {
                                (keeper, stream) = (k, s);
                                last_ok = Instant::now();
                            }
                            Err(etcd_client::Error::LeaseKeepAliveError(_)) => break,
                            Err(_) => {}
                        }
                    }
                }
            }
            let _ = tx.send(true);
        });
        Ok(Session { lease: id, done })
    }

    /// Resolves when the session's lease is no longer kept alive.
    pub async fn done(&mut self) {
        let _ = self.done.wait_for(|d| *d).await;
    }
}

/// Runs `f` unless `cancel` fires first (a cancelled context).
async fn or_cancel<T>(
    cancel: &mut watch::Receiver<bool>,
    f: impl std::future::Future<Output = R<T>>,
) -> R<T> {
    tokio::select! {
        r = f => r,
        _ = cancel.wait_for(|c| *c) => Err(CANCELED.to_string()),
    }
}

/// `WithFirstCreate()` / `WithLastCreate()`: the prefix, by create
/// revision, one key.
fn top(order: SortOrder) -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, order)
        .with_limit(1)
}

fn range_of(r: &PbTxnOpResponse) -> Option<&PbRangeResponse> {
    match r {
        PbTxnOpResponse::ResponseRange(g) => Some(g),
        _ => None,
    }
}

fn txn_range(r: &etcd_client::TxnResponse, i: usize) -> PbRangeResponse {
    r.0.responses
        .get(i)
        .and_then(|o| o.response.as_ref())
        .and_then(range_of)
        .cloned()
        .unwrap_or_default()
}

/// `waitDelete`: until `key` is deleted (watching from `rev`).
async fn wait_delete(c: &Conn, key: &[u8], rev: i64) -> R<()> {
    let mut w = c.client.watch_client();
    let mut s = w
        .watch(
            key.to_vec(),
            Some(WatchOptions::new().with_start_revision(rev)),
        )
        .await
        .map_err(rpc)?;
    loop {
        match s.message().await {
            Ok(Some(r)) => {
                let r = r.0;
                if r.events.iter().any(|e| e.r#type == 1) {
                    return Ok(());
                }
                if r.canceled {
                    return Err(if r.compact_revision != 0 {
                        "etcdserver: mvcc: required revision has been compacted".to_string()
                    } else {
                        r.cancel_reason
                    });
                }
            }
            Ok(None) => return Err("lost watcher waiting for delete".into()),
            Err(e) => return Err(rpc(e)),
        }
    }
}

/// `waitDeletes`: until every key under `pfx` created at or before
/// `max_rev` is gone.
async fn wait_deletes(c: &Conn, pfx: &[u8], max_rev: i64) -> R<PbResponseHeader> {
    let mut kv = c.client.kv_client();
    loop {
        let o = top(SortOrder::Descend).with_max_create_revision(max_rev);
        let r = kv.get(pfx, Some(o)).await.map_err(rpc)?.0;
        let Some(last) = r.kvs.first() else {
            return Ok(r.header.unwrap_or_default());
        };
        let rev = r.header.as_ref().map(|h| h.revision).unwrap_or(0);
        wait_delete(c, &last.key, rev).await?;
    }
}

/// The prefix `name/` and the session's key under it (`name/<lease>`).
fn session_key(name: &str, s: &Session) -> (Vec<u8>, Vec<u8>) {
    let pfx = crate::raw::vec(&format!("{name}/"));
    let key = [&pfx[..], format!("{:x}", s.lease).as_bytes()].concat();
    (pfx, key)
}

/// The compare "`key` was created at `rev`" (0: `key` does not exist).
fn created_at(key: Vec<u8>, rev: i64) -> Compare {
    Compare::create_revision(key, CompareOp::Equal, rev)
}

/// A put of `key` attached to the session's lease.
fn put_leased(key: Vec<u8>, val: &str, s: &Session) -> TxnOp {
    let val = crate::raw::vec(val);
    TxnOp::put(key, val, Some(PutOptions::new().with_lease(s.lease)))
}

/// `concurrency.Mutex` on `name/`.
struct Mutex {
    pfx: Vec<u8>,
    key: Vec<u8>,
    hdr: PbResponseHeader,
}

impl Mutex {
    /// `Lock`: put our key, then wait for every older key to go.
    async fn lock(
        c: &Conn,
        s: &Session,
        name: &str,
        cancel: &mut watch::Receiver<bool>,
    ) -> R<Mutex> {
        let (pfx, key) = session_key(name, s);
        let txn = Txn::new()
            .when(vec![created_at(key.clone(), 0)])
            .and_then(vec![
                put_leased(key.clone(), "", s),
                TxnOp::get(pfx.clone(), Some(top(SortOrder::Ascend))),
            ])
            .or_else(vec![
                TxnOp::get(key.clone(), None),
                TxnOp::get(pfx.clone(), Some(top(SortOrder::Ascend))),
            ]);
        let mut kv = c.client.kv_client();
        let r = or_cancel(cancel, async { kv.txn(txn).await.map_err(rpc) }).await?;
        let mut my_rev = r.0.header.as_ref().map(|h| h.revision).unwrap_or(0);
        if !r.0.succeeded {
            my_rev = txn_range(&r, 0)
                .kvs
                .first()
                .map(|k| k.create_revision)
                .unwrap_or(0);
        }
        let mut m = Mutex {
            pfx,
            key,
            hdr: r.0.header.unwrap_or_default(),
        };
        let owner = txn_range(&r, 1);
        if owner
            .kvs
            .first()
            .is_none_or(|k| k.create_revision == my_rev)
        {
            return Ok(m);
        }
        let waited = or_cancel(cancel, async {
            wait_deletes(c, &m.pfx, my_rev - 1).await?;
            kv.get(m.key.clone(), None).await.map_err(rpc)
        })
        .await;
        match waited {
            Err(e) => {
                let _ = m.unlock(c).await;
                Err(e)
            }
            Ok(g) if g.0.kvs.is_empty() => Err("mutex: session is expired".into()),
            Ok(g) => {
                m.hdr = g.0.header.unwrap_or_default();
                Ok(m)
            }
        }
    }

    async fn unlock(&self, c: &Conn) -> R<()> {
        let mut kv = c.client.kv_client();
        kv.delete(self.key.clone(), None).await.map_err(rpc)?;
        Ok(())
    }
}

/// Cancels `tx` on SIGINT/SIGTERM (etcdctl's signal goroutine).
fn cancel_on_signal(mut sig: Signals) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        sig.recv().await;
        let _ = tx.send(true);
    });
    rx
}

pub async fn lock(ctx: &mut Ctx) -> Result<(), Exit> {
    if ctx.p.args.is_empty() {
        return Err(Exit::new(
            EXIT_BAD_ARGS,
            "lock takes a lock name argument and an optional command to execute",
        ));
    }
    let (c, pr) = ctx.client_no_deadline().await?;
    let name = ctx.p.args[0].clone();
    let exec: Vec<String> = ctx.p.args[1..].to_vec();
    let err = |e: String| Exit::new(EXIT_ERROR, e);
    let mut s = Session::new(&c, ctx.p.i64("ttl")).await.map_err(err)?;
    let mut cancel = cancel_on_signal(Signals::new()?);
    let m = Mutex::lock(&c, &s, &name, &mut cancel).await.map_err(err)?;
    if !exec.is_empty() {
        use std::os::unix::ffi::OsStringExt as _;
        let os = |s: &str| std::ffi::OsString::from_vec(crate::raw::vec(s));
        let mut cmd = std::process::Command::new(os(&exec[0]));
        cmd.args(exec[1..].iter().map(|a| os(a)));
        // Go's exec keeps the last of duplicate variables: the inherited
        // environment wins over the two it prepends.
        for (k, v) in [
            ("ETCD_LOCK_KEY", std::ffi::OsString::from_vec(m.key.clone())),
            ("ETCD_LOCK_REV", m.hdr.revision.to_string().into()),
        ] {
            if std::env::var_os(k).is_none() {
                cmd.env(k, v);
            }
        }
        let prog = exec[0].clone();
        let status = tokio::task::spawn_blocking(move || cmd.status())
            .await
            .map_err(|e| err(e.to_string()))?;
        let unlocked = m.unlock(&c).await;
        return match status {
            Ok(st) if st.success() => unlocked.map_err(err),
            Ok(st) => Err(exit_status_error(&st)),
            Err(e) => Err(err(spawn_error(&prog, &e))),
        };
    }
    let mut kv = c.client.kv_client();
    let got = or_cancel(&mut cancel, async {
        kv.get(m.key.clone(), None).await.map_err(rpc)
    })
    .await
    .map_err(err)?;
    if got.0.kvs.is_empty() {
        return Err(err("lock lost on init".into()));
    }
    pr.get(&got.0)?;
    tokio::select! {
        _ = cancel.wait_for(|c| *c) => m.unlock(&c).await.map_err(err),
        _ = s.done() => Err(err("session expired".into())),
    }
}

/// etcdctl's exit for a command that failed: `exec.ExitError`'s text and
/// its exit status (-1, i.e. 255, when a signal ended it).
pub fn exit_status_error(st: &std::process::ExitStatus) -> Exit {
    use std::os::unix::process::ExitStatusExt as _;
    match (st.code(), st.signal()) {
        (Some(n), _) => Exit::new(n, format!("exit status {n}")),
        (None, Some(sig)) => Exit::new(255, format!("signal: {}", signal_name(sig))),
        _ => Exit::new(EXIT_ERROR, "exit status -1"),
    }
}

/// Go's `syscall.Signal.String()` for the common signals.
fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGHUP => "hangup".into(),
        libc::SIGINT => "interrupt".into(),
        libc::SIGQUIT => "quit".into(),
        libc::SIGABRT => "aborted".into(),
        libc::SIGKILL => "killed".into(),
        libc::SIGSEGV => "segmentation fault".into(),
        libc::SIGPIPE => "broken pipe".into(),
        libc::SIGALRM => "alarm clock".into(),
        libc::SIGTERM => "terminated".into(),
        libc::SIGUSR1 => "user defined signal 1".into(),
        libc::SIGUSR2 => "user defined signal 2".into(),
        n => format!("signal {n}"),
    }
}

/// What Go's `exec.Command(prog).Run()` says when it cannot start `prog`.
pub fn spawn_error(prog: &str, e: &std::io::Error) -> String {
    if !prog.contains('/') && e.kind() == std::io::ErrorKind::NotFound {
        format!(
            "exec: {}: executable file not found in $PATH",
            crate::gofmt::quote(prog)
        )
    } else {
        format!("fork/exec {prog}: {}", crate::client::errno_text(e))
    }
}

pub async fn elect(ctx: &mut Ctx) -> Result<(), Exit> {
    let n = ctx.p.args.len();
    if n != 1 && n != 2 {
        return Err(Exit::new(
            EXIT_BAD_ARGS,
            "elect takes one election name argument and an optional proposal argument",
        ));
    }
    let (c, pr) = ctx.client_no_deadline().await?;
    let listen = ctx.p.bool("listen");
    if n == 1 && !listen {
        return Err(Exit::new(
            EXIT_BAD_ARGS,
            "no proposal argument but -l not set",
        ));
    }
    if n == 2 && listen {
        return Err(Exit::new(EXIT_BAD_ARGS, "proposal given but -l is set"));
    }
    let name = ctx.p.args[0].clone();
    let err = |e: String| Exit::new(EXIT_ERROR, e);
    let mut s = Session::new(&c, 60).await.map_err(err)?;
    let mut cancel = cancel_on_signal(Signals::new()?);
    if n == 1 {
        tokio::select! {
            _ = observe(&c, &name, &pr) => Err(err("elect: observer lost".into())),
            _ = cancel.wait_for(|c| *c) => Ok(()),
        }
    } else {
        let e = campaign(&c, &s, &name, &ctx.p.args[1], &mut cancel)
            .await
            .map_err(err)?;
        let mut kv = c.client.kv_client();
        let got = or_cancel(&mut cancel, async {
            kv.get(e.key.clone(), None).await.map_err(rpc)
        })
        .await
        .map_err(err)?;
        pr.get(&got.0)?;
        tokio::select! {
            _ = cancel.wait_for(|c| *c) => {}
            _ = s.done() => return Err(err("elect: session expired".into())),
        }
        e.resign(&c).await.map_err(err)
    }
}

/// An election this client leads (or campaigns in).
struct Leader {
    key: Vec<u8>,
    rev: i64,
}

impl Leader {
    /// `Resign`: delete our key if it is still the one we created.
    async fn resign(&self, c: &Conn) -> R<()> {
        let t = Txn::new()
            .when(vec![created_at(self.key.clone(), self.rev)])
            .and_then(vec![TxnOp::delete(self.key.clone(), None)]);
        c.client.kv_client().txn(t).await.map_err(rpc)?;
        Ok(())
    }
}

/// `Election.Campaign`: our key under `name/`, elected once every older
/// key is gone.
async fn campaign(
    c: &Conn,
    s: &Session,
    name: &str,
    val: &str,
    cancel: &mut watch::Receiver<bool>,
) -> R<Leader> {
    let (pfx, key) = session_key(name, s);
    let mut kv = c.client.kv_client();
    let t = Txn::new()
        .when(vec![created_at(key.clone(), 0)])
        .and_then(vec![put_leased(key.clone(), val, s)])
        .or_else(vec![TxnOp::get(key.clone(), None)]);
    let r = or_cancel(cancel, async { kv.txn(t).await.map_err(rpc) }).await?;
    let mut l = Leader {
        key: key.clone(),
        rev: r.0.header.as_ref().map(|h| h.revision).unwrap_or(0),
    };
    if !r.0.succeeded {
        let kvs = txn_range(&r, 0).kvs;
        let cur = kvs.first().cloned().unwrap_or_default();
        l.rev = cur.create_revision;
        if cur.value != *crate::raw::bytes(val) {
            // Proclaim.
            let t = Txn::new()
                .when(vec![created_at(key.clone(), l.rev)])
                .and_then(vec![put_leased(key.clone(), val, s)]);
            let p = or_cancel(cancel, async { kv.txn(t).await.map_err(rpc) }).await;
            let failed = match p {
                Ok(p) if p.0.succeeded => None,
                Ok(_) => Some("election: not leader".to_string()),
                Err(e) => Some(e),
            };
            if let Some(e) = failed {
                let _ = l.resign(c).await;
                return Err(e);
            }
        }
    }
    match or_cancel(cancel, wait_deletes(c, &pfx, l.rev - 1)).await {
        Ok(_) => Ok(l),
        Err(e) => {
            if *cancel.borrow() {
                let _ = l.resign(c).await;
            }
            Err(e)
        }
    }
}

/// `Election.Observe`, printing each leader proposal; returns when the
/// observation is disrupted.
async fn observe(c: &Conn, name: &str, pr: &Printer) {
    let pfx = crate::raw::vec(&format!("{name}/"));
    let mut kv = c.client.kv_client();
    let mut w = c.client.watch_client();
    loop {
        let Ok(resp) = kv.get(pfx.clone(), Some(top(SortOrder::Ascend))).await else {
            return;
        };
        let mut resp = resp.0;
        let (hdr, leader): (PbResponseHeader, PbKeyValue) = match resp.kvs.first() {
            Some(k) => (resp.header.unwrap_or_default(), k.clone()),
            None => {
                // Wait for the first key put on the prefix.
                let rev = resp.header.as_ref().map(|h| h.revision).unwrap_or(0);
                let o = WatchOptions::new().with_prefix().with_start_revision(rev);
                let Ok(mut s) = w.watch(pfx.clone(), Some(o)).await else {
                    return;
                };
                let mut found = None;
                while found.is_none() {
                    let Ok(Some(r)) = s.message().await else {
                        return;
                    };
                    let r = r.0;
                    if r.canceled {
                        return;
                    }
                    if let Some(ev) = r.events.iter().find(|e| e.r#type == 0) {
                        let kv = ev.kv.clone().unwrap_or_default();
                        let mut h = r.header.unwrap_or_default();
                        h.revision = kv.mod_revision;
                        found = Some((h, kv));
                    }
                }
                found.expect("found")
            }
        };
        let first = PbRangeResponse {
            header: Some(hdr),
            kvs: vec![leader.clone()],
            ..Default::default()
        };
        if pr.get(&first).is_err() {
            return;
        }
        let o = WatchOptions::new().with_start_revision(hdr.revision + 1);
        let Ok(mut s) = w.watch(leader.key.clone(), Some(o)).await else {
            return;
        };
        'key: loop {
            let Ok(Some(r)) = s.message().await else {
                return;
            };
            let r = r.0;
            for ev in &r.events {
                if ev.r#type == 1 {
                    break 'key;
                }
                resp.header = r.header;
                resp.kvs = vec![ev.kv.clone().unwrap_or_default()];
                if pr.get(&resp).is_err() {
                    return;
                }
            }
            if r.canceled {
                return;
            }
        }
    }
}
