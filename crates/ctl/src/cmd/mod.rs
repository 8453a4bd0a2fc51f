//! The commands, dispatched by their path.

pub mod auth;
pub mod check;
pub mod cluster;
pub mod conc;
pub mod kv;
pub mod lease;
pub mod maint;
pub mod mirror;
pub mod txn;
pub mod watch;

use crate::client::{Exit, EXIT_ERROR};
use crate::Ctx;

pub async fn run(ctx: &mut Ctx) -> Result<(), Exit> {
    let path = ctx.p.path.join(" ");
    match path.as_str() {
        "version" => {
            crate::printer::out(&format!(
                "etcdctl version: {}\nAPI version: {}\n",
                crate::VERSION,
                crate::API_VERSION
            ));
            Ok(())
        }
        "get" => kv::get(ctx).await,
        "put" => kv::put(ctx).await,
        "del" => kv::del(ctx).await,
        "txn" => txn::txn(ctx).await,
        "compaction" => kv::compaction(ctx).await,
        "lease grant" => lease::grant(ctx).await,
        "lease revoke" => lease::revoke(ctx).await,
        "lease timetolive" => lease::timetolive(ctx).await,
        "lease list" => lease::list(ctx).await,
        "lease keep-alive" => lease::keep_alive(ctx).await,
        "member add" => cluster::member_add(ctx).await,
        "member remove" => cluster::member_remove(ctx).await,
        "member update" => cluster::member_update(ctx).await,
        "member list" => cluster::member_list(ctx).await,
        "member promote" => cluster::member_promote(ctx).await,
        "endpoint health" => cluster::ep_health(ctx).await,
        "endpoint status" => cluster::ep_status(ctx).await,
        "endpoint hashkv" => cluster::ep_hashkv(ctx).await,
        "move-leader" => cluster::move_leader(ctx).await,
        "alarm disarm" => maint::alarm(ctx, true).await,
        "alarm list" => maint::alarm(ctx, false).await,
        "defrag" => maint::defrag(ctx).await,
        "snapshot save" => maint::snapshot_save(ctx).await,
        "snapshot status" | "snapshot restore" => Err(Exit::new(
            EXIT_ERROR,
            format!(
                "{} is offline and not in retcdctl: use `retcdutl {}`",
                path, path
            ),
        )),
        "auth enable" => auth::auth_enable(ctx).await,
        "auth disable" => auth::auth_disable(ctx).await,
        "auth status" => auth::auth_status(ctx).await,
        p if p.starts_with("user ") => auth::user(ctx).await,
        p if p.starts_with("role ") => auth::role(ctx).await,
        "watch" => watch::watch(ctx).await,
        "lock" => conc::lock(ctx).await,
        "elect" => conc::elect(ctx).await,
        "make-mirror" => mirror::make_mirror(ctx).await,
        "check perf" => check::check_perf(ctx).await,
        "check datascale" => check::check_datascale(ctx).await,
        other => Err(Exit::new(EXIT_ERROR, format!("{other}: not implemented"))),
    }
}

/// Go's `GetPrefixRangeEnd`.
pub fn prefix_end(key: &[u8]) -> Vec<u8> {
    let mut end = key.to_vec();
    while let Some(&last) = end.last() {
        if last < 0xff {
            *end.last_mut().expect("non-empty") = last + 1;
            return end;
        }
        end.pop();
    }
    vec![0]
}
