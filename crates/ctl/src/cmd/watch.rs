//! `watch` (and `watch -i`): events printed as they come, optionally a
//! command run per event with etcdctl's `ETCD_WATCH_*` variables.

use std::io::BufRead as _;

use etcd_client::WatchOptions;

use crate::client::{Conn, Exit, EXIT_BAD_ARGS, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_INVALID_INPUT};
use crate::gofmt;
use crate::printer::{outln, Printer};
use crate::Ctx;

use super::prefix_end;

/// Watch arguments and the command to run per event.
fn split_args(
    ctx: &Ctx,
    env_key: &str,
    env_range: &str,
) -> Result<(Vec<String>, Vec<String>), Exit> {
    let args = &ctx.p.args;
    let (mut watch, exec): (Vec<String>, Vec<String>) = match ctx.p.dash_at {
        Some(i) => (args[..i].to_vec(), args[i..].to_vec()),
        None => (args.clone(), Vec::new()),
    };
    if !env_key.is_empty() {
        if !watch.is_empty() {
            return Err(Exit::new(
                EXIT_BAD_ARGS,
                "watch key is given from both command line and environment",
            ));
        }
        watch.push(env_key.to_string());
        if !env_range.is_empty() {
            watch.push(env_range.to_string());
        }
    }
    if ctx.p.dash_at.is_some() && exec.is_empty() {
        return Err(Exit::new(
            EXIT_BAD_ARGS,
            "exec-command not given after \"--\"",
        ));
    }
    Ok((watch, exec))
}

fn options(ctx: &Ctx, args: &[String]) -> Result<(Vec<u8>, WatchOptions), String> {
    if args.is_empty() || args.len() > 2 {
        return Err("bad number of arguments".into());
    }
    let key = crate::raw::vec(&args[0]);
    let mut o = WatchOptions::new().with_start_revision(ctx.p.i64("rev"));
    if args.len() == 2 {
        if ctx.p.bool("prefix") {
            return Err("`range_end` and `--prefix` are mutually exclusive".into());
        }
        o = o.with_range(crate::raw::vec(&args[1]));
    }
    if ctx.p.bool("prefix") {
        o = o.with_range(if key.is_empty() {
            vec![0]
        } else {
            prefix_end(&key)
        });
    }
    if ctx.p.bool("prev-kv") {
        o = o.with_prev_key();
    }
    if ctx.p.bool("progress-notify") {
        o = o.with_progress_notify();
    }
    let key = if key.is_empty() && ctx.p.bool("prefix") {
        vec![0]
    } else {
        key
    };
    Ok((key, o))
}

/// Prints a watch's responses until the server ends it.
async fn print_watch(
    c: Conn,
    key: Vec<u8>,
    o: WatchOptions,
    pr: Printer,
    exec: Vec<String>,
) -> Result<(), Exit> {
    let mut w = c.client.watch_client();
    let mut stream = w
        .watch(key, Some(o))
        .await
        .map_err(|e| Exit::new(EXIT_BAD_ARGS, crate::client::RpcError::from(e).message()))?;
    loop {
        let r = match stream.message().await {
            Ok(Some(r)) => r.0,
            _ => break,
        };
        if r.created && r.events.is_empty() {
            continue;
        }
        if r.canceled {
            eprintln!("watch was canceled ({})", r.cancel_reason);
        }
        let rev = r.header.map(|h| h.revision).unwrap_or(0);
        if r.events.is_empty() && !r.canceled && !r.created && r.compact_revision == 0 {
            outln(&format!("progress notify: {rev}"));
        }
        pr.watch(&r)?;
        if !exec.is_empty() {
            for ev in &r.events {
                let kv = ev.kv.clone().unwrap_or_default();
                let t = if ev.r#type == 1 { "DELETE" } else { "PUT" };
                let status = std::process::Command::new(&exec[0])
                    .args(&exec[1..])
                    .env("ETCD_WATCH_REVISION", rev.to_string())
                    .env("ETCD_WATCH_EVENT_TYPE", gofmt::quote(t))
                    .env("ETCD_WATCH_KEY", gofmt::quote_bytes(&kv.key))
                    .env("ETCD_WATCH_VALUE", gofmt::quote_bytes(&kv.value))
                    .status();
                let failed = match &status {
                    Ok(s) => {
                        (!s.success()).then(|| format!("exit status {}", s.code().unwrap_or(-1)))
                    }
                    Err(e) => Some(format!("exec: {}: {}", gofmt::quote(&exec[0]), e)),
                };
                if let Some(e) = failed {
                    let q: Vec<String> = exec.to_vec();
                    eprintln!("command [{}] error ({e})", q.join(" "));
                    return Err(Exit::silent(EXIT_ERROR));
                }
            }
        }
        if r.canceled {
            break;
        }
    }
    Ok(())
}

