//! lease grant, revoke, timetolive, list, keep-alive.

use std::time::Duration;

use etcd_client::LeaseTimeToLiveOptions;

use crate::client::{Exit, EXIT_BAD_ARGS, EXIT_BAD_CONNECTION, EXIT_ERROR};
use crate::gofmt;
use crate::printer::{outln, Format};
use crate::Ctx;

/// `leaseFromArgs`: a hexadecimal lease ID.
fn lease_id(arg: &str) -> Result<i64, Exit> {
    gofmt::parse_int(arg, 16, 64).map_err(|e| {
        Exit::new(
            EXIT_BAD_ARGS,
            format!("bad lease ID arg ({e}), expecting ID in Hex"),
        )
    })
}

/// The one argument the lease commands take (`msg` without it).
fn one_arg(ctx: &Ctx, msg: &str) -> Result<(), Exit> {
    if ctx.p.args.len() != 1 {
        return Err(Exit::new(EXIT_BAD_ARGS, msg));
    }
    Ok(())
}

/// Runs one lease RPC (`l` is the lease client in `call`):
/// `(conn, printer, response)`. With `deadline` the command's timeout
/// applies and a failure is `failed to <what> lease (<err>)`; without,
/// there is none and a failure exits with a bad connection.
macro_rules! lease_rpc {
    ($ctx:expr, deadline, |$l:ident| $call:expr, $what:literal) => {{
        let (c, pr) = $ctx.client().await?;
        let mut $l = c.client.lease_client();
        let r = c.unary($ctx.deadline(), $call).await.map_err(|e| {
            Exit::new(
                EXIT_ERROR,
                format!(concat!("failed to ", $what, " lease ({})"), e),
            )
        })?;
        (c, pr, r.0)
    }};
    ($ctx:expr, |$l:ident| $call:expr) => {{
        let (c, pr) = $ctx.client_no_deadline().await?;
        let mut $l = c.client.lease_client();
        let r = c
            .unary(None, $call)
            .await
            .map_err(|e| Exit::new(EXIT_BAD_CONNECTION, e.message()))?;
        (c, pr, r.0)
    }};
}

pub async fn grant(ctx: &mut Ctx) -> Result<(), Exit> {
    one_arg(ctx, "lease grant command needs TTL argument")?;
    let ttl = gofmt::parse_int(&ctx.p.args[0], 10, 64)
        .map_err(|e| Exit::new(EXIT_BAD_ARGS, format!("bad TTL ({e})")))?;
    let (_c, pr, r) = lease_rpc!(ctx, deadline, |l| l.grant(ttl, None), "grant");
    pr.grant(&r)
}

pub async fn revoke(ctx: &mut Ctx) -> Result<(), Exit> {
    one_arg(ctx, "lease revoke command needs 1 argument")?;
    let id = lease_id(&ctx.p.args[0])?;
    let (_c, pr, r) = lease_rpc!(ctx, deadline, |l| l.revoke(id), "revoke");
    pr.revoke(id, &r)
}

pub async fn timetolive(ctx: &mut Ctx) -> Result<(), Exit> {
    one_arg(ctx, "lease timetolive command needs lease ID as argument")?;
    let keys = ctx.p.bool("keys");
    // etcdctl evaluates `mustClientFromCmd(cmd).TimeToLive(…, leaseFromArgs(…))`:
    // the client's settings and the output format are checked before the ID
    ctx.conn_conf(true)?;
    ctx.printer()?;
    let id = lease_id(&ctx.p.args[0])?;
    let mut o = LeaseTimeToLiveOptions::new();
    if keys {
        o = o.with_keys();
    }
    let (_c, pr, r) = lease_rpc!(ctx, |l| l.time_to_live(id, Some(o)));
    pr.time_to_live(&r, keys)
}

pub async fn list(ctx: &mut Ctx) -> Result<(), Exit> {
    let (_c, pr, r) = lease_rpc!(ctx, |l| l.leases());
    pr.leases(&r)
}

pub async fn keep_alive(ctx: &mut Ctx) -> Result<(), Exit> {
    one_arg(ctx, "lease keep-alive command needs lease ID as argument")?;
    let id = lease_id(&ctx.p.args[0])?;
    let once = ctx.p.bool("once");
    let (c, pr) = ctx.client_no_deadline().await?;
    let mut l = c.client.lease_client();
    let not_found = || Exit::new(EXIT_BAD_CONNECTION, "etcdserver: requested lease not found");
    // etcd-client's keep_alive consumes the first answer (and fails on an
    // unknown lease); each round below sends its own request.
    let (mut keeper, mut stream) = match l.keep_alive(id).await {
        Ok(ks) => ks,
        Err(etcd_client::Error::LeaseKeepAliveError(_)) => return Err(not_found()),
        Err(e) => {
            return Err(Exit::new(
                EXIT_BAD_CONNECTION,
                crate::client::RpcError::from(e).message(),
            ))
        }
    };
    loop {
        if keeper.keep_alive().await.is_err() {
            if once {
                return Err(not_found());
            }
            break;
        }
        let r = match stream.message().await {
            Ok(Some(r)) => r,
            Ok(None) if once => return Err(not_found()),
            Err(e) if once => {
                return Err(Exit::new(
                    EXIT_BAD_CONNECTION,
                    crate::client::RpcError::from(e).message(),
                ))
            }
            _ => break,
        };
        if r.0.ttl <= 0 {
            if once {
                return Err(not_found());
            }
            break;
        }
        pr.keep_alive(&r.0)?;
        if once {
            return Ok(());
        }
        // clientv3 renews every TTL/3.
        let wait = Duration::from_millis((r.0.ttl as u64 * 1000 / 3).max(500));
        tokio::time::sleep(wait).await;
    }
    if pr.fmt == Format::Simple {
        outln(&format!("lease {id:016x} expired or revoked."));
    }
    Ok(())
}
