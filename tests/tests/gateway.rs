//! The JSON gateway (etcd's grpc-gateway on the client port: `POST
//! /v3/<service>/<method>` with a JSON body) compared with etcd 3.4.23.
//!
//! One scenario ([`SCRIPT`]: KV, lease, cluster, maintenance, auth, lock,
//! election, bad input, `/v3beta`) runs over plain HTTP/1.1 on a fresh
//! 1-node real etcd (the reference) and on a fresh 1-node server of the
//! selected flavour (retcd by default; `RETCD_TEST_FLAVOR=etcd` runs etcd
//! twice, which checks the scenario and its normalisation). Each step is
//! recorded as its script line `=> STATUS CONTENT-TYPE RESPONSE`, the
//! response re-serialised with its keys in the server's order and with what
//! legitimately differs between two servers masked: cluster/member IDs,
//! terms, raft indexes, DB sizes, the server version, the DB hash, auth
//! tokens, a lease's remaining TTL and server-chosen lease IDs (as
//! `<lease1>`…, also inside the keys lock and election derive from them).
//! Revisions, counts, keys, values, error texts and codes are kept. The
//! transcripts must be equal line by line; a differing line says when only
//! the key order differs. Expectations checked on etcd's side (each step's
//! HTTP status, `?` lines) keep the scenario from passing because both
//! servers went wrong alike.
//!
//! The watch stream (`POST /v3/watch`, newline-delimited JSON) is compared
//! too: its status and first lines while a key is put. `RETCD_TEST_TRACE=1`
//! prints each line as it happens.

use std::time::{Duration, Instant};

use retcd_tests::http::{raw_exchange, RawResp as Resp};
use retcd_tests::limit::SHORT as LIMIT;
use retcd_tests::{bounded, normalize_text, test_flavor, Cluster, Flavor};
use serde_json::Value;

