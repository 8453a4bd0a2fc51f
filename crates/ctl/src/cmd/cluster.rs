//! member add/remove/update/list/promote, endpoint health/status/hashkv,
//! move-leader.

use std::time::Instant;

use etcd_client::{GetOptions, MemberAddOptions};

use crate::client::{self, Conn, Exit, EXIT_BAD_ARGS, EXIT_ERROR};
use crate::gofmt;
use crate::printer::{out, EpHealth, Format, Printer};
use crate::Ctx;

fn member_id(arg: Option<&String>) -> Result<u64, Exit> {
    let arg = arg.ok_or_else(|| Exit::new(EXIT_BAD_ARGS, "member ID is not provided"))?;
    gofmt::parse_uint(arg, 16, 64).map_err(|e| {
        Exit::new(
            EXIT_BAD_ARGS,
            format!("bad member ID arg ({e}), expecting ID in Hex"),
        )
    })
}

fn cluster_id(h: &Option<etcd_client::proto::PbResponseHeader>) -> u64 {
    h.as_ref().map(|h| h.cluster_id).unwrap_or(0)
}

/// Runs one cluster RPC (`cl` is the cluster client in `call`) with the
/// command's deadline: `(conn, printer, response)`.
macro_rules! cluster_rpc {
    ($ctx:expr, |$cl:ident| $call:expr) => {{
        let (c, pr) = $ctx.client().await?;
        let mut $cl = c.client.cluster_client();
        let r = c
            .unary($ctx.deadline(), $call)
            .await
            .map_err(|e| Exit::new(EXIT_ERROR, e.message()))?;
        (c, pr, r.0)
    }};
}

/// The one member ID argument of remove, update and promote.
fn the_member_id(ctx: &Ctx) -> Result<u64, Exit> {
    if ctx.p.args.len() != 1 {
        return Err(Exit::new(EXIT_BAD_ARGS, "member ID is not provided"));
    }
    member_id(ctx.p.args.first())
}

/// `--peer-urls` as given and split at commas.
fn peer_urls(ctx: &Ctx) -> Result<(String, Vec<String>), Exit> {
    let peers = ctx.p.get("peer-urls").to_string();
    if peers.is_empty() {
        return Err(Exit::new(EXIT_BAD_ARGS, "member peer urls not provided"));
    }
    let urls = peers.split(',').map(|s| s.to_string()).collect();
    Ok((peers, urls))
}

/// Member remove/update/promote: `Member <id> <what> cluster <cid>`.
fn id_changed<M: prost::Message>(
    pr: &Printer,
    m: &M,
    header: &Option<etcd_client::proto::PbResponseHeader>,
    members: &[etcd_client::proto::PbMember],
    id: u64,
    what: &str,
) -> Result<(), Exit> {
    let simple = format!(
        "Member {:>16x} {what} cluster {:>16x}",
        id,
        cluster_id(header)
    );
    pr.member_change(m, simple, header, None, members)
}

pub async fn member_add(ctx: &mut Ctx) -> Result<(), Exit> {
    let args = ctx.p.args.clone();
    if args.is_empty() {
        return Err(Exit::new(EXIT_BAD_ARGS, "member name not provided"));
    }
    if args.len() > 1 {
        let mut ev = "too many arguments".to_string();
        for s in &args {
            if s.to_lowercase().starts_with("http") {
                ev.push_str(&format!(", did you mean --peer-urls={s}"));
            }
        }
        return Err(Exit::new(EXIT_BAD_ARGS, ev));
    }
    let name = args[0].clone();
    let (peers, urls) = peer_urls(ctx)?;
    let mut o = MemberAddOptions::new();
    if ctx.p.bool("learner") {
        o = o.with_is_learner();
    }
    let (_c, pr, r) = cluster_rpc!(ctx, |cl| cl.member_add(urls, Some(o)));
    let new_id = r.member.as_ref().map(|m| m.id).unwrap_or(0);
    pr.member_change(
        &r,
        format!(
            "Member {:>16x} added to cluster {:>16x}",
            new_id,
            cluster_id(&r.header)
        ),
        &r.header,
        r.member.as_ref(),
        &r.members,
    )?;
    if pr.fmt == Format::Simple {
        let mut conf = Vec::new();
        for m in &r.members {
            for u in &m.peer_ur_ls {
                let n = if m.id == new_id { &name } else { &m.name };
                conf.push(format!("{n}={u}"));
            }
        }
        out(&format!(
            "\nETCD_NAME={}\nETCD_INITIAL_CLUSTER={}\nETCD_INITIAL_ADVERTISE_PEER_URLS={}\nETCD_INITIAL_CLUSTER_STATE=\"existing\"\n",
            gofmt::quote(&name),
            gofmt::quote(&conf.join(",")),
            gofmt::quote(&peers)
        ));
    }
    Ok(())
}

