//! get, put, del, compaction (and the op builders `txn` shares).

use std::io::Read as _;

use etcd_client::{
    CompactionOptions, DeleteOptions, GetOptions, PutOptions, SortOrder, SortTarget,
};

use crate::client::{Exit, EXIT_BAD_ARGS, EXIT_BAD_FEATURE, EXIT_ERROR};
use crate::cobra::Parsed;
use crate::gofmt;
use crate::printer::Format;
use crate::raw;
use crate::Ctx;

use super::prefix_end;

fn bad(msg: &str) -> Exit {
    Exit::new(EXIT_BAD_ARGS, msg)
}

/// `--prefix` and `--from-key` (get and del refuse both at once).
fn prefix_or_from_key(p: &Parsed) -> Result<(bool, bool), Exit> {
    let (prefix, from_key) = (p.bool("prefix"), p.bool("from-key"));
    if prefix && from_key {
        return Err(bad(
            "`--prefix` and `--from-key` cannot be set at the same time, choose one",
        ));
    }
    Ok((prefix, from_key))
}

/// The key and range end of a get or del: `args[1]`, or what `--prefix`
/// or `--from-key` make of the key (an empty key: from `\0`).
fn key_range(
    args: &[String],
    prefix: bool,
    from_key: bool,
) -> Result<(Vec<u8>, Option<Vec<u8>>), Exit> {
    let mut key = raw::vec(&args[0]);
    let mut range_end = None;
    if args.len() > 1 {
        if prefix || from_key {
            return Err(bad(
                "too many arguments, only accept one argument when `--prefix` or `--from-key` is set",
            ));
        }
        range_end = Some(raw::vec(&args[1]));
    }
    if prefix {
        if key.is_empty() {
            key = vec![0];
            range_end = Some(vec![0]);
        } else {
            range_end = Some(prefix_end(&key));
        }
    }
    if from_key {
        if key.is_empty() {
            key = vec![0];
        }
        range_end = Some(vec![0]);
    }
    Ok((key, range_end))
}

/// `getGetOp`: the key and options of a get (exits as etcdctl does).
pub fn get_op(p: &Parsed) -> Result<(Vec<u8>, GetOptions), Exit> {
    let args = &p.args;
    if args.is_empty() {
        return Err(bad(
            "get command needs one argument as key and an optional argument as range_end",
        ));
    }
    let (prefix, from_key) = prefix_or_from_key(p)?;
    if p.bool("keys-only") && p.bool("count-only") {
        return Err(bad(
            "`--keys-only` and `--count-only` cannot be set at the same time, choose one",
        ));
    }
    let mut o = GetOptions::new();
    match p.get("consistency") {
        "s" => o = o.with_serializable(),
        "l" => {}
        c => {
            return Err(Exit::new(
                EXIT_BAD_FEATURE,
                format!("unknown consistency flag {}", gofmt::quote(c)),
            ))
        }
    }
    let (key, range_end) = key_range(args, prefix, from_key)?;
    o = o.with_limit(p.i64("limit"));
    if p.i64("rev") > 0 {
        o = o.with_revision(p.i64("rev"));
    }
    let order = match p.get("order").to_uppercase().as_str() {
        "ASCEND" => SortOrder::Ascend,
        "DESCEND" => SortOrder::Descend,
        "" => SortOrder::None,
        _ => {
            return Err(Exit::new(
                EXIT_BAD_FEATURE,
                format!("bad sort order {}", p.get("order")),
            ))
        }
    };
    let target = match p.get("sort-by").to_uppercase().as_str() {
        "CREATE" => SortTarget::Create,
        "KEY" | "" => SortTarget::Key,
        "MODIFY" => SortTarget::Mod,
        "VALUE" => SortTarget::Value,
        "VERSION" => SortTarget::Version,
        _ => {
            return Err(Exit::new(
                EXIT_BAD_FEATURE,
                format!("bad sort target {}", p.get("sort-by")),
            ))
        }
    };
    o = o.with_sort(target, order);
    if let Some(end) = range_end {
        o = o.with_range(end);
    }
    if p.bool("keys-only") {
        o = o.with_keys_only();
    }
    if p.bool("count-only") {
        o = o.with_count_only();
    }
    Ok((key, o))
}

/// `args[i]`, else all of stdin (its bytes as they are), else none.
fn arg_or_stdin(args: &[String], i: usize) -> Option<Vec<u8>> {
    if i < args.len() {
        return Some(raw::vec(&args[i]));
    }
    let mut b = Vec::new();
    match std::io::stdin().read_to_end(&mut b) {
        Ok(_) if !b.is_empty() => Some(b),
        _ => None,
    }
}

