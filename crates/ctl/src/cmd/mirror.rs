//! `make-mirror`: copies a prefix (or everything) to a destination
//! cluster, then keeps applying the source's changes, printing the running
//! count of mirrored keys every 30 seconds as etcdctl does.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{GetOptions, Txn, TxnOp, WatchOptions};

use crate::client::{self, ConnConf, Exit, RpcError, EXIT_BAD_ARGS, EXIT_ERROR};
use crate::printer::outln;
use crate::Ctx;

use super::prefix_end;

/// The source's keys per range request (`mirror.batchLimit`).
const BATCH: i64 = 1000;

fn rpc(e: etcd_client::Error) -> Exit {
    Exit::new(EXIT_ERROR, RpcError::from(e).message())
}

/// `strings.Replace(key, prefix, dest, 1)` on bytes.
fn modify_prefix(key: &[u8], pfx: &[u8], dest: &[u8]) -> Vec<u8> {
    let at = if pfx.is_empty() {
        Some(0)
    } else {
        key.windows(pfx.len()).position(|w| w == pfx)
    };
    match at {
        Some(i) => [&key[..i], dest, &key[i + pfx.len()..]].concat(),
        None => key.to_vec(),
    }
}

/// `authDestCfg`: `--dest-user` / `--dest-password`.
fn dest_auth(ctx: &Ctx) -> Result<Option<(String, String)>, Exit> {
    let u = ctx.p.get("dest-user");
    if u.is_empty() {
        return Ok(None);
    }
    let pw = ctx.p.get("dest-password");
    if !pw.is_empty() {
        return Ok(Some((u.to_string(), pw.to_string())));
    }
    Ok(Some(match u.split_once(':') {
        Some((a, b)) => (a.to_string(), b.to_string()),
        None => (
            u.to_string(),
            crate::read_password("Destination Password: ")?,
        ),
    }))
}