pub async fn member_remove(ctx: &mut Ctx) -> Result<(), Exit> {
    let id = the_member_id(ctx)?;
    let (_c, pr, r) = cluster_rpc!(ctx, |cl| cl.member_remove(id));
    id_changed(&pr, &r, &r.header, &r.members, id, "removed from")
}

pub async fn member_update(ctx: &mut Ctx) -> Result<(), Exit> {
    let id = the_member_id(ctx)?;
    let (_, urls) = peer_urls(ctx)?;
    let (_c, pr, r) = cluster_rpc!(ctx, |cl| cl.member_update(id, urls));
    id_changed(&pr, &r, &r.header, &r.members, id, "updated in")
}

pub async fn member_promote(ctx: &mut Ctx) -> Result<(), Exit> {
    let id = the_member_id(ctx)?;
    let (_c, pr, r) = cluster_rpc!(ctx, |cl| cl.member_promote(id));
    id_changed(&pr, &r, &r.header, &r.members, id, "promoted in")
}

pub async fn member_list(ctx: &mut Ctx) -> Result<(), Exit> {
    let (_c, pr, r) = cluster_rpc!(ctx, |cl| cl.member_list());
    pr.member_list(&r)
}

/// `endpointsFromCluster`: `--endpoints`, or with `--cluster` every
/// member's client URLs (member list without auth).
async fn endpoints(ctx: &mut Ctx) -> Result<Vec<String>, Exit> {
    let conf = ctx.conn_conf(false)?;
    if !ctx.p.bool("cluster") {
        return Ok(conf.endpoints);
    }
    member_client_urls(ctx, &conf).await
}

/// Every member's client URLs (`--cluster`), from a member list on `conf`.
pub async fn member_client_urls(ctx: &Ctx, conf: &client::ConnConf) -> Result<Vec<String>, Exit> {
    let c = client::connect(conf, ctx.deadline())
        .await
        .map_err(|e| Exit::new(EXIT_ERROR, e.msg))?;
    let mut cl = c.client.cluster_client();
    let r = c
        .unary(ctx.deadline(), cl.member_list())
        .await
        .map_err(|e| {
            Exit::new(
                EXIT_ERROR,
                format!("failed to fetch endpoints from etcd cluster member list: {e}"),
            )
        })?;
    Ok(r.0
        .members
        .iter()
        .flat_map(|m| m.client_ur_ls.iter().cloned())
        .collect())
}

/// A client to one endpoint, with the global settings.
async fn one(ctx: &mut Ctx, ep: &str, auth: bool) -> Result<Conn, Exit> {
    let mut conf = ctx.conn_conf(auth)?;
    conf.endpoints = vec![ep.to_string()];
    client::connect(&conf, ctx.deadline()).await
}

/// One maintenance RPC (`m` is the maintenance client in `call`) per
/// endpoint, in turn; `then` gets each endpoint with the answer or the
/// error message.
macro_rules! each_endpoint {
    ($ctx:expr, $eps:expr, |$m:ident| $call:expr, |$ep:ident, $r:ident| $then:expr) => {
        for $ep in $eps {
            let $r = match one($ctx, &$ep, true).await {
                Ok(c) => {
                    let mut $m = c.client.maintenance_client();
                    c.unary($ctx.deadline(), $call)
                        .await
                        .map(|a| a.0)
                        .map_err(|e| e.message())
                }
                Err(e) => Err(e.msg),
            };
            $then
        }
    };
}