/// `getPutOp`; with `stdin` false the value is not read from stdin (a
/// `txn` line: etcdctl's reader has already buffered what stdin holds).
pub fn put_op(p: &Parsed, stdin: bool) -> Result<(Vec<u8>, Vec<u8>, PutOptions), Exit> {
    let args = &p.args;
    if args.is_empty() {
        return Err(bad(
            "put command needs 1 argument and input from stdin or 2 arguments",
        ));
    }
    let key = raw::vec(&args[0]);
    let ignore_value = p.bool("ignore-value");
    if ignore_value && args.len() > 1 {
        return Err(bad(
            "put command needs only 1 argument when 'ignore-value' is set",
        ));
    }
    let mut value = Vec::new();
    if !ignore_value {
        value = (if stdin {
            arg_or_stdin(args, 1)
        } else {
            args.get(1).map(|a| raw::vec(a))
        })
        .ok_or_else(|| bad("put command needs 1 argument and input from stdin or 2 arguments"))?;
    }
    let id = gofmt::parse_int(p.get("lease"), 16, 64)
        .map_err(|e| bad(&format!("bad lease ID ({e}), expecting ID in Hex")))?;
    let mut o = PutOptions::new();
    if id != 0 {
        o = o.with_lease(id);
    }
    if p.bool("prev-kv") {
        o = o.with_prev_key();
    }
    if ignore_value {
        o = o.with_ignore_value();
    }
    if p.bool("ignore-lease") {
        o = o.with_ignore_lease();
    }
    Ok((key, value, o))
}

/// `getDelOp`.
pub fn del_op(p: &Parsed) -> Result<(Vec<u8>, DeleteOptions), Exit> {
    let args = &p.args;
    if args.is_empty() || args.len() > 2 {
        return Err(bad(
            "del command needs one argument as key and an optional argument as range_end",
        ));
    }
    let (prefix, from_key) = prefix_or_from_key(p)?;
    let mut o = DeleteOptions::new();
    let (key, range_end) = key_range(args, prefix, from_key)?;
    if p.bool("prev-kv") {
        o = o.with_prev_key();
    }
    if let Some(end) = range_end {
        o = o.with_range(end);
    }
    Ok((key, o))
}

pub async fn get(ctx: &mut Ctx) -> Result<(), Exit> {
    let (key, opts) = get_op(&ctx.p)?;
    let (c, mut pr) = ctx.client().await?;
    let mut kv = c.client.kv_client();
    let r = c
        .unary(ctx.deadline(), kv.get(key, Some(opts)))
        .await
        .map_err(|e| Exit::new(EXIT_ERROR, e.message()))?;
    if ctx.p.bool("count-only") && pr.fmt != Format::Fields {
        return Err(bad("--count-only is only for `--write-out=fields`"));
    }
    if ctx.p.bool("print-value-only") {
        if pr.fmt != Format::Simple {
            return Err(bad("print-value-only is only for `--write-out=simple`"));
        }
        pr.value_only = true;
    }
    pr.get(&r.0)
}

pub async fn put(ctx: &mut Ctx) -> Result<(), Exit> {
    let (key, value, opts) = put_op(&ctx.p, true)?;
    let (c, pr) = ctx.client().await?;
    let mut kv = c.client.kv_client();
    let r = c
        .unary(ctx.deadline(), kv.put(key, value, Some(opts)))
        .await
        .map_err(|e| Exit::new(EXIT_ERROR, e.message()))?;
    pr.put(&r.0)
}

pub async fn del(ctx: &mut Ctx) -> Result<(), Exit> {
    let (key, opts) = del_op(&ctx.p)?;
    let (c, pr) = ctx.client().await?;
    let mut kv = c.client.kv_client();
    let r = c
        .unary(ctx.deadline(), kv.delete(key, Some(opts)))
        .await
        .map_err(|e| Exit::new(EXIT_ERROR, e.message()))?;
    pr.del(&r.0)
}

pub async fn compaction(ctx: &mut Ctx) -> Result<(), Exit> {
    if ctx.p.args.len() != 1 {
        return Err(bad("compaction command needs 1 argument"));
    }
    let rev = gofmt::parse_int(&ctx.p.args[0], 10, 64).map_err(|e| Exit::new(EXIT_ERROR, e))?;
    let mut o = CompactionOptions::new();
    if ctx.p.bool("physical") {
        o = o.with_physical();
    }
    let (c, _pr) = ctx.client().await?;
    let mut kv = c.client.kv_client();
    c.unary(ctx.deadline(), kv.compact(rev, Some(o)))
        .await
        .map_err(|e| Exit::new(EXIT_ERROR, e.message()))?;
    crate::printer::outln(&format!("compacted revision {rev}"));
    Ok(())
}
