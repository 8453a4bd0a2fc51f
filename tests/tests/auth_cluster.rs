//! Auth across members, restarts and token kinds. On 3 members: a simple
//! token issued by one member works on the others, and a role revoked
//! through a second member holds on a third. On 1 member: users, roles and
//! the enabled flag survive defrag and restart, simple tokens do not. JWT
//! tokens (`--auth-token jwt,…`): their claims, their surviving a restart,
//! tampered and unsigned ones, an older auth revision; and which
//! `--auth-token` / `--bcrypt-cost` values a server refuses to start with.
//! As in `auth.rs`, each scenario runs on real etcd 3.4 (the reference) and
//! on the selected flavour (retcd by default; with `RETCD_TEST_FLAVOR=etcd`
//! a second etcd) and the transcripts must be equal line by line;
//! expectations checked on each transcript keep a shared bug from passing.
//! `RETCD_TEST_TRACE=1` prints each line as it happens; every test prints
//! etcd's transcript.
//!
//! Tokens travel in the `token` metadata of raw gRPC clients (`retcd_api`),
//! so one member's token can be tried on another. JWT keys come from
//! `openssl` (RSA 2048: PKCS#8 private key, SPKI public key).

use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use retcd_api::etcdserverpb::{
    auth_client::AuthClient, kv_client::KvClient, maintenance_client::MaintenanceClient,
    AuthenticateRequest, PutRequest, RangeRequest, StatusRequest,
};
use retcd_launch::Process;
use retcd_tests::free_port;
use retcd_tests::normalize::normalize_output;
use retcd_tests::{assert_same_lines, etcdctl, retry_until, same_as_etcd, Cluster, Flavor};
use retcd_tests::{limit::LONG as LIMIT, READY};
use serde_json::Value;
use tonic::{Request, Response, Status};

/// The observable outcomes of one scenario on one flavour.
struct Transcript {
    flavor: Flavor,
    /// Compared with the reference, line by line.
    lines: Vec<String>,
    /// Expectations that did not hold.
    violations: Vec<String>,
}

impl Transcript {
    fn new(flavor: Flavor) -> Transcript {
        let (lines, violations) = (Vec::new(), Vec::new());
        Transcript {
            flavor,
            lines,
            violations,
        }
    }

    fn push(&mut self, s: String) {
        if std::env::var_os("RETCD_TEST_TRACE").is_some() {
            eprintln!("trace {}: {s}", self.flavor.name());
        }
        self.lines.push(s);
    }

    /// Records `label => outcome`; expects the outcome to start with `want`.
    fn want(&mut self, label: &str, outcome: String, want: &str) {
        if !outcome.starts_with(want) {
            let v = format!("`{label}`: want {want}, got {outcome}");
            self.violations.push(v);
        }
        self.push(format!("{label} => {outcome}"));
    }