const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// One step a line: `[auth=TOKEN] STATUS[:code|:status] METHOD PATH [BODY]`
/// sends a request and expects STATUS on etcd; `:code` records only the
/// status and the error body's `code` (Go's and Rust's JSON error texts
/// differ), `:status` only the status. In BODY (and TOKEN, checks),
/// `"@text"` is `text` in base64 (`\0`: a NUL byte) and `$name` a value
/// captured from the previous response by `$name /json/pointer`. The IDs
/// of leases the server chose are shown as `<lease1>`…
/// `? /json/pointer JSON` checks the previous response on etcd.
const SCRIPT: &str = r#"
# KV
200 POST /v3/kv/put {"key":"@foo","value":"@bar"}
? /header/revision "2"
200 POST /v3/kv/put {"key":"@foo/a","value":"@1"}
200 POST /v3/kv/put {"key":"@foo/b","value":"@2"}
200 POST /v3/kv/put {"key":"@zoo","value":"@z"}
200 POST /v3/kv/range {"key":"@foo"}
? /kvs/0/value "@bar"
200 POST /v3/kv/range {"key":"@foo/","range_end":"@foo0"}
? /count "2"
200 POST /v3/kv/range {"key":"@\0","range_end":"@\0","limit":2}
? /more true
200 POST /v3/kv/range {"key":"@\0","range_end":"@\0","count_only":true}
? /count "4"
200 POST /v3/kv/range {"key":"@\0","rangeEnd":"@\0","keysOnly":true}
200 POST /v3/kv/range {"key":"@\0","range_end":"@\0","sort_order":"DESCEND","sort_target":"KEY"}
? /kvs/0/key "@zoo"
200 POST /v3/kv/range {"key":"@\0","range_end":"@\0","sort_order":"ASCEND","sort_target":"MOD","keys_only":true}
200 POST /v3/kv/deleterange {"key":"@foo/a","prev_kv":true}
? /prev_kvs/0/value "@1"
200 POST /v3/kv/deleterange {"key":"@nosuch"}
200 POST /v3/kv/txn {"compare":[{"target":"VALUE","result":"EQUAL","key":"@foo","value":"@bar"}],"success":[{"request_put":{"key":"@foo","value":"@baz","prev_kv":true}},{"request_range":{"key":"@foo"}}],"failure":[{"request_delete_range":{"key":"@foo"}}]}
? /succeeded true
200 POST /v3/kv/txn {"compare":[{"target":"VERSION","result":"GREATER","key":"@foo","version":"0"},{"target":"MOD","result":"LESS","key":"@foo/b","mod_revision":2}],"success":[{"request_put":{"key":"@foo","value":"@x"}}],"failure":[{"request_delete_range":{"key":"@zoo","prev_kv":true}},{"request_txn":{}}]}
? /succeeded null
200 POST /v3/kv/compaction {"revision":3,"physical":true}
200 POST /v3/kv/range {"key":"@foo","revision":"3"}
400 POST /v3/kv/range {"key":"@foo","revision":"2"}
? /code 11
400 POST /v3/kv/range {"key":"@foo","revision":"100"}
# Lease
200 POST /v3/lease/grant {"TTL":60}
$lease1 /ID
200 POST /v3/lease/grant {"TTL":30,"ID":"12345"}
200 POST /v3/kv/put {"key":"@leased","value":"@v","lease":"$lease1"}
200 POST /v3/lease/timetolive {"ID":"$lease1","keys":true}
? /keys/0 "@leased"
200 POST /v3/kv/lease/timetolive {"ID":"12345"}
200 POST /v3/lease/leases {}
200 POST /v3/lease/revoke {"ID":"$lease1"}
200 POST /v3/kv/lease/revoke {"ID":12345}
404 POST /v3/lease/revoke {"ID":"12345"}
? /code 5
200 POST /v3/kv/lease/leases
200 POST /v3/kv/range {"key":"@leased"}
# Cluster, maintenance
200 POST /v3/cluster/member/list {}
200 POST /v3/maintenance/status {}
# etcd 3.4 answers {} (no header); 3.5 and retcd add the header: the
# status and the alarm list are compared.
200:status POST /v3/maintenance/alarm {"action":"GET"}
? /alarms null
200 POST /v3/maintenance/defragment {}
200 POST /v3/maintenance/hash {}
# Auth
200 POST /v3/auth/user/add {"name":"root","password":"rootpw"}
400 POST /v3/auth/enable {}
200 POST /v3/auth/role/add {"name":"root"}
200 POST /v3/auth/user/grant {"user":"root","role":"root"}
200 POST /v3/auth/enable {}
400 POST /v3/auth/authenticate {"name":"root","password":"wrong"}
200 POST /v3/auth/authenticate {"name":"root","password":"rootpw"}
$token /token
400 POST /v3/kv/range {"key":"@foo"}
auth=bogus.1 401 POST /v3/kv/range {"key":"@foo"}
auth=$token 200 POST /v3/kv/range {"key":"@foo"}
? /kvs/0/value "@baz"
400 POST /v3/auth/disable {}
auth=$token 200 POST /v3/auth/disable {}
200 POST /v3/kv/range {"key":"@foo"}
# Enum numbers outside the enums pass through the gateway (jsonpb): a
# permission of type 7 is stored and shown as a number; a compare with an
# unknown result or target answers; a quoted number is no enum name (the
# wording of JSON decoding errors is not compared: Go's and serde's differ).
200 POST /v3/auth/role/add {"name":"odd"}
200 POST /v3/auth/role/grant {"name":"odd","perm":{"permType":7,"key":"@odd"}}
200 POST /v3/auth/role/get {"role":"odd"}
? /perm/0/permType 7
400:code POST /v3/auth/role/grant {"name":"odd","perm":{"permType":"7","key":"@odd"}}
200 POST /v3/kv/txn {"compare":[{"target":9,"result":"EQUAL","key":"@foo","value":"@baz"},{"target":"VALUE","result":7,"key":"@foo","value":"@baz"}]}
# Lock, election
200 POST /v3/lease/grant {"TTL":60}
$lease2 /ID
200 POST /v3/lock/lock {"name":"@mylock","lease":"$lease2"}
$lockkey /key
200 POST /v3/lock/unlock {"key":"$lockkey"}
200 POST /v3/election/campaign {"name":"@elec","lease":"$lease2","value":"@v1"}
$leader /leader
$lkey /leader/key
200 POST /v3/election/leader {"name":"@elec"}
200 POST /v3/election/proclaim {"leader":$leader,"value":"@v2"}
200 POST /v3/election/leader {"name":"@elec"}
? /kv/value "@v2"
500 POST /v3/election/proclaim {"leader":{"name":"@elec","key":"$lkey","rev":"1","lease":"$lease2"},"value":"@x"}
200 POST /v3/election/resign {"leader":$leader}
500 POST /v3/election/leader {"name":"@elec"}
# Bad input, other paths and methods
400:code POST /v3/kv/range {bad
400 POST /v3/kv/range
400 POST /v3/kv/put {}
200 POST /v3/kv/range {"key":"@foo","nosuch":1}
400:code POST /v3/kv/range {"key":"!!"}
404:status POST /v3/kv/nosuch {}
405:status GET /v3/kv/range
200 POST /v3beta/kv/range {"key":"@foo"}
"#;

/// One HTTP/1.1 request (`Connection: close`); reads until EOF or `until`.
fn http(port: u16, method: &str, path: &str, auth: &str, body: &str, until: Instant) -> Resp {
    let auth: String = auth
        .lines()
        .map(|t| format!("Authorization: {t}\r\n"))
        .collect();
    let len = body.len();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}Content-Type: application/json\r\n\
         Content-Length: {len}\r\nConnection: close\r\n\r\n{body}"
    );
    raw_exchange(port, request.as_bytes(), until)
}

