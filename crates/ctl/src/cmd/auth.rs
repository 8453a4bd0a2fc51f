//! auth enable/disable/status, user *, role *.

use etcd_client::{Permission, PermissionType, RoleRevokePermissionOptions, UserAddOptions};

use crate::client::{Conn, Exit, EXIT_BAD_ARGS, EXIT_ERROR};
use crate::json::Obj;
use crate::printer::{outln, Format, Printer};
use crate::Ctx;

use super::prefix_end;

fn err(e: crate::client::RpcError) -> Exit {
    Exit::new(EXIT_ERROR, e.message())
}

/// Runs one auth RPC (`a` is the auth client in `call`) on a connection
/// without a deadline: `(conn, printer, response)`.
macro_rules! auth_rpc {
    ($ctx:expr, |$a:ident| $call:expr) => {{
        let (c, pr) = $ctx.client_no_deadline().await?;
        let mut $a = c.client.auth_client();
        let r = c.unary(None, $call).await.map_err(err)?.0;
        (c, pr, r)
    }};
}

/// [`auth_rpc`] for an answer that prints only its header (and `simple`).
macro_rules! header_only_call {
    ($ctx:expr, |$a:ident| $call:expr, $simple:expr) => {{
        let (_c, pr, r) = auth_rpc!($ctx, |$a| $call);
        pr.header_only(&r, &r.header, $simple, true)
    }};
}

fn need_args(args: &[String], n: usize, m: &str) -> Result<(), Exit> {
    if args.len() != n {
        Err(bad(m))
    } else {
        Ok(())
    }
}

fn bad(m: &str) -> Exit {
    Exit::new(EXIT_BAD_ARGS, m)
}

pub async fn auth_enable(ctx: &mut Ctx) -> Result<(), Exit> {
    if !ctx.p.args.is_empty() {
        return Err(bad("auth enable command does not accept any arguments"));
    }
    let (c, _) = ctx.client().await?;
    let d = ctx.deadline();
    let mut a = c.client.auth_client();
    loop {
        match c.unary(d, a.auth_enable()).await {
            Ok(_) => break,
            Err(e) if e.desc == "etcdserver: root user does not have root role" => {
                c.unary(d, a.role_add("root")).await.map_err(err)?;
                c.unary(d, a.user_grant_role("root", "root"))
                    .await
                    .map_err(err)?;
            }
            Err(e) => return Err(err(e)),
        }
    }
    outln("Authentication Enabled");
    Ok(())
}

pub async fn auth_disable(ctx: &mut Ctx) -> Result<(), Exit> {
    if !ctx.p.args.is_empty() {
        return Err(bad("auth disable command does not accept any arguments"));
    }
    let (c, _) = ctx.client().await?;
    let mut a = c.client.auth_client();
    c.unary(ctx.deadline(), a.auth_disable())
        .await
        .map_err(err)?;
    outln("Authentication Disabled");
    Ok(())
}

pub async fn auth_status(ctx: &mut Ctx) -> Result<(), Exit> {
    if !ctx.p.args.is_empty() {
        return Err(bad("auth status command does not accept any arguments"));
    }
    let (c, pr) = ctx.client().await?;
    // etcd-client has no AuthStatus; the generated client on the same channel.
    let mut raw = retcd_api::etcdserverpb::auth_client::AuthClient::new(c.channel.clone());
    let req = c.request(retcd_api::etcdserverpb::AuthStatusRequest {});
    let r = c
        .unary_raw(ctx.deadline(), raw.auth_status(req))
        .await
        .map_err(err)?;
    let h = r.header.map(|h| etcd_client::proto::PbResponseHeader {
        cluster_id: h.cluster_id,
        member_id: h.member_id,
        revision: h.revision,
        raft_term: h.raft_term,
    });
    let json = Obj::new()
        .header(&h)
        .bool("enabled", r.enabled)
        .num("authRevision", r.auth_revision)
        .done();
    let simple = format!(
        "Authentication Status: {}\nAuthRevision: {}\n",
        r.enabled, r.auth_revision
    );
    match pr.fmt {
        Format::Protobuf => {
            crate::printer::pb(&r);
            Ok(())
        }
        _ => pr.with_json(
            &etcd_client::proto::PbAuthEnableResponse::default(),
            json,
            &simple,
            None,
        ),
    }
}

