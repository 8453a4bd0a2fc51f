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

pub async fn grant(ctx: &mut Ctx) -> Result<(), Exit> {
    if ctx.p.args.len() != 1 {
        return Err(Exit::new(
            EXIT_BAD_ARGS,
            "lease grant command needs TTL argument",
        ));
    }
    let ttl = gofmt::parse_int(&ctx.p.args[0], 10, 64)
        .map_err(|e| Exit::new(EXIT_BAD_ARGS, format!("bad TTL ({e})")))?;
    let (c, pr) = ctx.client().await?;
    let mut l = c.client.lease_client();
    let r = c
        .unary(ctx.deadline(), l.grant(ttl, None))
        .await
        .map_err(|e| Exit::new(EXIT_ERROR, format!("failed to grant lease ({e})")))?;
    pr.grant(&r.0)
}

pub async fn revoke(ctx: &mut Ctx) -> Result<(), Exit> {
    if ctx.p.args.len() != 1 {
        return Err(Exit::new(
            EXIT_BAD_ARGS,
            "lease revoke command needs 1 argument",
        ));
    }
    let id = lease_id(&ctx.p.args[0])?;
    let (c, pr) = ctx.client().await?;
    let mut l = c.client.lease_client();
    let r = c
        .unary(ctx.deadline(), l.revoke(id))
        .await
        .map_err(|e| Exit::new(EXIT_ERROR, format!("failed to revoke lease ({e})")))?;
    pr.revoke(id, &r.0)
}

pub async fn timetolive(ctx: &mut Ctx) -> Result<(), Exit> {
    if ctx.p.args.len() != 1 {
        return Err(Exit::new(
            EXIT_BAD_ARGS,
            "lease timetolive command needs lease ID as argument",
        ));
    }
    let keys = ctx.p.bool("keys");
    let id = lease_id(&ctx.p.args[0])?;
    let (c, pr) = ctx.client_no_deadline().await?;
    let mut l = c.client.lease_client();
    let mut o = LeaseTimeToLiveOptions::new();
    if keys {
        o = o.with_keys();
    }
    let r = c
        .unary(None, l.time_to_live(id, Some(o)))
        .await
        .map_err(|e| Exit::new(EXIT_BAD_CONNECTION, e.message()))?;
    pr.time_to_live(&r.0, keys)
}

pub async fn list(ctx: &mut Ctx) -> Result<(), Exit> {
    let (c, pr) = ctx.client_no_deadline().await?;
    let mut l = c.client.lease_client();
    let r = c
        .unary(None, l.leases())
        .await
        .map_err(|e| Exit::new(EXIT_BAD_CONNECTION, e.message()))?;
    pr.leases(&r.0)
}

pub async fn keep_alive(ctx: &mut Ctx) -> Result<(), Exit> {
    if ctx.p.args.len() != 1 {
        return Err(Exit::new(
            EXIT_BAD_ARGS,
            "lease keep-alive command needs lease ID as argument",
        ));
    }
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