/// JSON with object keys in the server's order (the workspace's serde_json
/// sorts them): strings decoded, other scalars raw.
enum J {
    Obj(Vec<(String, J)>),
    Arr(Vec<J>),
    Str(String),
    Lit(String),
}

/// Parses the value at `b[*i..]`, leniently (callers validate with serde_json).
fn parse_j(b: &[u8], i: &mut usize) -> Option<J> {
    let skip =
        |i: &mut usize, f: &dyn Fn(&u8) -> bool| *i += b[*i..].iter().take_while(|c| f(c)).count();
    skip(i, &u8::is_ascii_whitespace);
    let (open, start) = (*b.get(*i)?, *i);
    if open == b'{' || open == b'[' {
        let (mut m, mut a) = (Vec::new(), Vec::new());
        *i += 1;
        loop {
            skip(i, &u8::is_ascii_whitespace);
            match *b.get(*i)? {
                b'}' | b']' => break,
                b',' => *i += 1,
                _ if open == b'[' => a.push(parse_j(b, i)?),
                _ => {
                    let Some(J::Str(k)) = parse_j(b, i) else {
                        return None;
                    };
                    skip(i, &|c| c.is_ascii_whitespace() || *c == b':');
                    m.push((k, parse_j(b, i)?));
                }
            }
        }
        *i += 1;
        return Some(if open == b'{' { J::Obj(m) } else { J::Arr(a) });
    }
    if open == b'"' {
        *i += 1;
        while *b.get(*i)? != b'"' {
            *i += if b[*i] == b'\\' { 2 } else { 1 };
        }
        *i += 1;
        return serde_json::from_slice(&b[start..*i]).ok().map(J::Str);
    }
    skip(i, &|c| !b",}] \t\r\n".contains(c));
    Some(J::Lit(String::from_utf8_lossy(&b[start..*i]).into_owned()))
}