    /// Runs a script, one step a line: `M ARGS [=> WANT]` on member M.
    /// ARGS is an etcdctl 3.4 command line (WANT: `CODE TEXT`, the exit code
    /// and a text in stdout or stderr), recorded as `mM: ARGS => [code]
    /// stdout stderr` (normalised); or a raw gRPC call `@TOKEN put|range KEY`
    /// with token `toks[TOKEN]` (KEY `''`: every key; WANT: the start of the
    /// outcome), recorded as `mM: ARGS => ok …|err CODE "message"`. `~M`:
    /// the call is repeated for up to 5 s until WANT holds (a member applies
    /// an entry a little after the one that answered); `?M`: printed, not
    /// recorded.
    async fn run(&mut self, eps: &[String], toks: &[(&str, &str)], script: &str) {
        for line in script.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let (cmd, want) = line.split_once(" => ").unwrap_or((line, ""));
            let (m, cmd) = cmd.split_once(' ').expect("script: M ARGS");
            let (retry, aside) = (m.starts_with('~'), m.starts_with('?'));
            let m = m.trim_start_matches(['~', '?']);
            let ep = &eps[m.parse::<usize>().expect("script: member")];
            let label = format!("m{m}: {cmd}");
            let args: Vec<&str> = cmd.split_whitespace().collect();
            let Some(tok) = args[0].strip_prefix('@') else {
                let out = tokio::task::block_in_place(|| etcdctl(std::slice::from_ref(ep), &args));
                let out = normalize_output(&out);
                let (so, se) = (out.stdout.trim(), out.stderr.trim());
                self.push(format!("{label} => [{}] {so:?} {se:?}", out.code));
                let (code, text) = want.split_once(' ').unwrap_or((want, ""));
                let code_ok = code.is_empty() || code.parse::<i32>() == Ok(out.code);
                if !code_ok || !(out.stdout.contains(text) || out.stderr.contains(text)) {
                    self.violations.push(format!("`{line}`: got {out:?}"));
                }
                continue;
            };
            let tok = toks.iter().find(|t| t.0 == tok).expect("script: token");
            let tok = tok.1;
            let key = args[2].trim_matches('\'');
            let call = async || match args[1] {
                "put" => put(ep, tok, key).await,
                _ => range(ep, tok, key).await,
            };
            let out = match retry {
                false => call().await,
                // `~`: until the answer is the expected one, at most 5 s.
                true => retry_until(
                    Duration::from_secs(5),
                    Duration::from_millis(100),
                    async || {
                        let out = call().await;
                        if out.starts_with(want) {
                            Ok(out)
                        } else {
                            Err(out)
                        }
                    },
                )
                .await
                .unwrap_or_else(|last| last),
            };
            match aside {
                true => eprintln!("{} (not compared): {label} => {out}", self.flavor.name()),
                false => self.want(&label, out, want),
            }
        }
    }
}

/// Prints the reference transcript, checks both transcripts'
/// expectations, and asserts that the target's equals the reference.
fn compare(want: &Transcript, got: &Transcript) {
    assert_same_lines(
        &want.lines,
        &want.violations,
        &got.lines,
        &got.violations,
        got.flavor.name(),
    );
}

/// `msg` with `token` in its metadata.
fn req<T>(msg: T, token: &str) -> Request<T> {
    let mut r = Request::new(msg);
    let token = token.parse().expect("token is ASCII");
    r.metadata_mut().insert("token", token);
    r
}

/// `ok F(response)` or `err CODE "message"`.
fn show<T>(r: Result<Response<T>, Status>, f: impl FnOnce(T) -> String) -> String {
    match r {
        Ok(r) => format!("ok {}", f(r.into_inner())),
        Err(s) => format!("err {:?} {:?}", s.code(), s.message()),
    }
}

/// `put KEY v` on `ep` with `token`: `ok rev=R` or the error.
async fn put(ep: &str, token: &str, key: &str) -> String {
    let mut kv = KvClient::connect(ep.to_string()).await.expect("kv");
    let mut p = PutRequest::default();
    (p.key, p.value) = (key.into(), b"v".to_vec());
    let r = kv.put(req(p, token)).await;
    show(r, |r| format!("rev={}", r.header.map_or(0, |h| h.revision)))
}

/// A range over prefix `key` (every key when empty) on `ep` with `token`:
/// `ok rev=R [keys]` or the error.
async fn range(ep: &str, token: &str, key: &str) -> String {
    let mut kv = KvClient::connect(ep.to_string()).await.expect("kv");
    let mut r = RangeRequest::default();
    (r.key, r.range_end) = (key.into(), key.into());
    match r.range_end.last_mut() {
        Some(b) => *b += 1,
        None => (r.key, r.range_end) = (vec![0], vec![0]),
    }
    show(kv.range(req(r, token)).await, |r| {
        let key = |kv: &retcd_api::mvccpb::KeyValue| String::from_utf8_lossy(&kv.key).into();
        let keys: Vec<String> = r.kvs.iter().map(key).collect();
        format!("rev={} {keys:?}", r.header.map_or(0, |h| h.revision))
    })
}