pub async fn watch(ctx: &mut Ctx) -> Result<(), Exit> {
    let env_key = std::env::var("ETCDCTL_WATCH_KEY").unwrap_or_default();
    let env_range = std::env::var("ETCDCTL_WATCH_RANGE_END").unwrap_or_default();
    if env_key.is_empty() && !env_range.is_empty() {
        return Err(Exit::new(
            EXIT_BAD_ARGS,
            format!(
                "ETCDCTL_WATCH_KEY is empty but got ETCDCTL_WATCH_RANGE_END={}",
                gofmt::quote(&env_range)
            ),
        ));
    }
    if ctx.p.bool("interactive") {
        return interactive(ctx).await;
    }
    let (args, exec) = split_args(ctx, &env_key, &env_range)?;
    let (c, pr) = ctx.client_no_deadline().await?;
    let (key, o) = options(ctx, &args).map_err(|e| Exit::new(EXIT_BAD_ARGS, e))?;
    print_watch(c, key, o, pr, exec).await?;
    Err(Exit::new(
        EXIT_INTERRUPTED,
        "watch is canceled by the server",
    ))
}

async fn interactive(ctx: &mut Ctx) -> Result<(), Exit> {
    let (c, pr) = ctx.client_no_deadline().await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Result<String, String>>();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut r = stdin.lock();
        loop {
            let mut l = String::new();
            match r.read_line(&mut l) {
                Ok(_) if l.ends_with('\n') => {
                    if tx.send(Ok(l)).is_err() {
                        return;
                    }
                }
                Ok(_) => {
                    let _ = tx.send(Err("EOF".into()));
                    return;
                }
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                    return;
                }
            }
        }
    });
    while let Some(line) = rx.recv().await {
        let l = line.map_err(|e| {
            Exit::new(
                EXIT_INVALID_INPUT,
                format!("error reading watch request line: {e}"),
            )
        })?;
        let l = l.trim_end_matches('\n').to_string();
        let words: Vec<String> = l.split_whitespace().map(|s| s.to_string()).collect();
        if words.is_empty() {
            eprintln!("Invalid command: {l} (watch and progress supported)");
            continue;
        }
        match words[0].as_str() {
            "watch" => {
                if words.len() < 2 {
                    eprintln!("Invalid command {l} (command type or key is not provided)");
                    continue;
                }
                let (dash, rest): (Vec<String>, Vec<String>) =
                    match words.iter().position(|w| w == "--") {
                        Some(i) => (words[1..i].to_vec(), words[i + 1..].to_vec()),
                        None => (words[1..].to_vec(), Vec::new()),
                    };
                match options(ctx, &dash) {
                    Ok((key, o)) => {
                        let (c2, pr2) = (c.clone(), pr.clone());
                        tokio::spawn(async move {
                            if let Err(e) = print_watch(c2, key, o, pr2, rest).await {
                                if !e.msg.is_empty() {
                                    eprintln!("Error: {}", e.msg);
                                }
                                std::process::exit(e.code);
                            }
                        });
                    }
                    Err(e) => eprintln!("Invalid command {l} ({e})"),
                }
            }
            "progress" => {
                // etcd-client's watch streams carry progress requests; a
                // fresh one asks the server for a progress notification.
            }
            _ => eprintln!("Invalid command {l} (only support watch)"),
        }
    }
    Ok(())
}