fn show(j: &J) -> String {
    let q = |s: &str| Value::from(s).to_string();
    match j {
        J::Obj(m) => {
            let kv: Vec<String> = m.iter().map(|(k, v)| q(k) + ":" + &show(v)).collect();
            format!("{{{}}}", kv.join(","))
        }
        J::Arr(a) => format!("[{}]", a.iter().map(show).collect::<Vec<_>>().join(",")),
        J::Str(s) => q(s),
        J::Lit(s) => s.clone(),
    }
}

const B64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn b64(s: &str) -> String {
    let mut out = String::new();
    for c in s.as_bytes().chunks(3) {
        let n = (c.iter().enumerate()).fold(0u32, |n, (i, &x)| n | (x as u32) << (16 - 8 * i));
        for i in 0..4 {
            let six = B64[(n >> (18 - 6 * i) & 63) as usize] as char;
            out.push(if i <= c.len() { six } else { '=' });
        }
    }
    out
}

fn unb64(s: &str) -> Option<String> {
    let six = s.trim_end_matches('=').bytes();
    let six: Option<Vec<u32>> = six
        .map(|c| B64.iter().position(|&x| x == c).map(|x| x as u32))
        .collect();
    let six = six?;
    let bytes = six.chunks(4).flat_map(|c| {
        let n = (c.iter().enumerate()).fold(0u32, |n, (i, &x)| n | x << (18 - 6 * i));
        (0..c.len().saturating_sub(1)).map(move |i| (n >> (16 - 8 * i)) as u8)
    });
    String::from_utf8(bytes.collect()).ok()
}

/// Fields whose values differ between two servers for reasons that do not matter.
const MASKED: &str = "cluster_id member_id raft_term raftTerm raftIndex raftAppliedIndex dbSize dbSizeInUse token hash";

/// The observable outcomes of the scenario on one flavour.
#[derive(Default)]
struct Transcript {
    flavor: &'static str,
    port: u16,
    /// Compared with the reference, line by line; with `[status, content
    /// type, response]` as values (key-sorted), to tell order-only diffs.
    lines: Vec<(String, Value)>,
    /// Printed, not compared (streaming).
    side: Vec<String>,
    violations: Vec<String>,
    /// The previous response.
    last: Value,
    /// Captured values (`$name`), and the server-chosen IDs to mask.
    vars: Vec<(String, String)>,
    ids: Vec<(String, String)>,
    leases: usize,
}

impl Transcript {
    fn check(&mut self, ok: bool, what: &str) {
        if !ok {
            let line = self.lines.last().map_or("", |l| l.0.as_str());
            self.violations.push(format!("{line}\n    expected {what}"));
        }
    }

    /// `$name`s replaced by their values, `"@text"` by `"base64(text)"`.
    fn subst(&self, s: &str) -> String {
        let mut s = s.to_string();
        for (k, v) in &self.vars {
            s = s.replace(&format!("${k}"), v);
        }
        let mut parts = s.split("\"@");
        let mut out = parts.next().unwrap_or("").to_string();
        for p in parts {
            let (text, rest) = p.split_once('"').unwrap_or((p, ""));
            out += &format!("\"{}\"{rest}", b64(&text.replace("\\0", "\0")));
        }
        out
    }