/// Bob's token from member `ep` (`""` on failure); records its shape
/// (`simple token`, etcd's 16 letters `.` raft index, or its number of
/// dot-separated parts), expected to start with `want`.
async fn bob_token(t: &mut Transcript, label: &str, ep: &str, want: &str) -> String {
    let mut a = AuthClient::connect(ep.to_string()).await.expect("auth");
    let (name, password) = ("bob".to_string(), "bobpw".to_string());
    let r = a.authenticate(AuthenticateRequest { name, password }).await;
    let out = show(r, |r| r.token);
    let tok = out.strip_prefix("ok ").unwrap_or_default().to_string();
    let digits = |b: &str| !b.is_empty() && b.bytes().all(|c| c.is_ascii_digit());
    let simple = tok.split_once('.').is_some_and(|(a, b)| {
        a.len() == 16 && a.bytes().all(|c| c.is_ascii_alphabetic()) && digits(b)
    });
    let shape = match out.starts_with("ok") {
        true if simple => "simple token".to_string(),
        true => format!("token of {} parts", tok.split('.').count()),
        false => out,
    };
    t.want(label, shape, want);
    tok
}

/// m0 adds root, enables auth and adds bob with role app (readwrite app/*);
/// bob's token from m0 is good on m1 and m2; root sees bob on m2; a role
/// revoked through m1 holds on m2 once m2 applied it.
const THREE: &str = r#"0 user add root:rootpw => 0 User root created
    0 auth enable => 0 Authentication Enabled
    0 --user=root:rootpw user add bob:bobpw => 0 User bob created
    0 --user=root:rootpw role add app
    0 --user=root:rootpw role grant-permission app --prefix=true readwrite app/
    0 --user=root:rootpw user grant-role bob app => 0 Role app is granted to user bob
    ~1 @bob put app/x => ok rev=2
    ~2 @bob put other => err PermissionDenied "etcdserver: permission denied"
    ~2 @bob range app/ => ok rev=2 ["app/x"]
    1 @bob range '' => err PermissionDenied "etcdserver: permission denied"
    2 --user=root:rootpw user list => 0 bob
    2 --user=root:rootpw user get bob => 0 Roles: app
    2 --user=bob:bobpw get app/x => 0 app/x
    1 --user=root:rootpw user revoke-role bob app => 0 revoked
    2 --user=root:rootpw get app/ --prefix --keys-only => 0 app/x
    2 --user=root:rootpw user get bob
    ~2 @bob put app/y => err PermissionDenied "etcdserver: permission denied"
    0 @bob range app/ => err PermissionDenied "etcdserver: permission denied"
    2 --user=bob:bobpw get app/x => 1 permission denied
    2 --user=root:rootpw get app/ --prefix --keys-only"#;

