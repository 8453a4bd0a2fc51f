//! TLS on the client and peer ports, with etcd's flags (`--cert-file`,
//! `--key-file`, `--client-cert-auth`, `--trusted-ca-file` and the
//! `--peer-*` ones). Certificates are made with the `openssl` CLI in a temp
//! dir: a CA, a server certificate (SAN 127.0.0.1 and localhost, for server
//! and client auth: etcd dials its peers with it), a client certificate,
//! and a second CA with a client certificate that must be refused. The
//! harness's `Cluster` builds `http://` URLs only, so [`Nodes`] starts the
//! members with `https://` URLs itself.
//!
//! Each scenario (a script, see [`Transcript::run`]) runs on real etcd (the
//! reference) and on the selected flavour (retcd by default;
//! `RETCD_TEST_FLAVOR=etcd` for a second etcd), and the two transcripts
//! must be equal, line by line; whether each step succeeds or fails is also
//! checked on etcd's side. A failure is recorded by its exit code only: TLS
//! error texts are the client's and depend on timing (they are printed as
//! side lines). The v3lock `Lock` RPC is called directly (tonic over TLS):
//! etcd serves it through a client of itself, which in retcd dials its own
//! `https://` client URL (`etcdctl lock` runs the recipe client-side).

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use retcd_api::v3lockpb::{lock_client::LockClient, LockRequest, UnlockRequest};
use retcd_launch::{initial_cluster, MemberFlags, Process};
use retcd_tests::normalize::{normalize_output, normalize_text};
use retcd_tests::{assert_same_lines, etcdctl, free_port, test_flavor, Flavor, Output};
use tempfile::TempDir;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// Makes the certificates (see the module documentation) in the current dir.
const MAKE_CERTS: &str = r#"set -e
ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
for ca in ca ca2; do
  openssl req -x509 $ec -days 2 -keyout $ca.key -out $ca.crt -subj /CN=test-$ca \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
done
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' \
  > server.ext
printf 'extendedKeyUsage=clientAuth\n' > client.ext
leaf() {
  openssl req -new $ec -keyout $1.key -out $1.csr -subj /CN=$1
  openssl x509 -req -in $1.csr -CA $2.crt -CAkey $2.key -set_serial $4 -days 2 -out $1.crt \
    -extfile $3
}
leaf server ca server.ext 2
leaf client ca client.ext 3
leaf client2 ca2 client.ext 4
"#;

/// The certificates of one test, in a temp dir.
struct Certs(TempDir);

impl Certs {
    fn new() -> Certs {
        let (dir, mut sh) = (tempfile::tempdir().unwrap(), Command::new("sh"));
        let out = sh.args(["-c", MAKE_CERTS]).current_dir(dir.path()).output();
        let out = out.expect("run sh");
        assert!(out.status.success(), "openssl: {out:?}");
        Certs(dir)
    }

    /// `s` with `{D}` replaced by the certificates' dir.
    fn fill(&self, s: &str) -> String {
        s.replace("{D}", &format!("{}/", self.0.path().display()))
    }

    /// etcdctl's (and curl's) TLS flags for a script's TLS word: `none`;
    /// `ca` (`--cacert`); else `--cacert` and the certificate of that name.
    fn tls(&self, name: &str) -> String {
        let id = format!(" --cert {{D}}{name}.crt --key {{D}}{name}.key");
        match name {
            "none" => String::new(),
            "ca" => self.fill("--cacert {D}ca.crt"),
            _ => self.fill(&format!("--cacert {{D}}ca.crt{id}")),
        }
    }
}