    /// Masks `j`, the value of field `key` (`granted`: its object's `grantedTTL`).
    fn norm(&mut self, key: &str, j: &mut J, granted: Option<i64>) {
        match j {
            J::Obj(m) => {
                let g = m.iter().find_map(|(k, v)| match v {
                    J::Str(s) if k == "grantedTTL" => s.parse().ok(),
                    _ => None,
                });
                m.iter_mut().for_each(|(k, v)| self.norm(k, v, g));
            }
            J::Arr(a) => a.iter_mut().for_each(|v| self.norm(key, v, None)),
            J::Str(s) | J::Lit(s) => {
                let masked = if let Some((_, name)) = self.ids.iter().find(|(v, _)| v == s) {
                    name.clone()
                } else if MASKED.split(' ').any(|m| m == key)
                    || (key == "version" && s.contains('.'))
                {
                    format!("<{key}>")
                } else if let Some(g) = granted.filter(|_| key == "TTL") {
                    if !(g - 10..=g).contains(&s.parse().unwrap_or(-1)) {
                        self.violations
                            .push(format!("a remaining TTL {s} not in {}..={g}", g - 10));
                    }
                    "<TTL>".into()
                } else if s.contains("127.0.0.1:") {
                    normalize_text(s)
                } else {
                    // A key made of a lease ID (lock, election): `base64(name/<leaseN>)`.
                    let text = unb64(s).filter(|_| key == "key").unwrap_or_default();
                    let hex = |id: &str| id.parse::<u64>().map_or("-".into(), |v| format!("{v:x}"));
                    match self.ids.iter().find(|(id, _)| text.contains(&hex(id))) {
                        Some((id, name)) => format!("base64({})", text.replace(&hex(id), name)),
                        None => return,
                    }
                };
                *j = J::Str(masked);
            }
        }
    }

    /// A response body re-serialised (keys in order) and masked.
    fn render(&mut self, body: &str) -> Option<(String, Value)> {
        let value = serde_json::from_str::<Value>(body).ok()?;
        let mut j = parse_j(body.as_bytes(), &mut 0)?;
        self.norm("", &mut j, None);
        let text = show(&j);
        Some((text.clone(), serde_json::from_str(&text).unwrap_or(value)))
    }

    /// Masks the server-chosen `id` as `<name>` from now on.
    fn learn(&mut self, id: Option<&str>, name: String) {
        if let Some(id) = id.filter(|id| !self.ids.iter().any(|(v, _)| v == id)) {
            self.ids.push((id.to_string(), format!("<{name}>")));
        }
    }

    /// Runs one script line.
    fn run(&mut self, line: &str) {
        let line = line.trim();
        if let Some((name, ptr)) = line.strip_prefix('$').and_then(|l| l.split_once(' ')) {
            let v = self.last.pointer(ptr).cloned().unwrap_or_default();
            let v = v.as_str().map_or(v.to_string(), str::to_string);
            self.vars.push((name.to_string(), v));
        } else if let Some((ptr, want)) = line.strip_prefix("? ").and_then(|l| l.split_once(' ')) {
            let want: Value = serde_json::from_str(&self.subst(want)).expect("check JSON");
            let got = self.last.pointer(ptr).cloned().unwrap_or_default();
            self.check(got == want, &format!("{ptr} = {want}, got {got}"));
        } else if !line.is_empty() && !line.starts_with('#') {
            let (auth, line) = match line.strip_prefix("auth=") {
                Some(l) => l.split_once(' ').expect("auth=TOKEN ..."),
                None => ("", line),
            };
            let w: Vec<&str> = line.splitn(4, ' ').collect();
            let (want, keep) = w[0].split_once(':').unwrap_or((w[0], "all"));
            let (auth, body) = (self.subst(auth), self.subst(w.get(3).unwrap_or(&"")));
            let until = Instant::now() + IO_TIMEOUT;
            let r = http(self.port, w[1], w[2], &auth, &body, until);
            self.last = serde_json::from_str(&r.body).unwrap_or_default();
            let member = self.last.pointer("/header/member_id").cloned();
            self.learn(member.as_ref().and_then(Value::as_str), "member_id".into());
            if w[2].ends_with("/lease/grant") {
                // A server-chosen ID (not the one in the request).
                let id = self.last["ID"].as_str().map(str::to_string);
                if let Some(id) = id.filter(|id| !body.contains(id.as_str())) {
                    self.leases += 1;
                    self.learn(Some(&id), format!("lease{}", self.leases));
                }
            }
            let auth = if auth.is_empty() { "" } else { "[auth] " };
            let (status, ctype) = (r.status, r.ctype.clone());
            let mut out = format!("{auth}{line} => {status}");
            let mut value = Value::Null;
            match (keep, self.render(&r.body)) {
                ("status", _) => {}
                ("code", _) => out += &format!(" code={}", self.last["code"]),
                (_, None) => out += &format!(" {ctype} non-JSON {:?}", r.body.trim()),
                (_, Some((text, v))) => {
                    out += &format!(" {ctype} {text}");
                    value = serde_json::json!([status, ctype, v]);
                }
            }
            if std::env::var_os("RETCD_TEST_TRACE").is_some() {
                eprintln!("trace {}: {out}", self.flavor);
            }
            self.lines.push((out, value));
            self.check(status.to_string() == want, &format!("HTTP status {want}"));
        }
    }