async fn three_members(flavor: Flavor) -> Transcript {
    let c = Cluster::start(flavor, 3, &[]).await.expect("start");
    let (eps, mut t) = (c.endpoints(), Transcript::new(flavor));
    let (setup, rest) = THREE.split_at(THREE.find("~1").expect("THREE"));
    t.run(&eps, &[], setup).await;
    let tok = bob_token(&mut t, "m0: authenticate bob", &eps[0], "simple token").await;
    // The linearizable get through m2 makes m2 apply the revocation before
    // bob's put app/y; no put of app/y may go through.
    t.run(&eps, &[("bob", tok.as_str())], rest).await;
    if t.lines.last().is_some_and(|l| l.contains("app/y")) {
        t.violations.push("a put of app/y went through".into());
    }
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_on_three_members_same_as_etcd() {
    same_as_etcd(LIMIT, three_members, compare).await;
}

/// root, bob (role app: readwrite app/*), auth on, app/a written by bob.
const SETUP: &str = "0 user add root:rootpw
    0 user add bob:bobpw
    0 role add app
    0 role grant-permission app --prefix=true readwrite app/
    0 user grant-role bob app
    0 auth enable => 0 Authentication Enabled
    0 --user=bob:bobpw put app/a 1 => 0 OK";

/// The auth state as etcdctl sees it; defrag and restart must not change it.
const STATE: &str = "0 --user=root:rootpw user list => 0 bob
    0 --user=root:rootpw user get bob => 0 Roles: app
    0 --user=root:rootpw role get app => 0 [app/, app0) (prefix app/)
    0 --user=bob:bobpw get app/ --prefix --keys-only => 0 app/a
    0 --user=bob:bobpw put other 1 => 1 permission denied
    0 get app/a => 1 user name is empty";

/// Runs [`STATE`]; expects it to print what it printed the first time.
async fn check_state(t: &mut Transcript, eps: &[String], first: &mut Vec<String>) {
    let n = t.lines.len();
    t.run(eps, &[], STATE).await;
    if first.is_empty() {
        *first = t.lines[n..].to_vec();
    } else if first[..] != t.lines[n..] {
        t.violations.push("the auth state changed".into());
    }
}

/// Stops member 0 (SIGTERM) and starts it again.
async fn restart(c: &mut Cluster) {
    c.members[0].stop();
    let r = c.restart_member(0, READY).await;
    r.expect("restart");
}

async fn restart_scenario(flavor: Flavor) -> Transcript {
    let mut c = Cluster::start(flavor, 1, &[]).await.expect("start");
    let (eps, mut t) = (c.endpoints(), Transcript::new(flavor));
    t.run(&eps, &[], SETUP).await;
    // At a restart etcd re-applies the raft entries after the last one that
    // wrote keys, Authenticate entries included, and so re-issues the simple
    // tokens they carried: token B comes back, token A does not. B is kept
    // aside: an artefact, not a behaviour to copy.
    let a = bob_token(&mut t, "authenticate bob (token A)", &eps[0], "simple").await;
    let tok_a = [("A", a.as_str())];
    t.run(&eps, &tok_a, "0 @A range app/ => ok").await;
    let put_z = "0 --user=root:rootpw put app/z 1 => 0 OK";
    t.run(&eps, &[], put_z).await;
    let b = bob_token(&mut t, "authenticate bob (token B)", &eps[0], "simple").await;
    let mut first = Vec::new();
    check_state(&mut t, &eps, &mut first).await;
    // Defragment is an admin RPC while auth is on.
    let defrag = "0 defrag => 1 user name is empty
        0 --user=bob:bobpw defrag => 1 permission denied
        0 --user=root:rootpw defrag => 0 Finished defragmenting
        0 @A range app/ => ok";
    t.run(&eps, &tok_a, defrag).await;
    check_state(&mut t, &eps, &mut first).await;
    restart(&mut c).await;
    let after = r#"0 @A range app/ => err Unauthenticated "etcdserver: invalid auth token"
        0 @A put app/b => err Unauthenticated "etcdserver: invalid auth token"
        ?0 @B range app/"#;
    let toks = [("A", a.as_str()), ("B", b.as_str())];
    t.run(&eps, &toks, after).await;
    check_state(&mut t, &eps, &mut first).await;
    let new = bob_token(&mut t, "authenticate bob after restart", &eps[0], "simple").await;
    let new = [("new", new.as_str())];
    t.run(&eps, &new, "0 @new put app/b => ok rev=4").await;
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_survives_restart_same_as_etcd() {
    same_as_etcd(LIMIT, restart_scenario, compare).await;
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// The JSON in a JWT part (base64url, no padding), `null` if none.
fn jwt_part(s: &str) -> Value {
    let (mut bits, mut n, mut out) = (0u32, 0, Vec::new());
    for c in s.bytes() {
        let Some(v) = B64.iter().position(|&b| b == c) else {
            return Value::Null;
        };
        (bits, n) = ((bits << 6) | v as u32, n + 6);
        if n >= 8 {
            n -= 8;
            out.push((bits >> n) as u8);
        }
    }
    serde_json::from_slice(&out).unwrap_or(Value::Null)
}

/// Records a JWT's header, claim names, username and auth revision; its
/// `exp` (not recorded) is expected ~5 minutes ahead.
fn record_jwt(t: &mut Transcript, label: &str, tok: &str) {
    let names = |v: &Value| {
        let o = v.as_object().into_iter().flat_map(|o| o.keys().cloned());
        let mut k: Vec<String> = o.collect();
        k.sort();
        k
    };
    let mut parts = tok.split('.').map(jwt_part);
    let h = parts.next().unwrap_or_default();
    let p = parts.next().unwrap_or_default();
    let header = format!("{:?} alg={} typ={}", names(&h), h["alg"], h["typ"]);
    let want = r#"["alg", "typ"] alg="RS256""#;
    t.want(&format!("{label}: header"), header, want);
    let (user, rev) = (&p["username"], &p["revision"]);
    let claims = format!("{:?} username={user} revision={rev}", names(&p));
    let want = r#"["exp", "revision", "username"] username="bob""#;
    t.want(&format!("{label}: claims"), claims, want);
    let now = SystemTime::now().duration_since(UNIX_EPOCH);
    let ttl = p["exp"].as_i64().unwrap_or(0) - now.map_or(0, |d| d.as_secs() as i64);
    if !(280..=310).contains(&ttl) {
        let v = format!("{label}: exp is {ttl}s ahead, not ~5 minutes");
        t.violations.push(v);
    }
}

/// Starts a lone member of `flavor` with `flags` (own temp data dir and
/// ports): `refused` when it exits non-zero, `serves` once it answers
/// Status; then kills it by PID.
async fn probe_start(flavor: Flavor, flags: &[&str]) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = |p: u16| format!("http://127.0.0.1:{p}");
    let (c, p) = (url(free_port()), url(free_port()));
    let args = format!(
        "--name p0 --listen-client-urls {c} --advertise-client-urls {c} \
        --listen-peer-urls {p} --initial-advertise-peer-urls {p} --initial-cluster p0={p}"
    );
    let mut cmd = Command::new(flavor.binary());
    cmd.args(args.split_whitespace())
        .arg("--data-dir")
        .arg(dir.path().join("p0.etcd"))
        .args(flags);
    let mut server = Process::spawn(&mut cmd, &dir.path().join("log")).expect("spawn server");
    let status = || async {
        let mut m = MaintenanceClient::connect(c.clone()).await.ok()?;
        m.status(StatusRequest {}).await.ok()
    };
    let every = Duration::from_millis(100);
    let seen = retry_until(Duration::from_secs(20), every, async || {
        if let Some(st) = server.try_exit() {
            let out = if st.success() { "exited 0" } else { "refused" };
            return Ok((out, st.to_string()));
        }
        let serves = tokio::time::timeout(Duration::from_millis(500), status()).await;
        match serves {
            Ok(Some(_)) => Ok(("serves", String::new())),
            _ => Err(()),
        }
    })
    .await;
    let (out, code) = seen.unwrap_or(("neither exits nor serves within 20s", String::new()));
    server.kill();
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap_or_default();
    let tail = log.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("");
    let name = flavor.name();
    eprintln!("{name} start {flags:?}: {out} {code}; log ends: {tail}");
    out.to_string()
}

/// Start flags, `=> serves|refused`; PUB and PRIV stand for the key files.
const PROBES: &str = "--auth-token simple => serves
    --auth-token jwt,pub-key=PUB,priv-key=PRIV,sign-method=RS256,ttl=5m => serves
    --auth-token bogus => refused
    --auth-token jwt,sign-method=RS256 => refused
    --auth-token jwt,pub-key=PUB,priv-key=PRIV,sign-method=BOGUS => refused
    --auth-token jwt,pub-key=PUB.no,priv-key=PRIV.no,sign-method=RS256 => refused
    --bcrypt-cost 100 => serves
    --auth-token= => serves";

/// After SETUP with `--auth-token jwt,…`, restarted: the same JWT works;
/// a forged or an unsigned one claiming root is invalid; a JWT of an older
/// auth revision is refused.
const JWT: &str = r#"0 @jwt range app/ => ok rev=2 ["app/a"]
    0 @jwt put app/b => ok rev=3
    RESTART
    0 @jwt range app/ => ok rev=3 ["app/a", "app/b"]
    0 --user=bob:bobpw get app/ --prefix --keys-only => 0 app/b
    0 @forged range '' => err Unauthenticated "etcdserver: invalid auth token"
    0 @unsigned range '' => err Unauthenticated "etcdserver: invalid auth token"
    0 --user=root:rootpw role grant-permission app read zzz
    0 @jwt range app/ => err InvalidArgument "etcdserver: revision of auth store is old""#;

async fn jwt_scenario(flavor: Flavor) -> Transcript {
    let mut t = Transcript::new(flavor);
    let dir = tempfile::tempdir().expect("temp dir");
    let path = |f: &str| dir.path().join(f).display().to_string();
    let (public, private) = (&path("pub.pem"), &path("priv.pem"));
    for args in [
        &["genrsa", "-out", private, "2048"][..],
        &["rsa", "-in", private, "-pubout", "-out", public],
    ] {
        let out = Command::new("openssl").args(args).output();
        assert!(out.is_ok_and(|o| o.status.success()), "openssl {args:?}");
    }
    let keys = |s: &str| s.replace("PUB", public).replace("PRIV", private);
    for line in PROBES.lines().map(str::trim) {
        let (flags, want) = line.split_once(" => ").expect("PROBES");
        let real = keys(flags);
        let out = probe_start(flavor, &real.split(' ').collect::<Vec<_>>()).await;
        t.want(&format!("start with {flags}"), out, want);
    }

    let jwt = keys("jwt,pub-key=PUB,priv-key=PRIV,sign-method=RS256,ttl=5m");
    let mut c = match Cluster::start(flavor, 1, &["--auth-token", &jwt]).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{}: start with --auth-token {jwt}: {e:#}", flavor.name());
            t.push("start 1 node with --auth-token jwt,… => failed".into());
            return t;
        }
    };
    let eps = c.endpoints();
    t.run(&eps, &[], SETUP).await;
    let tok = bob_token(&mut t, "authenticate bob", &eps[0], "token of 3").await;
    record_jwt(&mut t, "bob's JWT", &tok);
    // Claims the signature does not cover ({"exp":4102444800,"revision":8,
    // "username":"root"}) under bob's header and signature; unsigned (alg none).
    let root = "eyJleHAiOjQxMDI0NDQ4MDAsInJldmlzaW9uIjo4LCJ1c2VybmFtZSI6InJvb3QifQ";
    let parts: Vec<&str> = tok.split('.').chain(["", "", ""]).take(3).collect();
    let forged = format!("{}.{root}.{}", parts[0], parts[2]);
    let unsigned = format!("eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.{root}.");
    let toks = [("jwt", &*tok), ("forged", &forged), ("unsigned", &unsigned)];
    let (before, after) = JWT.split_once("RESTART").expect("JWT");
    t.run(&eps, &toks, before).await;
    restart(&mut c).await;
    t.run(&eps, &toks, after).await;
    let tok = bob_token(&mut t, "authenticate bob again", &eps[0], "token of 3").await;
    record_jwt(&mut t, "bob's new JWT", &tok);
    let new = [("new", tok.as_str())];
    t.run(&eps, &new, "0 @new range app/ => ok rev=3").await;
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_tokens_same_as_etcd() {
    same_as_etcd(LIMIT, jwt_scenario, compare).await;
}

/// `--auth-token=''` (etcd's tokenNop): auth can be enabled, but no one
/// gets a token, and no token is valid.
const NOP: &str = r#"0 user add root:rootpw => 0 User root created
    0 auth enable => 0 Authentication Enabled
    0 --user=root:rootpw get k => 2 authentication failed, invalid user ID or password
    0 --user=root:bad get k => 2 authentication failed, invalid user ID or password
    0 --user=nosuch:pw get k => 2 authentication failed, invalid user ID or password
    0 get k => 1 user name is empty
    0 @any range k => err Unauthenticated "etcdserver: invalid auth token"
    0 --user=root:rootpw auth disable => 2 authentication failed, invalid user ID or password"#;

async fn nop_scenario(flavor: Flavor) -> Transcript {
    let mut t = Transcript::new(flavor);
    let c = Cluster::start(flavor, 1, &["--auth-token="])
        .await
        .expect("start with --auth-token=''");
    t.run(&c.endpoints(), &[("any", "abcdefghijklmnop.1")], NOP)
        .await;
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nop_token_provider_same_as_etcd() {
    same_as_etcd(LIMIT, nop_scenario, compare).await;
}