/// Splits at whitespace (no argument here contains a space).
fn w(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

/// A started member: its process, client URL and peer URL.
struct Member(Process, String, String);

/// Members started with `https://` (or `http://`) URLs; SIGKILLed by PID
/// and reaped on drop (after printing their logs when panicking).
struct Nodes {
    dir: TempDir,
    m: Vec<Member>,
}

impl Nodes {
    /// Starts members of `flavor` as `spec` says, `N CS PS [FLAGS]`: N
    /// members, client URLs `CS://…` and peer URLs `PS://…` on free
    /// loopback ports, plus FLAGS.
    fn spawn(flavor: Flavor, spec: &str) -> Nodes {
        let [n, cs, ps, extra] = [0, 1, 2, 3].map(|i| spec.splitn(4, ' ').nth(i).unwrap_or(""));
        let (n, dir) = (n.parse().unwrap(), tempfile::tempdir().unwrap());
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let url = |s: &str, p: u16| format!("{s}://127.0.0.1:{p}");
        let ic = initial_cluster(
            (ports.iter().enumerate()).map(|(i, (_, p))| (format!("m{i}"), url(ps, *p))),
        );
        let token = format!("tls-{}", ports[0].0);
        let mut m = Vec::new();
        for (i, (c, p)) in ports.into_iter().enumerate() {
            let (name, data_dir) = (format!("m{i}"), dir.path().join(format!("m{i}.etcd")));
            let (curl, purl) = (url(cs, c), url(ps, p));
            let flags = MemberFlags {
                name: &name,
                data_dir: &data_dir,
                client_url: &curl,
                peer_url: &purl,
                advertise_peer_url: &purl,
                initial_cluster: &ic,
                token: &token,
                state: "new",
            };
            let mut cmd = Command::new(flavor.binary());
            cmd.args(flags.args()).args(w(extra));
            let log = dir.path().join(format!("m{i}.log"));
            let p = Process::spawn(&mut cmd, &log).expect("start server");
            m.push(Member(p, curl, purl));
        }
        Nodes { dir, m }
    }

    fn log(&self, i: usize) -> String {
        let path = self.dir.path().join(format!("m{i}.log"));
        std::fs::read_to_string(path).unwrap_or_default()
    }

    /// Waits (at most 60 s) until every member answers `endpoint health`
    /// through etcdctl with the TLS flags `tls`.
    fn wait_ready(&mut self, tls: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        for i in 0..self.m.len() {
            loop {
                let o = ctl(&[self.m[i].1.clone()], tls, "endpoint health");
                if o.success() {
                    break;
                }
                let exited = self.m[i].0.try_exit();
                let fine = exited.is_none() && Instant::now() < deadline;
                assert!(fine, "m{i} not ready ({exited:?}): {o:?}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }

    /// Whether member 0 exits by itself within `limit`, and with what code.
    fn exit_within(&mut self, limit: Duration) -> String {
        match self.m[0].0.wait_exit(limit) {
            Some(st) => format!("exited code={:?}", st.code()),
            None => format!("still running after {limit:?}"),
        }
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for m in self.m.iter_mut() {
            m.0.kill();
        }
        for i in (0..self.m.len()).filter(|_| std::thread::panicking()) {
            let log = self.log(i);
            let tail = log.char_indices().rev().nth(3000).map_or(0, |(p, _)| p);
            eprintln!("----- m{i} log tail:\n{}", &log[tail..]);
        }
    }
}

/// etcdctl 3.4 (the harness's: bounded, 2 s dial, 5 s command timeout).
fn ctl(eps: &[String], tls: &str, args: &str) -> Output {
    let all = w(&format!("{tls} {args}"));
    etcdctl(eps, &all.iter().map(String::as_str).collect::<Vec<_>>())
}

/// Masks what differs for no reason: ports, `took = …`, the first field of
/// `member list` lines (the ID) when `mask_first` is set; sorts the lines
/// (`endpoint health` answers in completion order).
fn norm(s: &str, mask_first: bool) -> String {
    let line = |l: &str| {
        let l = normalize_text(l);
        let took = l
            .split_once("took = ")
            .map(|(h, _)| format!("{h}took = <t>"));
        let l = took.unwrap_or(l);
        match l.split_once(", ") {
            Some((_, rest)) if mask_first => format!("<ID>, {rest}"),
            _ => l,
        }
    };
    let mut lines: Vec<String> = s.trim().lines().map(line).collect();
    lines.sort();
    lines.join("\n")
}

/// `endpoint status -w json` summarised: each endpoint, whether it knows a
/// leader and its revision; how many are leader themselves; whether all agree.
fn status_summary(o: &Output) -> String {
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap_or_default();
    let (mut parts, mut leaders, mut selves) = (Vec::new(), BTreeSet::new(), 0);
    for e in v.as_array().into_iter().flatten() {
        let st = &e["Status"];
        let ep = normalize_text(e["Endpoint"].as_str().unwrap_or("?"));
        let leader = st["leader"].as_u64().unwrap_or(0);
        selves += usize::from(Some(leader) == st["header"]["member_id"].as_u64());
        leaders.insert(leader);
        let rev = &st["header"]["revision"];
        parts.push(format!("{ep} has_leader={} rev={rev}", leader != 0));
    }
    let agree = leaders.len() == 1 && !leaders.contains(&0);
    let parts = parts.join("; ");
    format!("[{}] {parts} self_leaders={selves} agree={agree}", o.code)
}

/// The v3lock `Lock` RPC (no lease: the server makes a session) then
/// `Unlock`, over TLS trusting the CA, with the certificate `id` (`ca`:
/// none) as client identity.
fn lock_rpc(ep: &str, c: &Certs, id: &str) -> String {
    let read = |f: String| std::fs::read(c.fill(&format!("{{D}}{f}"))).unwrap();
    let ca = Certificate::from_pem(read("ca.crt".into()));
    let mut tls = ClientTlsConfig::new().ca_certificate(ca);
    if id != "ca" {
        let (crt, key) = (read(format!("{id}.crt")), read(format!("{id}.key")));
        tls = tls.identity(Identity::from_pem(crt, key));
    }
    let ep = Endpoint::from_shared(ep.to_string()).unwrap();
    let ep = ep.tls_config(tls).unwrap().timeout(Duration::from_secs(10));
    let ep = ep.connect_timeout(Duration::from_secs(2));
    let r = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let ch = ep.connect().await.map_err(|e| format!("connect: {e}"))?;
        let mut lc = LockClient::new(ch);
        let status = |s: tonic::Status| format!("{:?} {:?}", s.code(), s.message());
        let name = b"job".to_vec();
        let lock = lc.lock(LockRequest { name, lease: 0 }).await;
        let key = lock.map_err(status)?.into_inner().key;
        let shown = String::from_utf8_lossy(&key).to_string();
        let masked = shown.split_once('/').map(|(p, _)| format!("{p}/<lease>"));
        lc.unlock(UnlockRequest { key }).await.map_err(status)?;
        Ok::<_, String>(format!("key={} unlocked", masked.unwrap_or(shown)))
    });
    r.map_or_else(|e| format!("err {e}"), |s| format!("ok {s}"))
}

/// What one flavour showed: compared lines, side lines (printed only) and
/// expectations that did not hold.
#[derive(Default)]
struct Transcript {
    lines: Vec<String>,
    side: Vec<String>,
    bad: Vec<String>,
}

impl Transcript {
    /// Records `line`; `ok` must equal `want_ok`.
    fn push(&mut self, line: String, ok: bool, want_ok: bool) {
        if ok != want_ok {
            let want = if want_ok { "success" } else { "failure" };
            self.bad.push(format!("expected {want}: {line}"));
        }
        self.lines.push(line);
    }

    /// Runs a script on `flavor`, one step a line. `start TLS SPEC` starts
    /// members ([`Nodes::spawn`]; `{D}` is the certificates' dir) and waits
    /// until they answer etcdctl with TLS. Other steps are
    /// `KIND TLS @TARGET [ARGS] => ok|fail`. TLS: see [`Certs::tls`].
    /// TARGET: `all`, `N` (member N's client URL), `httpN` (the same with
    /// `http://`), `peerN` (its peer URL). KIND: `ctl` (etcdctl ARGS; `ctl*`
    /// first retries for up to 10 s until it prints something), `status`
    /// (`endpoint status`, summarised), `lock` ([`lock_rpc`]), `curl`
    /// (TARGET + ARGS as the URL).
    fn run(&mut self, flavor: Flavor, c: &Certs, script: &str) {
        let mut nodes = None;
        for step in script.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if let Some((tls, spec)) = step.strip_prefix("start ").and_then(|s| s.split_once(' ')) {
                let n = nodes.insert(Nodes::spawn(flavor, &c.fill(spec)));
                n.wait_ready(&c.tls(tls));
                continue;
            }
            let n: &Nodes = nodes.as_ref().expect("start first");
            let (cmd, want) = step.split_once(" => ").expect("step => ok|fail");
            let want_ok = want == "ok";
            let mut words = cmd.splitn(4, ' ').chain([""; 4]);
            let (kind, id) = (words.next().unwrap(), words.next().unwrap());
            let (target, args) = (words.next().unwrap(), words.next().unwrap());
            let tls = c.tls(id);
            let digits = target.trim_start_matches(|c: char| !c.is_ascii_digit());
            let i = digits.parse::<usize>().unwrap_or(0);
            let eps = match target.trim_end_matches(|c: char| c.is_ascii_digit()) {
                "@all" => n.m.iter().map(|m| m.1.clone()).collect(),
                "@http" => vec![n.m[i].1.replacen("https:", "http:", 1)],
                "@peer" => vec![n.m[i].2.clone()],
                _ => vec![n.m[i].1.clone()],
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            let pending = || ctl(&eps, &tls, args).stdout.trim().is_empty();
            while kind == "ctl*" && pending() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            let (line, ok) = match kind {
                "ctl" | "ctl*" => {
                    let o = normalize_output(&ctl(&eps, &tls, args));
                    let so = norm(&o.stdout, args.starts_with("member"));
                    let se = norm(&o.stderr, false);
                    let full = format!("{step}: [{}] {so:?} {se:?}", o.code);
                    let short = format!("{step}: exit {}", o.code);
                    if !want_ok {
                        self.side.push(format!("{step}: stderr {se:?}"));
                    }
                    (if want_ok { full } else { short }, o.success())
                }
                "status" => {
                    let o = ctl(&eps, &tls, "endpoint status -w json");
                    (format!("{step}: {}", status_summary(&o)), o.success())
                }
                "lock" => {
                    let r = lock_rpc(&eps[0], c, id);
                    let shown = if want_ok { r.as_str() } else { &r[..3] };
                    (format!("{step}: {shown}"), r.starts_with("ok"))
                }
                "curl" => match curl(&format!("{tls} {}{args}", eps[0])) {
                    None => panic!("curl is needed (scripts/test.sh installs it)"),
                    Some((code, body)) => {
                        // Exit codes of refused TLS handshakes depend on timing.
                        self.side.push(format!("{step}: curl exit {code}"));
                        // The `health` field only: etcd 3.4 answers
                        // `{"health":"true"}`, 3.5 (and retcd, which
                        // speaks 3.5) adds `"reason":""`.
                        let shown = match serde_json::from_str::<serde_json::Value>(&body) {
                            Ok(v) if want_ok => format!("health={}", v["health"]),
                            _ if want_ok => body,
                            _ => String::new(),
                        };
                        (format!("{step}: {} {shown:?}", code == 0), code == 0)
                    }
                },
                _ => panic!("unknown step {step}"),
            };
            self.push(line, ok, want_ok);
        }
    }
}

/// `curl -sS --max-time 5 ARGS`: `(exit code, body)`; None without curl.
fn curl(args: &str) -> Option<(i32, String)> {
    let args = w(&format!("-sS --max-time 5 {args}"));
    let out = Command::new("curl").args(args).output().ok()?;
    let body = String::from_utf8_lossy(&out.stdout).into_owned();
    Some((out.status.code().unwrap_or(-1), body))
}

/// Prints etcd's transcript, checks its expectations, asserts equality.
fn compare(want: &Transcript, got: &Transcript, name: &str) {
    want.side.iter().for_each(|l| eprintln!("etcd (side): {l}"));
    got.side
        .iter()
        .for_each(|l| eprintln!("{name} (side): {l}"));
    assert_same_lines(&want.lines, &want.bad, &got.lines, &got.bad, name);
}

/// Runs `scenario` (a script, or a function) on etcd, then on the
/// selected flavour; compares.
fn same_as_etcd(scenario: impl Fn(Flavor, &Certs) -> Transcript) {
    let certs = Certs::new();
    let want = scenario(Flavor::Etcd, &certs);
    let flavor = test_flavor();
    compare(&want, &scenario(flavor, &certs), flavor.name());
}

fn script(s: &'static str) -> impl Fn(Flavor, &Certs) -> Transcript {
    move |flavor, c| {
        let mut t = Transcript::default();
        t.run(flavor, c, s);
        t
    }
}

/// `https://` client URL without client certificate auth; peers plain.
#[test]
fn client_tls_same_as_etcd() {
    same_as_etcd(script(
        "start ca 1 https http --cert-file {D}server.crt --key-file {D}server.key
        ctl ca @all put k v => ok
        ctl ca @all get k => ok
        status ca @all => ok
        ctl ca @all endpoint health => ok
        ctl ca @all lock job -- echo ran-under-lock => ok
        lock ca @0 => ok
        ctl none @all get k => fail
        ctl none @http0 get k => fail
        curl ca @0 /health => ok
        curl none @0 /health => fail
        curl none @http0 /health => fail",
    ));
}

/// `--client-cert-auth --trusted-ca-file`: only certificates of the CA.
/// `server`'s certificate has clientAuth too (etcd dials with it);
/// `client2` is signed by the other CA; `ca` presents no certificate.
#[test]
fn client_cert_auth_same_as_etcd() {
    same_as_etcd(script(
        "start client 1 https http --cert-file {D}server.crt --key-file {D}server.key \
            --client-cert-auth --trusted-ca-file {D}ca.crt
        ctl client @all put k v => ok
        ctl client @all get k => ok
        ctl client @all endpoint health => ok
        ctl client @all lock job -- echo ran-under-lock => ok
        lock client @0 => ok
        ctl server @all get k => ok
        lock ca @0 => fail
        ctl ca @all get k => fail
        ctl client2 @all get k => fail
        curl client @0 /health => ok
        curl ca @0 /health => fail
        curl client2 @0 /health => fail",
    ));
}

/// With `--client-cert-auth` and auth enabled, a request without a token
/// acts as its certificate's common name (`client`), also through the
/// Lock service (retcd's runs etcd's recipe through a connection to its
/// own client port, which carries the caller's identity). The data key
/// stays outside the lock's prefix `job/`: a key there would own the lock.
#[test]
fn client_cert_common_name_is_the_user_same_as_etcd() {
    same_as_etcd(script(
        "start client 1 https http --cert-file {D}server.crt --key-file {D}server.key \
            --client-cert-auth --trusted-ca-file {D}ca.crt
        ctl client @all user add root:rootpw => ok
        ctl client @all user add client:pw => ok
        ctl client @all role add jobs => ok
        ctl client @all role grant-permission jobs --prefix=true readwrite job => ok
        ctl client @all user grant-role client jobs => ok
        ctl client @all auth enable => ok
        ctl client @all put jobdata v => ok
        ctl client @all get jobdata => ok
        ctl client @all put k v => fail
        lock client @0 => ok
        ctl client @all --user=root:rootpw role revoke-permission jobs job --prefix=true => ok
        lock client @0 => fail
        ctl client @all put jobdata w => fail",
    ));
}

/// 3 members, `https://` peer URLs with `--peer-client-cert-auth`.
/// Serializable reads on the followers retry until the put has replicated.
/// The peer port refuses TLS clients without a certificate of the peer CA
/// (were it not to, curl would get an HTTP answer: exit 0).
#[test]
fn peer_tls_three_members_same_as_etcd() {
    same_as_etcd(script(
        "start none 3 http https --peer-cert-file {D}server.crt \
            --peer-key-file {D}server.key --peer-client-cert-auth \
            --peer-trusted-ca-file {D}ca.crt
        status none @all => ok
        ctl none @0 put rk rv => ok
        ctl* none @1 get rk --consistency=s => ok
        ctl* none @2 get rk --consistency=s => ok
        ctl none @all member list => ok
        ctl none @all endpoint health => ok
        status none @all => ok
        curl ca @peer0 /members => fail
        curl client2 @peer0 /members => fail",
    ));
}

/// An `https://` client (then peer) URL without its certificate flags.
#[test]
fn https_url_without_cert_same_as_etcd() {
    same_as_etcd(|flavor, _| {
        let mut t = Transcript::default();
        for (what, cs, ps) in [("client", "https", "http"), ("peer", "http", "https")] {
            let mut n = Nodes::spawn(flavor, &format!("1 {cs} {ps}"));
            let r = n.exit_within(Duration::from_secs(10));
            let last = n.log(0).trim().lines().last().map(String::from);
            t.side.push(format!("{what}: last log line {last:?}"));
            let failed = r.starts_with("exited") && r != "exited code=Some(0)";
            let line = format!("https {what} URL without a certificate => {r}");
            t.push(line, failed, true);
        }
        t
    });
}