pub async fn ep_health(ctx: &mut Ctx) -> Result<(), Exit> {
    let pr = ctx.printer()?;
    // Checks the TLS/auth settings before any dial, as newClientCfg does.
    ctx.conn_conf(true)?;
    let eps = endpoints(ctx).await?;
    let mut tasks = Vec::new();
    for ep in eps {
        let mut conf = ctx.conn_conf(true)?;
        conf.endpoints = vec![ep.clone()];
        let deadline = ctx.deadline();
        tasks.push(tokio::spawn(async move {
            let st = Instant::now();
            let c = match client::connect(&conf, deadline).await {
                Ok(c) => c,
                Err(e) => {
                    return EpHealth {
                        ep,
                        health: false,
                        took: gofmt::format_duration(st.elapsed().as_nanos() as i64),
                        error: e.msg,
                    }
                }
            };
            let mut kv = c.client.kv_client();
            let r = c
                .unary(deadline, kv.get("health", None::<GetOptions>))
                .await;
            let mut h = EpHealth {
                ep,
                health: false,
                took: gofmt::format_duration(st.elapsed().as_nanos() as i64),
                error: String::new(),
            };
            match r {
                Ok(_) => h.health = true,
                Err(e) if e.desc == "etcdserver: permission denied" => h.health = true,
                Err(e) => h.error = e.message(),
            }
            if h.health {
                let mut m = c.client.maintenance_client();
                match c
                    .unary(
                        deadline,
                        m.alarm(
                            etcd_client::AlarmAction::Get,
                            etcd_client::AlarmType::None,
                            None,
                        ),
                    )
                    .await
                {
                    Ok(a) if !a.0.alarms.is_empty() => {
                        h.health = false;
                        h.error = "Active Alarm(s): ".into();
                        for a in &a.0.alarms {
                            h.error.push_str(match a.alarm {
                                1 => "NOSPACE ",
                                2 => "CORRUPT ",
                                _ => "UNKNOWN ",
                            });
                        }
                    }
                    Ok(_) => {}
                    Err(_) => {
                        h.health = false;
                        h.error = "Unable to fetch the alarm list".into();
                    }
                }
            }
            h
        }));
    }
    let mut list = Vec::new();
    for t in tasks {
        if let Ok(h) = t.await {
            list.push(h);
        }
    }
    let errs = list.iter().any(|h| !h.error.is_empty());
    pr.endpoint_health(&list)?;
    if errs {
        return Err(Exit::new(EXIT_ERROR, "unhealthy cluster"));
    }
    Ok(())
}

pub async fn ep_status(ctx: &mut Ctx) -> Result<(), Exit> {
    let conf = ctx.conn_conf(true)?;
    let pr = ctx.printer()?;
    let _ = conf;
    let eps = endpoints(ctx).await?;
    let mut list = Vec::new();
    let mut failed = false;
    each_endpoint!(ctx, eps, |m| m.status(), |ep, r| match r {
        Ok(s) => list.push((ep, s)),
        Err(e) => {
            failed = true;
            eprintln!("Failed to get the status of endpoint {ep} ({e})");
        }
    });
    pr.endpoint_status(&list)?;
    if failed {
        return Err(Exit::silent(EXIT_ERROR));
    }
    Ok(())
}

pub async fn ep_hashkv(ctx: &mut Ctx) -> Result<(), Exit> {
    ctx.conn_conf(true)?;
    let pr = ctx.printer()?;
    let rev = ctx.p.i64("rev");
    let eps = endpoints(ctx).await?;
    let mut list = Vec::new();
    let mut last_err = None;
    each_endpoint!(ctx, eps, |m| m.hash_kv(rev), |ep, r| match r {
        Ok(s) => list.push((ep, s)),
        Err(e) => {
            eprintln!("Failed to get the hash of endpoint {ep} ({e})");
            last_err = Some(e);
        }
    });
    pr.endpoint_hashkv(&list)?;
    if let Some(e) = last_err {
        return Err(Exit::new(EXIT_ERROR, e));
    }
    Ok(())
}

pub async fn move_leader(ctx: &mut Ctx) -> Result<(), Exit> {
    if ctx.p.args.len() != 1 {
        return Err(Exit::new(
            EXIT_BAD_ARGS,
            "move-leader command needs 1 argument",
        ));
    }
    let target =
        gofmt::parse_uint(&ctx.p.args[0], 16, 64).map_err(|e| Exit::new(EXIT_BAD_ARGS, e))?;
    let conf = ctx.conn_conf(true)?;
    let pr = ctx.printer()?;
    let deadline = ctx.deadline();
    let mut leader = None;
    for ep in &conf.endpoints {
        let c = one(ctx, ep, true).await?;
        let mut m = c.client.maintenance_client();
        let s = c
            .unary(deadline, m.status())
            .await
            .map_err(|e| Exit::new(EXIT_ERROR, e.message()))?;
        let mid = s.0.header.as_ref().map(|h| h.member_id).unwrap_or(0);
        if mid == s.0.leader {
            leader = Some((c, s.0.leader));
            break;
        }
    }
    let Some((c, leader_id)) = leader else {
        return Err(Exit::new(
            EXIT_BAD_ARGS,
            format!("no leader endpoint given at [{}]", conf.endpoints.join(" ")),
        ));
    };
    let mut m = c.client.maintenance_client();
    let r = c
        .unary(deadline, m.move_leader(target))
        .await
        .map_err(|e| Exit::new(EXIT_ERROR, e.message()))?;
    match pr.fmt {
        Format::Simple => {
            out(&format!(
                "Leadership transferred from {leader_id:x} to {target:x}\n"
            ));
            Ok(())
        }
        Format::Fields | Format::Table => Err(Exit::new(
            crate::client::EXIT_BAD_FEATURE,
            format!("{} not supported as output format", pr.fmt.name()),
        )),
        _ => pr.header_only(&r.0, &r.0.header, "", false),
    }
}