pub async fn make_mirror(ctx: &mut Ctx) -> Result<(), Exit> {
    if ctx.p.args.len() != 1 {
        return Err(Exit::new(
            EXIT_BAD_ARGS,
            "make-mirror takes one destination argument",
        ));
    }
    ctx.apply_env()?;
    let dest_conf = ConnConf {
        endpoints: vec![ctx.p.args[0].clone()],
        dial_timeout: ctx.p.dur("dial-timeout"),
        keepalive_time: ctx.p.dur("keepalive-time"),
        keepalive_timeout: ctx.p.dur("keepalive-timeout"),
        insecure_transport: ctx.p.bool("dest-insecure-transport"),
        insecure_skip_verify: false,
        cert: ctx.p.get("dest-cert").to_string(),
        key: ctx.p.get("dest-key").to_string(),
        cacert: ctx.p.get("dest-cacert").to_string(),
        server_name: String::new(),
        user: dest_auth(ctx)?,
    };
    let dc = client::connect(&dest_conf, None).await?;
    let (c, _) = ctx.client_no_deadline().await?;
    let pfx = crate::raw::vec(ctx.p.get("prefix"));
    let no_dest = ctx.p.bool("no-dest-prefix");
    let mut dest_pfx = crate::raw::vec(ctx.p.get("dest-prefix"));
    let max_ops = ctx.p.u64("max-txn-ops") as usize;

    let total = Arc::new(AtomicI64::new(0));
    let t = total.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(30)).await;
            outln(&t.load(Ordering::SeqCst).to_string());
        }
    });

    // SyncBase: the revision to copy at, from a read of one key.
    let mut kv = c.client.kv_client();
    let probe = if pfx.is_empty() {
        b"foo".to_vec()
    } else {
        pfx.clone()
    };
    let rev = c
        .unary(None, kv.get(probe, None))
        .await
        .map_err(|e| Exit::new(EXIT_ERROR, e.message()))?
        .0
        .header
        .map(|h| h.revision)
        .unwrap_or(0);

    if no_dest && !dest_pfx.is_empty() {
        return Err(Exit::new(
            EXIT_BAD_ARGS,
            "`--dest-prefix` and `--no-dest-prefix` cannot be set at the same time, choose one",
        ));
    }
    if !no_dest && dest_pfx.is_empty() {
        dest_pfx = pfx.clone();
    }

    let mut dkv = dc.client.kv_client();
    let (mut key, end) = if pfx.is_empty() {
        (vec![0u8], vec![0u8])
    } else {
        (pfx.clone(), prefix_end(&pfx))
    };
    loop {
        let o = GetOptions::new()
            .with_range(end.clone())
            .with_limit(BATCH)
            .with_revision(rev);
        let r = kv.get(key.clone(), Some(o)).await.map_err(rpc)?.0;
        for item in &r.kvs {
            dkv.put(
                modify_prefix(&item.key, &pfx, &dest_pfx),
                item.value.clone(),
                None,
            )
            .await
            .map_err(rpc)?;
            total.fetch_add(1, Ordering::SeqCst);
        }
        if !r.more {
            break;
        }
        match r.kvs.last() {
            Some(last) => {
                key = last.key.clone();
                key.push(0);
            }
            None => break,
        }
    }

    // SyncUpdates: every change after that revision, one txn per source
    // revision (split at --max-txn-ops when set).
    let (wkey, wend) = if pfx.is_empty() {
        (vec![0u8], vec![0u8])
    } else {
        (pfx.clone(), prefix_end(&pfx))
    };
    let mut w = c.client.watch_client();
    let mut s = w
        .watch(
            wkey,
            Some(
                WatchOptions::new()
                    .with_range(wend)
                    .with_start_revision(rev + 1),
            ),
        )
        .await
        .map_err(rpc)?;
    let commit = |ops: Vec<TxnOp>| {
        let mut dkv = dc.client.kv_client();
        async move {
            dkv.txn(Txn::new().and_then(ops)).await.map_err(rpc)?;
            Ok::<(), Exit>(())
        }
    };
    loop {
        let r = match s.message().await {
            Ok(Some(r)) => r.0,
            Ok(None) => break,
            Err(e) => return Err(rpc(e)),
        };
        if r.compact_revision != 0 {
            return Err(Exit::new(
                EXIT_ERROR,
                "etcdserver: mvcc: required revision has been compacted",
            ));
        }
        let mut last_rev = 0;
        let mut ops: Vec<TxnOp> = Vec::new();
        for ev in &r.events {
            let item = ev.kv.clone().unwrap_or_default();
            if last_rev != 0 && item.mod_revision > last_rev {
                commit(std::mem::take(&mut ops)).await?;
            }
            last_rev = item.mod_revision;
            if max_ops > 0 && ops.len() == max_ops {
                commit(std::mem::take(&mut ops)).await?;
            }
            let k = modify_prefix(&item.key, &pfx, &dest_pfx);
            ops.push(if ev.r#type == 1 {
                TxnOp::delete(k, None)
            } else {
                TxnOp::put(k, item.value, None)
            });
            total.fetch_add(1, Ordering::SeqCst);
        }
        if !ops.is_empty() {
            commit(ops).await?;
        }
        if r.canceled {
            break;
        }
    }
    // etcdctl ends with ExitWithError(ExitError, nil) when the watch closes.
    Err(Exit::new(EXIT_ERROR, "<nil>"))
}

#[cfg(test)]
mod tests {
    use super::modify_prefix;

    #[test]
    fn replaces_the_first_occurrence_like_go() {
        assert_eq!(modify_prefix(b"a/k", b"a/", b"b/"), b"b/k");
        assert_eq!(modify_prefix(b"x/a/k", b"a/", b"b/"), b"x/b/k");
        assert_eq!(modify_prefix(b"k", b"", b"d/"), b"d/k");
        assert_eq!(modify_prefix(b"a/k", b"a/", b""), b"k");
    }
}