/// Prompts like speakeasy (etcdctl asks twice on a terminal); without a
/// terminal the line is read from stdin.
fn read_password_interactive(name: &str) -> Result<String, Exit> {
    let p1 = read_secret(&format!("Password of {name}: "))?;
    if p1.is_empty() {
        return Err(bad("empty password"));
    }
    let p2 = read_secret(&format!("Type password of {name} again for confirmation: "))?;
    if p1 != p2 {
        return Err(bad("given passwords are different"));
    }
    Ok(p1)
}

fn read_secret(prompt: &str) -> Result<String, Exit> {
    eprint!("{prompt}");
    let mut s = String::new();
    std::io::stdin()
        .read_line(&mut s)
        .map_err(|e| bad(&format!("failed to ask password: {e}")))?;
    eprintln!();
    Ok(s.trim_end_matches(['\n', '\r']).to_string())
}

/// `fmt.Scanf("%s", &password)`: the first word of stdin.
fn scan_word() -> String {
    let mut s = String::new();
    let _ = std::io::stdin().read_line(&mut s);
    s.split_whitespace().next().unwrap_or("").to_string()
}

fn role_get_simple(role: &str, perms: &[PermLike]) -> String {
    let mut s = format!("Role {role}\nKV Read:\n");
    let line = |p: &PermLike| -> String {
        if p.range_end.is_empty() {
            return format!("\t{}\n", lossy(&p.key));
        }
        let mut l = if p.range_end != [0] {
            format!("\t[{}, {})", lossy(&p.key), lossy(&p.range_end))
        } else {
            format!("\t[{}, <open ended>", lossy(&p.key))
        };
        if prefix_end(&p.key) == p.range_end {
            l.push_str(&format!(" (prefix {})", lossy(&p.key)));
        }
        l.push('\n');
        l
    };
    for p in perms {
        if p.perm_type == 0 || p.perm_type == 2 {
            s.push_str(&line(p));
        }
    }
    s.push_str("KV Write:\n");
    for p in perms {
        if p.perm_type == 1 || p.perm_type == 2 {
            s.push_str(&line(p));
        }
    }
    s
}

/// A permission (authpb.Permission's fields).
struct PermLike {
    perm_type: i32,
    key: Vec<u8>,
    range_end: Vec<u8>,
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn perm_name(t: i32) -> &'static str {
    match t {
        0 => "READ",
        1 => "WRITE",
        _ => "READWRITE",
    }
}

async fn role_get(c: &Conn, pr: &Printer, role: &str) -> Result<(), Exit> {
    let mut a = c.client.auth_client();
    let r = c.unary(None, a.role_get(role)).await.map_err(err)?.0;
    let perms: Vec<PermLike> = r
        .perm
        .iter()
        .map(|p| PermLike {
            perm_type: p.perm_type,
            key: p.key.clone(),
            range_end: p.range_end.clone(),
        })
        .collect();
    let pj: Vec<String> = perms
        .iter()
        .map(|p| {
            Obj::new()
                .num("permType", p.perm_type)
                .bytes("key", &p.key)
                .bytes("range_end", &p.range_end)
                .done()
        })
        .collect();
    let json = Obj::new().header(&r.header).arr("perm", &pj).done();
    let mut fields = crate::printer::hdr_fields_of(&r.header);
    for p in &perms {
        fields.push_str(&format!(
            "\"PermType\" :  {}\n\"Key\" : {}\n\"RangeEnd\" : {}\n",
            perm_name(p.perm_type),
            crate::gofmt::quote_bytes(&p.key),
            crate::gofmt::quote_bytes(&p.range_end)
        ));
    }
    pr.with_json(&r, json, &role_get_simple(role, &perms), Some(fields))
}