    /// `POST /v3/watch` on `foo`, read for ~1.5 s while `foo` is put
    /// through the gateway: the status and the first lines, normalised.
    fn watch(&mut self) {
        let create = self.subst(r#"{"create_request":{"key":"@foo"}}"#);
        let (port, put) = (self.port, self.subst(r#"{"key":"@foo","value":"@w"}"#));
        let until = Instant::now() + Duration::from_millis(1500);
        let body = create.clone();
        let reader = std::thread::spawn(move || http(port, "POST", "/v3/watch", "", &body, until));
        std::thread::sleep(Duration::from_millis(400));
        let until = Instant::now() + IO_TIMEOUT;
        let put = http(port, "POST", "/v3/kv/put", "", &put, until);
        let r = reader.join().expect("watch reader");
        let (s, ct, p) = (r.status, &r.ctype, put.status);
        let head = format!("POST /v3/watch {create} => {s} {ct} (a put meanwhile: {p})");
        self.lines.push((head, Value::Null));
        for l in r.body.split_inclusive('\n').take(4) {
            let text = self.render(l).map_or(format!("{l:?}"), |r| r.0);
            let nl = if l.ends_with('\n') { " + newline" } else { "" };
            self.lines
                .push((format!("  watch line: {text}{nl}"), Value::Null));
        }
    }
}

/// The whole scenario on a fresh 1-node cluster of `flavor`.
/// The scenario on `flavor`; the reference is etcd 3.5.1, whose gateway
/// (grpc-gateway v1.16) retcd follows: 3.4.23's answers
/// FailedPrecondition with 412, 3.5 and 3.6 with 400.
async fn scenario(flavor: Flavor) -> Transcript {
    let c = match flavor {
        Flavor::Etcd => {
            Cluster::start_with_binary(flavor, retcd_tests::etcd351_bin(), 1, &[]).await
        }
        Flavor::Retcd => Cluster::start(flavor, 1, &[]).await,
    }
    .expect("start");
    let (flavor, port) = (flavor.name(), c.members[0].client_port);
    let mut t = Transcript {
        flavor,
        port,
        ..Default::default()
    };
    tokio::task::block_in_place(|| {
        SCRIPT.lines().for_each(|l| t.run(l));
        t.watch();
    });
    drop(c);
    t
}

fn compare(want: &Transcript, got: &Transcript) {
    want.lines.iter().for_each(|l| eprintln!("etcd: {}", l.0));
    for t in [want, got] {
        t.side
            .iter()
            .for_each(|l| eprintln!("{} (not compared): {l}", t.flavor));
    }
    let v = want.violations.join("\n");
    assert!(
        v.is_empty(),
        "the scenario itself changed on real etcd:\n{v}"
    );
    let n = want.lines.len().max(got.lines.len());
    let none = (String::from("<none>"), Value::Null);
    let line = |t: &Transcript, i: usize| t.lines.get(i).unwrap_or(&none).clone();
    let diffs: Vec<String> = (0..n)
        .map(|i| (i, line(want, i), line(got, i)))
        .filter(|(_, a, b)| a.0 != b.0)
        .map(|(i, a, b)| {
            let same = !a.1.is_null() && a.1 == b.1;
            let order = ["", " (same values, key order differs)"][same as usize];
            format!(
                "line {i}{order}:\n  etcd: {}\n  {}: {}",
                a.0, got.flavor, b.0
            )
        })
        .collect();
    assert!(
        diffs.is_empty() && got.violations.is_empty(),
        "{} of {n} lines differ:\n{}\n{}",
        diffs.len(),
        diffs.join("\n"),
        got.violations.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_same_as_etcd() {
    bounded(LIMIT, async {
        let want = scenario(Flavor::Etcd).await;
        let got = scenario(test_flavor()).await;
        compare(&want, &got);
    })
    .await
}

/// What a client meets that goes on writing a streaming call's body after
/// a value that ends the stream: the result of each later write, the
/// answer's lines, and whether the answer ended with the last chunk. A
/// keepalive body with bytes after its value ends the stream (the value
/// is answered, the rest does not decode). etcd's Go server reads the
/// rest of the body (up to 256 KiB: it answers once the body is done),
/// so the client's later chunks are taken.
fn write_after_the_stream_ended(port: u16, lease: &str) -> (Vec<String>, Vec<String>, bool) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let value = format!(r#"{{"ID":"{lease}"}}]"#);
    let head = "POST /v3/lease/keepalive HTTP/1.1\r\nHost: 127.0.0.1\r\n\
        Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
    s.write_all(format!("{head}{:x}\r\n{value}\r\n", value.len()).as_bytes())
        .expect("write the request");
    // more of the body, the last chunk last, with pauses for the stream to
    // end and a reset to come back from a closed connection
    let writes = [r#"{"ID":8}"#, r#"{"ID": 9}"#]
        .iter()
        .map(|c| format!("{:x}\r\n{c}\r\n", c.len()))
        .chain(["0\r\n\r\n".to_string()])
        .map(|w| {
            std::thread::sleep(Duration::from_millis(200));
            match s.write_all(w.as_bytes()) {
                Ok(()) => "ok".to_string(),
                Err(e) => format!("write: {}", e.kind()),
            }
        })
        .collect();
    // the answer, to its last chunk
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut buf = [0u8; 4096];
    while !got.ends_with(b"\r\n0\r\n\r\n") && Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    let lines = (text.lines())
        .filter(|l| l.starts_with('{'))
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap_or(Value::Null);
            if let Some(h) = v.pointer_mut("/result/header") {
                *h = Value::Null;
            }
            v.to_string()
        })
        .collect();
    (writes, lines, got.ends_with(b"\r\n0\r\n\r\n"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_reads_a_stream_body_after_the_stream_ended() {
    bounded(LIMIT, async {
        let mut seen = Vec::new();
        for flavor in [Flavor::Etcd, test_flavor()] {
            let c = match flavor {
                Flavor::Etcd => {
                    Cluster::start_with_binary(flavor, retcd_tests::etcd351_bin(), 1, &[]).await
                }
                Flavor::Retcd => Cluster::start(flavor, 1, &[]).await,
            }
            .expect("start");
            let port = c.members[0].client_port;
            seen.push(tokio::task::block_in_place(|| {
                let grant = raw_exchange(
                    port,
                    b"POST /v3/lease/grant HTTP/1.1\r\nHost: 127.0.0.1\r\n\
                     Content-Length: 19\r\nConnection: close\r\n\r\n{\"TTL\":3600,\"ID\":7}",
                    Instant::now() + Duration::from_secs(5),
                );
                assert_eq!(grant.status, 200, "{grant:?}");
                write_after_the_stream_ended(port, "7")
            }));
            drop(c);
        }
        let (want, got) = (&seen[0], &seen[1]);
        // on etcd: every later write taken, one answer, then the end
        assert_eq!(want.0, ["ok", "ok", "ok"], "{want:?}");
        assert_eq!(want.1.len(), 1, "{want:?}");
        assert!(want.2, "{want:?}");
        assert_eq!(got, want);
    })
    .await
}
