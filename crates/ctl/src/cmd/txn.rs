//! `txn`: compares, success and failure requests read from stdin, each
//! part ended by an empty line (`-i` prompts for them).

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use crate::client::{Exit, EXIT_BAD_ARGS, EXIT_ERROR, EXIT_INVALID_INPUT};
use crate::cobra::{self, Cmd, Outcome};
use crate::printer::outln;
use crate::raw;
use crate::tree;
use crate::Ctx;

/// etcdctl's `argify`: words, "double-quoted" (Go-unquoted) and
/// 'single-quoted' strings.
fn argify(s: &str) -> Result<Vec<String>, Exit> {
    let b: Vec<char> = s.chars().collect();
    let is_space = |c: char| matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0c');
    let mut toks: Vec<(char, String)> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == '"' {
            let mut j = i + 1;
            let mut ok = false;
            while j < b.len() {
                if b[j] == '\\' && j + 1 < b.len() {
                    j += 2;
                    continue;
                }
                if b[j] == '"' {
                    ok = true;
                    break;
                }
                if b[j] == '\\' {
                    break;
                }
                j += 1;
            }
            if ok {
                toks.push(('"', b[i..=j].iter().collect()));
                i = j + 1;
                continue;
            }
            i += 1;
            continue;
        }
        if c == '\'' {
            if let Some(off) = b[i + 1..].iter().position(|&x| x == '\'') {
                let j = i + 1 + off;
                toks.push(('\'', b[i..=j].iter().collect()));
                i = j + 1;
                continue;
            }
            i += 1;
            continue;
        }
        if is_space(c) {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < b.len() && !is_space(b[j]) {
            j += 1;
        }
        toks.push((' ', b[i..j].iter().collect()));
        i = j;
    }
    let n = toks.len();
    let mut out = Vec::with_capacity(n);
    for (kind, t) in toks {
        match kind {
            '\'' => {
                // etcdctl slices with the number of words, not the word's
                // length: args[i][1 : len(args)-1].
                let bytes = raw::vec(&t);
                if n < 2 || n - 1 > bytes.len() {
                    return Err(go_panic(&format!(
                        "runtime error: slice bounds out of range [:{}] with length {}",
                        n.saturating_sub(1),
                        bytes.len()
                    )));
                }
                out.push(raw::text(&bytes[1..n - 1]));
            }
            '"' => out.push(go_unquote(&t).map_err(|e| Exit::new(EXIT_INVALID_INPUT, e))?),
            _ => out.push(t),
        }
    }
    Ok(out)
}

/// What a Go panic looks like from outside (exit code 2).
pub fn go_panic(msg: &str) -> Exit {
    eprintln!("panic: {msg}\n");
    Exit::silent(2)
}

/// `strconv.Unquote` of a double-quoted Go string.
pub fn go_unquote(s: &str) -> Result<String, String> {
    let inner = s
        .strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .ok_or("invalid syntax")?;
    let mut out: Vec<u8> = Vec::new();
    let mut it = inner.chars().peekable();
    while let Some(c) = it.next() {
        if c != '\\' {
            out.extend_from_slice(&raw::bytes(c.encode_utf8(&mut [0u8; 4])));
            continue;
        }
        let e = it.next().ok_or("invalid syntax")?;
        match e {
            'a' => out.push(7),
            'b' => out.push(8),
            'f' => out.push(12),
            'n' => out.push(b'\n'),
            'r' => out.push(b'\r'),
            't' => out.push(b'\t'),
            'v' => out.push(11),
            '\\' => out.push(b'\\'),
            '"' => out.push(b'"'),
            '\'' => return Err("invalid syntax".into()),
            'x' | 'u' | 'U' => {
                let n = match e {
                    'x' => 2,
                    'u' => 4,
                    _ => 8,
                };
                let h: String = (0..n).filter_map(|_| it.next()).collect();
                let v = u32::from_str_radix(&h, 16).map_err(|_| "invalid syntax")?;
                if h.len() != n {
                    return Err("invalid syntax".into());
                }
                if e == 'x' {
                    out.push(v as u8);
                } else {
                    let ch = char::from_u32(v).ok_or("invalid syntax")?;
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                }
            }
            '0'..='7' => {
                let mut v = e.to_digit(8).unwrap_or(0);
                for _ in 0..2 {
                    let d = it
                        .next()
                        .and_then(|c| c.to_digit(8))
                        .ok_or("invalid syntax")?;
                    v = v * 8 + d;
                }
                if v > 255 {
                    return Err("invalid syntax".into());
                }
                out.push(v as u8);
            }
            _ => return Err("invalid syntax".into()),
        }
    }
    Ok(raw::text(&out))
}