pub async fn user(ctx: &mut Ctx) -> Result<(), Exit> {
    let sub = ctx.p.path[1];
    let args = ctx.p.args.clone();
    let need = |n: usize, m: &str| need_args(&args, n, m);
    match sub {
        "add" => {
            need(1, "user add command requires user name as its argument")?;
            let mut opts = None;
            let (user, password);
            if ctx.p.bool("no-password") {
                user = args[0].clone();
                password = String::new();
                opts = Some(UserAddOptions::new().with_no_pwd());
            } else if !ctx.p.get("new-user-password").is_empty() {
                user = args[0].clone();
                password = ctx.p.get("new-user-password").to_string();
            } else if let Some((u, p)) = args[0].split_once(':') {
                if u.is_empty() {
                    return Err(bad("empty user name is not allowed"));
                }
                user = u.to_string();
                password = p.to_string();
            } else {
                user = args[0].clone();
                password = if ctx.p.bool("interactive") {
                    read_password_interactive(&user)?
                } else {
                    scan_word()
                };
            }
            header_only_call!(
                ctx,
                |a| a.user_add(user.clone(), password, opts),
                &format!("User {user} created\n")
            )
        }
        "delete" => {
            need(1, "user delete command requires user name as its argument")?;
            header_only_call!(
                ctx,
                |a| a.user_delete(args[0].clone()),
                &format!("User {} deleted\n", args[0])
            )
        }
        "get" => {
            need(1, "user get command requires user name as its argument")?;
            let (c, pr, r) = auth_rpc!(ctx, |a| a.user_get(args[0].clone()));
            if ctx.p.bool("detail") {
                outln(&format!("User: {}", args[0]));
                for role in &r.roles {
                    outln("");
                    role_get(&c, &pr, role).await?;
                }
                return Ok(());
            }
            let mut simple = format!("User: {}\nRoles:", args[0]);
            for role in &r.roles {
                simple.push_str(&format!(" {role}"));
            }
            simple.push('\n');
            let json = Obj::new().header(&r.header).strs("roles", &r.roles).done();
            pr.with_json(&r, json, &simple, None)
        }
        "list" => {
            need(0, "user list command requires no arguments")?;
            let (_c, pr, r) = auth_rpc!(ctx, |a| a.user_list());
            let simple: String = r.users.iter().map(|u| format!("{u}\n")).collect();
            let json = Obj::new().header(&r.header).strs("users", &r.users).done();
            pr.with_json(&r, json, &simple, None)
        }
        "passwd" => {
            need(1, "user passwd command requires user name as its argument")?;
            let password = if ctx.p.bool("interactive") {
                read_password_interactive(&args[0])?
            } else {
                scan_word()
            };
            header_only_call!(
                ctx,
                |a| a.user_change_password(args[0].clone(), password),
                "Password updated\n"
            )
        }
        "grant-role" => {
            need(
                2,
                "user grant command requires user name and role name as its argument",
            )?;
            header_only_call!(
                ctx,
                |a| a.user_grant_role(args[0].clone(), args[1].clone()),
                &format!("Role {} is granted to user {}\n", args[1], args[0])
            )
        }
        "revoke-role" => {
            need(
                2,
                "user revoke-role requires user name and role name as its argument",
            )?;
            header_only_call!(
                ctx,
                |a| a.user_revoke_role(args[0].clone(), args[1].clone()),
                &format!("Role {} is revoked from user {}\n", args[1], args[0])
            )
        }
        _ => Err(Exit::new(EXIT_ERROR, "unknown user command")),
    }
}

