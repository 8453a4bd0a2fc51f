//! alarm list/disarm, defrag, snapshot save.

use std::io::Write as _;
use std::time::Instant;

use etcd_client::proto::PbAlarmResponse;
use etcd_client::{AlarmAction, AlarmOptions, AlarmType};

use crate::client::{self, log_info, Exit, EXIT_BAD_ARGS, EXIT_ERROR, EXIT_INTERRUPTED};
use crate::gofmt;
use crate::printer::outln;
use crate::Ctx;

pub async fn alarm(ctx: &mut Ctx, disarm: bool) -> Result<(), Exit> {
    if !ctx.p.args.is_empty() {
        return Err(Exit::new(
            EXIT_BAD_ARGS,
            format!(
                "alarm {} command accepts no arguments",
                if disarm { "disarm" } else { "list" }
            ),
        ));
    }
    let (c, pr) = ctx.client().await?;
    let deadline = ctx.deadline();
    let mut m = c.client.maintenance_client();
    let list = c
        .unary(deadline, m.alarm(AlarmAction::Get, AlarmType::None, None))
        .await
        .map_err(|e| Exit::new(EXIT_ERROR, e.message()))?
        .0;
    if !disarm {
        return pr.alarm(&list);
    }
    // clientv3's AlarmDisarm of "all": one deactivate per listed alarm,
    // their alarms collected into an otherwise empty response.
    let mut ret = PbAlarmResponse::default();
    for a in &list.alarms {
        let mut o = AlarmOptions::new();
        o.with_member(a.member_id);
        let at = match a.alarm {
            1 => AlarmType::Nospace,
            2 => AlarmType::Corrupt,
            _ => AlarmType::None,
        };
        let r = c
            .unary(deadline, m.alarm(AlarmAction::Deactivate, at, Some(o)))
            .await
            .map_err(|e| Exit::new(EXIT_ERROR, e.message()))?;
        ret.alarms.extend(r.0.alarms);
    }
    pr.alarm(&ret)
}

pub async fn defrag(ctx: &mut Ctx) -> Result<(), Exit> {
    if !ctx.p.get("data-dir").is_empty() {
        return Err(Exit::new(
            EXIT_ERROR,
            "--data-dir (offline defragmentation) is not in retcdctl",
        ));
    }
    let conf = ctx.conn_conf(true)?;
    ctx.printer()?;
    let eps = if ctx.p.bool("cluster") {
        super::cluster::member_client_urls(ctx, &ConnNoAuth::of(&conf)).await?
    } else {
        conf.endpoints.clone()
    };
    let mut failures = 0;
    for ep in eps {
        let mut one = conf.clone();
        one.endpoints = vec![ep.clone()];
        let deadline = ctx.deadline();
        let r = match client::connect(&one, deadline).await {
            Ok(c) => {
                let mut m = c.client.maintenance_client();
                c.unary(deadline, m.defragment())
                    .await
                    .map(|_| ())
                    .map_err(|e| e.message())
            }
            Err(e) => Err(e.msg),
        };
        match r {
            Ok(()) => outln(&format!("Finished defragmenting etcd member[{ep}]")),
            Err(e) => {
                eprintln!("Failed to defragment etcd member[{ep}] ({e})");
                failures += 1;
            }
        }
    }
    if failures != 0 {
        return Err(Exit::silent(EXIT_ERROR));
    }
    Ok(())
}

struct ConnNoAuth;

impl ConnNoAuth {
    fn of(c: &client::ConnConf) -> client::ConnConf {
        client::ConnConf {
            user: None,
            ..c.clone()
        }
    }
}

pub async fn snapshot_save(ctx: &mut Ctx) -> Result<(), Exit> {
    if ctx.p.args.len() != 1 {
        return Err(Exit::new(
            EXIT_BAD_ARGS,
            "snapshot save expects one argument",
        ));
    }
    let conf = ctx.conn_conf(true)?;
    ctx.printer()?;
    let path = ctx.p.args[0].clone();
    let intr = |m: String| Exit::new(EXIT_INTERRUPTED, m);
    if conf.endpoints.len() != 1 {
        return Err(intr(format!(
            "snapshot must be requested to one selected node, not multiple [{}]",
            conf.endpoints.join(" ")
        )));
    }
    // Without --command-timeout there is no deadline for the transfer.
    let deadline = if ctx.p.is_changed("command-timeout") {
        ctx.deadline()
    } else {
        None
    };
    let c = client::connect(&conf, deadline)
        .await
        .map_err(|e| intr(e.msg))?;
    let part = format!("{path}.part");
    let mut f = open_private(&part).map_err(|e| {
        intr(format!(
            "could not open {part} (open {part}: {})",
            client::errno_text(&e)
        ))
    })?;
    let _cleanup = RemoveOnDrop(part.clone());
    log_info(
        None,
        "snapshot/v3_snapshot.go:68",
        "created temporary db file",
        &[("path", &part)],
    );
    let started = Instant::now();
    let ep = conf.endpoints[0].clone();
    let fut = async {
        let mut m = c.client.maintenance_client();
        let mut stream = m
            .snapshot()
            .await
            .map_err(|e| client::RpcError::from(e).message())?;
        log_info(
            Some("client"),
            "v3/maintenance.go:211",
            "opened snapshot stream; downloading",
            &[],
        );
        log_info(
            None,
            "snapshot/v3_snapshot.go:76",
            "fetching snapshot",
            &[("endpoint", &ep)],
        );
        let mut size: u64 = 0;
        loop {
            match stream.message().await {
                Ok(Some(r)) => {
                    f.write_all(r.blob()).map_err(|e| e.to_string())?;
                    size += r.blob().len() as u64;
                }
                Ok(None) => break,
                Err(e) => return Err(client::RpcError::from(e).message()),
            }
        }
        log_info(
            Some("client"),
            "v3/maintenance.go:219",
            "completed snapshot read; closing",
            &[],
        );
        Ok::<u64, String>(size)
    };
    let size = match deadline {
        Some(d) => match tokio::time::timeout_at(d.into(), fut).await {
            Ok(r) => r,
            Err(_) => Err("context deadline exceeded".into()),
        },
        None => fut.await,
    }
    .map_err(intr)?;
    // A snapshot ends with a sha256 of its contents (512-byte pages + 32).
    if size % 512 != 32 {
        return Err(intr(format!("sha256 checksum not found [bytes: {size}]")));
    }
    f.sync_all().map_err(|e| intr(e.to_string()))?;
    drop(f);
    let _ = started;
    log_info(
        None,
        "snapshot/v3_snapshot.go:91",
        "fetched snapshot",
        &[
            ("endpoint", &ep),
            ("size", &gofmt::humanize_bytes(size)),
            ("took", "now"),
        ],
    );
    std::fs::rename(&part, &path).map_err(|e| {
        intr(format!(
            "could not rename {part} to {path} (rename {part} {path}: {})",
            client::errno_text(&e)
        ))
    })?;
    log_info(
        None,
        "snapshot/v3_snapshot.go:100",
        "saved",
        &[("path", &path)],
    );
    outln(&format!("Snapshot saved at {path}"));
    Ok(())
}

fn open_private(path: &str) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
}

struct RemoveOnDrop(String);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