/// A line of stdin, any bytes (carried in the text, see `raw`).
fn read_line(r: &mut impl std::io::BufRead) -> Result<String, Exit> {
    let mut line = Vec::new();
    match r.read_until(b'\n', &mut line) {
        Ok(_) if line.ends_with(b"\n") => Ok(raw::text(&line)),
        Ok(_) => Err(Exit::new(EXIT_INVALID_INPUT, "EOF")),
        Err(e) => Err(Exit::new(EXIT_INVALID_INPUT, e.to_string())),
    }
}

/// A Go `%q`-scanned string from the start of `s` (after spaces); returns
/// it and the rest.
fn scan_quoted(s: &str) -> Option<(String, &str)> {
    let s = s.trim_start_matches([' ', '\t', '\r', '\n']);
    if let Some(r) = s.strip_prefix('`') {
        let end = r.find('`')?;
        return Some((r[..end].to_string(), &r[end + 1..]));
    }
    if !s.starts_with('"') {
        return None;
    }
    let b = s.as_bytes();
    let mut j = 1;
    while j < b.len() {
        if b[j] == b'\\' {
            j += 2;
            continue;
        }
        if b[j] == b'"' {
            let q = &s[..=j];
            return go_unquote(q).ok().map(|v| (v, &s[j + 1..]));
        }
        j += 1;
    }
    None
}

/// Lines up to the first blank one, each parsed by `parse`.
fn read_block<T>(
    r: &mut impl std::io::BufRead,
    parse: fn(&str) -> Result<T, Exit>,
) -> Result<Vec<T>, Exit> {
    let mut all = Vec::new();
    loop {
        let line = read_line(r)?;
        let line = line.trim();
        if line.is_empty() {
            return Ok(all);
        }
        all.push(parse(line)?);
    }
}

fn parse_compare(line: &str) -> Result<Compare, Exit> {
    let inv = |m: String| Exit::new(EXIT_INVALID_INPUT, m);
    let Some((target, rest)) = line.split_once('(') else {
        return Err(inv(format!("malformed comparison: {line}")));
    };
    // fmt.Sscanf(rest, "%q) %s %q", &key, &op, &val)
    let mut key = String::new();
    let mut op = String::new();
    let mut val = String::new();
    let mut n = 0;
    'scan: {
        let Some((k, r)) = scan_quoted(rest) else {
            break 'scan;
        };
        key = k;
        n = 1;
        let Some(r) = r.strip_prefix(')') else {
            break 'scan;
        };
        let r = r.trim_start_matches([' ', '\t']);
        let end = r.find([' ', '\t', '\n', '\r']).unwrap_or(r.len());
        if end == 0 {
            break 'scan;
        }
        op = r[..end].to_string();
        n = 2;
        let Some((v, _)) = scan_quoted(&r[end..]) else {
            break 'scan;
        };
        val = v;
        n = 3;
    }
    if n != 3 {
        return Err(inv(format!(
            "malformed comparison: {line}; got {target}({}) {op} {}",
            crate::gofmt::quote(&key),
            crate::gofmt::quote(&val)
        )));
    }
    // clientv3.Compare: the operator, checked after the number is read
    // (a number that is no number is an error, not a panic)
    let cop = || match op.as_str() {
        "=" => Ok(CompareOp::Equal),
        "!=" => Ok(CompareOp::NotEqual),
        ">" => Ok(CompareOp::Greater),
        "<" => Ok(CompareOp::Less),
        _ => Err(go_panic("Unknown result op")),
    };
    let int = || {
        crate::gofmt::parse_int(&val, 10, 64)
            .map_err(|_| inv(format!("invalid txn compare request: {line}")))
    };
    let key = raw::vec(&key);
    Ok(match target {
        "ver" | "version" => {
            let v = int()?;
            Compare::version(key, cop()?, v)
        }
        "c" | "create" => {
            let v = int()?;
            Compare::create_revision(key, cop()?, v)
        }
        "m" | "mod" => {
            let v = int()?;
            Compare::mod_revision(key, cop()?, v)
        }
        "val" | "value" => Compare::value(key, cop()?, raw::vec(&val)),
        // etcdctl 3.5 passes the value as a string, which clientv3's
        // mustInt64 refuses
        "lease" => {
            cop()?;
            return Err(go_panic("bad value"));
        }
        _ => {
            return Err(inv(format!(
                "malformed comparison: {line} (unknown target {target})"
            )))
        }
    })
}