/// `permRange`: the key and range end of a permission.
fn perm_range(ctx: &Ctx, args: &[String]) -> Result<(Vec<u8>, Vec<u8>), Exit> {
    let (prefix, from_key) = (ctx.p.bool("prefix"), ctx.p.bool("from-key"));
    let key = crate::raw::vec(&args[0]);
    if key.is_empty() {
        if prefix && from_key {
            return Err(bad("--from-key and --prefix flags are mutually exclusive"));
        }
        let end = if prefix || from_key {
            vec![0]
        } else {
            Vec::new()
        };
        return Ok((vec![0], end));
    }
    if args.len() == 1 {
        if prefix {
            if from_key {
                return Err(bad("--from-key and --prefix flags are mutually exclusive"));
            }
            return Ok((key.clone(), prefix_end(&key)));
        }
        if from_key {
            return Ok((key, vec![0]));
        }
        return Ok((key, Vec::new()));
    }
    if prefix {
        return Err(bad("unexpected endkey argument with --prefix flag"));
    }
    if from_key {
        return Err(bad("unexpected endkey argument with --from-key flag"));
    }
    Ok((key, crate::raw::vec(&args[1])))
}

pub async fn role(ctx: &mut Ctx) -> Result<(), Exit> {
    let sub = ctx.p.path[1];
    let args = ctx.p.args.clone();
    let need = |n: usize, m: &str| need_args(&args, n, m);
    match sub {
        "add" => {
            need(1, "role add command requires role name as its argument")?;
            header_only_call!(
                ctx,
                |a| a.role_add(args[0].clone()),
                &format!("Role {} created\n", args[0])
            )
        }
        "delete" => {
            need(1, "role delete command requires role name as its argument")?;
            header_only_call!(
                ctx,
                |a| a.role_delete(args[0].clone()),
                &format!("Role {} deleted\n", args[0])
            )
        }
        "get" => {
            need(1, "role get command requires role name as its argument")?;
            let (c, pr) = ctx.client_no_deadline().await?;
            role_get(&c, &pr, &args[0]).await
        }
        "list" => {
            need(0, "role list command requires no arguments")?;
            let (_c, pr, r) = auth_rpc!(ctx, |a| a.role_list());
            let simple: String = r.roles.iter().map(|u| format!("{u}\n")).collect();
            let json = Obj::new().header(&r.header).strs("roles", &r.roles).done();
            let mut fields = crate::printer::hdr_fields_of(&r.header);
            fields.push_str("\"Roles\" :");
            for role in &r.roles {
                fields.push_str(&format!(" {}", crate::gofmt::quote(role)));
            }
            fields.push('\n');
            pr.with_json(&r, json, &simple, Some(fields))
        }
        "grant-permission" => {
            if args.len() < 3 {
                return Err(bad("role grant command requires role name, permission type, and key [endkey] as its argument"));
            }
            let t = match args[1].to_uppercase().as_str() {
                "READ" => PermissionType::Read,
                "WRITE" => PermissionType::Write,
                "READWRITE" => PermissionType::Readwrite,
                _ => return Err(bad(&format!("invalid permission type: {}", args[1]))),
            };
            let (key, end) = perm_range(ctx, &args[2..])?;
            let mut perm = Permission::new(t, key);
            if !end.is_empty() {
                perm = perm.with_range_end(end);
            }
            header_only_call!(
                ctx,
                |a| a.role_grant_permission(args[0].clone(), perm),
                &format!("Role {} updated\n", args[0])
            )
        }
        "revoke-permission" => {
            if args.len() < 2 {
                return Err(bad("role revoke-permission command requires role name and key [endkey] as its argument"));
            }
            let (key, end) = perm_range(ctx, &args[1..])?;
            let mut o = RoleRevokePermissionOptions::new();
            if !end.is_empty() {
                o = o.with_range_end(end.clone());
            }
            let (_c, pr, r) = auth_rpc!(ctx, |a| a.role_revoke_permission(
                args[0].clone(),
                key,
                Some(o)
            ));
            let (role, k) = (&args[0], &args[1]);
            let simple = if end.is_empty() {
                format!("Permission of key {k} is revoked from role {role}\n")
            } else if end != [0] {
                format!(
                    "Permission of range [{k}, {}) is revoked from role {role}\n",
                    lossy(&end)
                )
            } else {
                format!("Permission of range [{k}, <open ended> is revoked from role {role}\n")
            };
            pr.header_only(&r, &r.header, &simple, true)
        }
        _ => Err(Exit::new(EXIT_ERROR, "unknown role command")),
    }
}