fn ops_tree() -> Cmd {
    let r = tree::root();
    let pick = |n: &str| r.subs.iter().find(|c| c.name == n).cloned().expect("cmd");
    Cmd::group("", "", vec![pick("put"), pick("get"), pick("del")])
}

fn parse_op(line: &str) -> Result<TxnOp, Exit> {
    let args = argify(line)?;
    if args.len() < 2 {
        return Err(Exit::new(
            EXIT_INVALID_INPUT,
            format!("invalid txn compare request: {line}"),
        ));
    }
    let invalid = || Exit::new(EXIT_INVALID_INPUT, format!("invalid txn request: {line}"));
    let tree = ops_tree();
    let p = match cobra::execute(&tree, &args) {
        Outcome::Run(p) => p,
        // cobra prints the op's usage (its default template: the ops run
        // under a bare root) on a flag error
        Outcome::FlagError { path, .. } => {
            eprintln!("{}", retcd_cobra::usage(&tree, &path));
            return Err(invalid());
        }
        _ => return Err(invalid()),
    };
    match p.path.first().copied() {
        Some("get") => {
            let (k, o) = super::kv::get_op(&p)?;
            Ok(TxnOp::get(k, Some(o)))
        }
        Some("put") => {
            let (k, v, o) = super::kv::put_op(&p, false)?;
            Ok(TxnOp::put(k, v, Some(o)))
        }
        Some("del") => {
            let (k, o) = super::kv::del_op(&p)?;
            Ok(TxnOp::delete(k, Some(o)))
        }
        _ => Err(invalid()),
    }
}

pub async fn txn(ctx: &mut Ctx) -> Result<(), Exit> {
    if !ctx.p.args.is_empty() {
        return Err(Exit::new(
            EXIT_BAD_ARGS,
            "txn command does not accept argument",
        ));
    }
    let interactive = ctx.p.bool("interactive");
    let (c, pr) = ctx.client_no_deadline().await?;
    let stdin = std::io::stdin();
    let mut r = stdin.lock();
    let prompt = |s: &str| {
        if interactive {
            outln(s);
        }
    };
    prompt("compares:");
    let cmps = read_block(&mut r, parse_compare)?;
    let mut parts: Vec<Vec<TxnOp>> = Vec::new();
    for what in [
        "success requests (get, put, del):",
        "failure requests (get, put, del):",
    ] {
        prompt(what);
        parts.push(read_block(&mut r, parse_op)?);
    }
    drop(r);
    let failure = parts.pop().unwrap_or_default();
    let success = parts.pop().unwrap_or_default();
    let t = Txn::new().when(cmps).and_then(success).or_else(failure);
    let mut kv = c.client.kv_client();
    let resp = c
        .unary(None, kv.txn(t))
        .await
        .map_err(|e| Exit::new(EXIT_ERROR, e.message()))?;
    pr.txn(&resp.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argify_words_and_quotes() {
        assert_eq!(argify("put k v").unwrap(), vec!["put", "k", "v"]);
        assert_eq!(
            argify("put \"a b\" \"c\\n\"").unwrap(),
            vec!["put", "a b", "c\n"]
        );
        assert_eq!(argify("put 'k' v").unwrap(), vec!["put", "k", "v"]);
    }

    #[test]
    fn compares() {
        assert!(parse_compare("value(\"k1\") = \"v1\"").is_ok());
        assert!(parse_compare("mod(\"k1\") > \"100\"").is_ok());
        let e = parse_compare("vx(\"k\") = \"1\"").unwrap_err();
        assert_eq!(
            e.msg,
            "malformed comparison: vx(\"k\") = \"1\" (unknown target vx)"
        );
        let e = parse_compare("version(\"k\") = \"x\"").unwrap_err();
        assert_eq!(e.msg, "invalid txn compare request: version(\"k\") = \"x\"");
    }
}
