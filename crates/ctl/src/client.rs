//! Connecting the way etcdctl's clientv3 does, and its errors.
//!
//! The gRPC connection is a tonic channel with our own connector (TCP, or
//! rustls with etcdctl's TLS options incl. `--insecure-skip-tls-verify`),
//! handed to `etcd-client` (`Client::from_channel`). Like grpc-go with
//! clientv3's wait-for-ready calls, a refused connection is retried until
//! the command's deadline, then reported as etcdctl reports it: the retry
//! interceptor's warn line on stderr, and `Error: context deadline exceeded`.

use std::future::Future;
use std::net::ToSocketAddrs;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use etcd_client::{Client, ConnectOptions};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::rustls;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::gofmt;

pub const EXIT_ERROR: i32 = 1;
pub const EXIT_BAD_CONNECTION: i32 = 2;
pub const EXIT_INVALID_INPUT: i32 = 3;
pub const EXIT_BAD_FEATURE: i32 = 4;
pub const EXIT_INTERRUPTED: i32 = 5;
#[allow(dead_code)] // etcdctl's code table
pub const EXIT_IO: i32 = 6;
pub const EXIT_BAD_ARGS: i32 = 128;

/// How etcdctl ends: `Error: <msg>` on stderr (unless `msg` is empty) and
/// the exit code.
#[derive(Debug, Clone)]
pub struct Exit {
    pub code: i32,
    pub msg: String,
}

impl Exit {
    pub fn new(code: i32, msg: impl Into<String>) -> Exit {
        Exit {
            code,
            msg: msg.into(),
        }
    }

    /// Exit with `code` and print nothing more.
    pub fn silent(code: i32) -> Exit {
        Exit {
            code,
            msg: String::new(),
        }
    }
}

/// Global flags that shape the connection.
#[derive(Clone, Debug, Default)]
pub struct ConnConf {
    pub endpoints: Vec<String>,
    pub dial_timeout: Duration,
    pub keepalive_time: Duration,
    pub keepalive_timeout: Duration,
    pub insecure_transport: bool,
    pub insecure_skip_verify: bool,
    pub cert: String,
    pub key: String,
    pub cacert: String,
    pub server_name: String,
    pub user: Option<(String, String)>,
}

/// A connected client.
#[derive(Clone)]
pub struct Conn {
    pub client: Client,
    pub channel: Channel,
    /// The auth token (for the RPCs etcd-client does not have).
    pub token: Option<String>,
    /// The `target` etcdctl's log lines name.
    pub target: String,
    /// The endpoint this connection went to.
    pub endpoint: String,
}

/// An RPC failure as clientv3 returns it.
#[derive(Debug, Clone)]
pub struct RpcError {
    /// gRPC code name as grpc-go spells it (`OutOfRange`).
    pub code: &'static str,
    pub desc: String,
}

impl RpcError {
    /// `rpc error: code = X desc = Y`.
    pub fn grpc_string(&self) -> String {
        format!("rpc error: code = {} desc = {}", self.code, self.desc)
    }

    /// What `err.Error()` is after clientv3's `toErr`: etcd's own errors
    /// are their message, everything else the full gRPC text; deadlines
    /// are `context deadline exceeded`.
    pub fn message(&self) -> String {
        if self.code == "DeadlineExceeded" && self.desc == "context deadline exceeded" {
            return self.desc.clone();
        }
        if self.code == "Canceled" && self.desc == "context canceled" {
            return self.desc.clone();
        }
        if ETCD_ERRORS.contains(&self.desc.as_str()) {
            return self.desc.clone();
        }
        self.grpc_string()
    }

    pub fn deadline() -> RpcError {
        RpcError {
            code: "DeadlineExceeded",
            desc: "context deadline exceeded".into(),
        }
    }
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message())
    }
}

/// etcd's `rpctypes` error strings (clientv3 turns these into plain errors).
const ETCD_ERRORS: &[&str] = &[
    "etcdserver: Peer URLs already exists",
    "etcdserver: authentication failed, invalid user ID or password",
    "etcdserver: authentication is not enabled",
    "etcdserver: bad leader transferee",
    "etcdserver: can only promote a learner member which is in sync with leader",
    "etcdserver: can only promote a learner member",
    "etcdserver: cluster has a downgrade job in progress",
    "etcdserver: cluster version not found during downgrade",
    "etcdserver: context deadline exceeded",
    "etcdserver: corrupt cluster",
    "etcdserver: duplicate key given in txn request",
    "etcdserver: given member URLs are invalid",
    "etcdserver: invalid auth management",
    "etcdserver: invalid auth token",
    "etcdserver: invalid downgrade target version",
    "etcdserver: key is not provided",
    "etcdserver: key not found",
    "etcdserver: leader changed",
    "etcdserver: lease already exists",
    "etcdserver: lease is provided",
    "etcdserver: member ID already exist",
    "etcdserver: member not found",
    "etcdserver: mvcc: database space exceeded",
    "etcdserver: mvcc: required revision has been compacted",
    "etcdserver: mvcc: required revision is a future revision",
    "etcdserver: no inflight downgrade job",
    "etcdserver: no leader",
    "etcdserver: not capable",
    "etcdserver: not leader",
    "etcdserver: permission denied",
    "etcdserver: permission is not granted to the role",
    "etcdserver: permission not given",
    "etcdserver: re-configuration failed due to not enough started members",
    "etcdserver: request canceled",
    "etcdserver: request is too large",
    "etcdserver: request timed out",
    "etcdserver: request timed out, possibly due to connection lost",
    "etcdserver: request timed out, possibly due to previous leader failure",
    "etcdserver: requested lease not found",
    "etcdserver: role is not granted to the user",
    "etcdserver: role name already exists",
    "etcdserver: role name is empty",
    "etcdserver: role name not found",
    "etcdserver: root user does not exist",
    "etcdserver: root user does not have root role",
    "etcdserver: rpc not supported for learner",
    "etcdserver: server stopped",
    "etcdserver: too large lease TTL",
    "etcdserver: too many learner members in cluster",
    "etcdserver: too many operations in txn request",
    "etcdserver: too many requests",
    "etcdserver: unhealthy cluster",
    "etcdserver: user name already exists",
    "etcdserver: user name is empty",
    "etcdserver: user name not found",
    "etcdserver: value is provided",
    "etcdserver: watch canceled",
    "etcdserver: wrong downgrade target version format",
];

/// grpc-go's name of a status code.
pub fn code_name(c: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match c {
        Ok => "OK",
        Cancelled => "Canceled",
        Unknown => "Unknown",
        InvalidArgument => "InvalidArgument",
        DeadlineExceeded => "DeadlineExceeded",
        NotFound => "NotFound",
        AlreadyExists => "AlreadyExists",
        PermissionDenied => "PermissionDenied",
        ResourceExhausted => "ResourceExhausted",
        FailedPrecondition => "FailedPrecondition",
        Aborted => "Aborted",
        OutOfRange => "OutOfRange",
        Unimplemented => "Unimplemented",
        Internal => "Internal",
        Unavailable => "Unavailable",
        DataLoss => "DataLoss",
        Unauthenticated => "Unauthenticated",
    }
}

impl From<etcd_client::Error> for RpcError {
    fn from(e: etcd_client::Error) -> RpcError {
        match e {
            etcd_client::Error::GRpcStatus(s) => RpcError::from(s),
            etcd_client::Error::TransportError(t) => RpcError {
                code: "Unavailable",
                desc: format!("connection error: desc = \"transport: {t}\""),
            },
            other => RpcError {
                code: "Unknown",
                desc: other.to_string(),
            },
        }
    }
}

impl From<tonic::Status> for RpcError {
    fn from(s: tonic::Status) -> RpcError {
        RpcError {
            code: code_name(s.code()),
            desc: s.message().to_string(),
        }
    }
}

/// UTC `2006-01-02T15:04:05.000Z`, zap's production timestamp here.
pub fn zap_ts() -> String {
    let d = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (y, mo, da) = civil(secs.div_euclid(86400));
    let s = secs.rem_euclid(86400);
    format!(
        "{y:04}-{mo:02}-{da:02}T{:02}:{:02}:{:02}.{:03}Z",
        s / 3600,
        s / 60 % 60,
        s % 60,
        d.subsec_millis()
    )
}

fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z.rem_euclid(146097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// A JSON string for a zap log field.
pub fn zap_str(s: &str) -> String {
    let mut out = String::new();
    gofmt::json_string(&mut out, &crate::raw::bytes(s));
    out.replace("\\u003c", "<")
        .replace("\\u003e", ">")
        .replace("\\u0026", "&")
}

/// The retry interceptor's warn line for a failed unary call.
pub fn log_unary_failure(target: &str, e: &RpcError) {
    eprintln!(
        "{{\"level\":\"warn\",\"ts\":\"{}\",\"logger\":\"etcd-client\",\"caller\":\"v3/retry_interceptor.go:62\",\"msg\":\"retrying of unary invoker failed\",\"target\":{},\"attempt\":0,\"error\":{}}}",
        zap_ts(),
        zap_str(target),
        zap_str(&e.grpc_string())
    );
}

/// zap's production epoch timestamp (`1796187170.8871295`).
fn zap_epoch() -> String {
    let d = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    format!("{}.{:07}", d.as_secs(), d.subsec_nanos() / 100)
}

/// A zap warn line (the flags logger: epoch timestamps) with string fields.
pub fn log_warn(caller: &str, msg: &str, fields: &[(&str, &str)]) {
    log_epoch("warn", None, caller, msg, fields);
}

/// A zap line with an epoch timestamp (the production and flags loggers)
/// and string fields.
fn log_epoch(level: &str, logger: Option<&str>, caller: &str, msg: &str, fields: &[(&str, &str)]) {
    let mut s = format!("{{\"level\":\"{level}\",\"ts\":{}", zap_epoch());
    if let Some(l) = logger {
        s.push_str(&format!(",\"logger\":{}", zap_str(l)));
    }
    s.push_str(&format!(
        ",\"caller\":{},\"msg\":{}",
        zap_str(caller),
        zap_str(msg)
    ));
    for (k, v) in fields {
        s.push_str(&format!(",{}:{}", zap_str(k), zap_str(v)));
    }
    s.push('}');
    eprintln!("{s}");
}

/// The scheme-less `host:port` of an endpoint and whether it asks for TLS.
fn split_endpoint(ep: &str) -> (String, Option<bool>) {
    if let Some(r) = ep.strip_prefix("https://") {
        (r.trim_end_matches('/').to_string(), Some(true))
    } else if let Some(r) = ep.strip_prefix("http://") {
        (r.trim_end_matches('/').to_string(), Some(false))
    } else if let Some(r) = ep
        .strip_prefix("unix://")
        .or_else(|| ep.strip_prefix("unixs://"))
    {
        (r.to_string(), Some(false))
    } else {
        (ep.to_string(), None)
    }
}

trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// TCP (+ TLS) connector that remembers its last failure in grpc-go's words.
#[derive(Clone)]
struct Connector {
    addr: String,
    tls: Option<Arc<rustls::ClientConfig>>,
    server_name: String,
    last_err: Arc<Mutex<Option<String>>>,
}

impl tower::Service<Uri> for Connector {
    type Response = TokioIo<Box<dyn Io>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let me = self.clone();
        Box::pin(async move {
            let r = me.connect().await;
            if let Err(e) = &r {
                *me.last_err.lock().expect("lock") = Some(e.to_string());
            }
            r
        })
    }
}

pub fn errno_text(e: &std::io::Error) -> String {
    let s = e.to_string();
    let s = match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    };
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_lowercase().collect::<String>() + c.as_str(),
        None => s,
    }
}

impl Connector {
    async fn connect(&self) -> Result<TokioIo<Box<dyn Io>>, std::io::Error> {
        let dial = |e: std::io::Error| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "transport: Error while dialing dial tcp {}: connect: {}",
                    self.addr,
                    errno_text(&e)
                ),
            )
        };
        let addrs: Vec<std::net::SocketAddr> = match self.addr.to_socket_addrs() {
            Ok(a) => a.collect(),
            Err(e) => {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!(
                        "transport: Error while dialing dial tcp: lookup {}: {}",
                        self.addr,
                        errno_text(&e)
                    ),
                ))
            }
        };
        let tcp = TcpStream::connect(&addrs[..]).await.map_err(dial)?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            None => Ok(TokioIo::new(Box::new(tcp) as Box<dyn Io>)),
            Some(cfg) => {
                let host = if self.server_name.is_empty() {
                    self.addr
                        .rsplit_once(':')
                        .map(|(h, _)| h)
                        .unwrap_or(&self.addr)
                        .trim_start_matches('[')
                        .trim_end_matches(']')
                        .to_string()
                } else {
                    self.server_name.clone()
                };
                let name = rustls_pki_types::ServerName::try_from(host)
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                let tls = tokio_rustls::TlsConnector::from(cfg.clone())
                    .connect(name, tcp)
                    .await
                    .map_err(|e| {
                        std::io::Error::other(format!(
                            "transport: authentication handshake failed: {}",
                            tls_error_text(&e)
                        ))
                    })?;
                Ok(TokioIo::new(Box::new(tls) as Box<dyn Io>))
            }
        }
    }
}

fn tls_error_text(e: &std::io::Error) -> String {
    let s = e.to_string();
    if s.contains("UnknownIssuer") {
        "x509: certificate signed by unknown authority".into()
    } else if s.contains("NotValidForName") {
        "x509: certificate is not valid for the requested name".into()
    } else if s.contains("Expired") {
        "x509: certificate has expired or is not yet valid".into()
    } else if s.contains("corrupt message") || s.contains("InvalidContentType") {
        "tls: first record does not look like a TLS handshake".into()
    } else {
        s
    }
}

/// Skips server certificate verification (`--insecure-skip-tls-verify`).
#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &rustls_pki_types::CertificateDer<'_>,
        _: &[rustls_pki_types::CertificateDer<'_>],
        _: &rustls_pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn read_file(path: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("open {path}: {}", errno_text(&e)))
}

/// The rustls client config for etcdctl's TLS flags, or `None` for
/// plain text. Errors are `newClientCfg`'s (exit code 128).
pub fn tls_config(c: &ConnConf) -> Result<Option<Arc<rustls::ClientConfig>>, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let any = !c.cert.is_empty()
        || !c.key.is_empty()
        || !c.cacert.is_empty()
        || !c.server_name.is_empty();
    if !any && c.insecure_transport {
        return Ok(None);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut identity = None;
    if !c.cert.is_empty() || !c.key.is_empty() {
        if c.cert.is_empty() || c.key.is_empty() {
            return Err(format!(
                "KeyFile and CertFile must both be present[key: {}, cert: {}]",
                c.key, c.cert
            ));
        }
        let cert_pem = read_file(&c.cert)?;
        let key_pem = read_file(&c.key)?;
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
            .filter_map(|r| r.ok())
            .collect();
        if certs.is_empty() {
            return Err("tls: failed to find any PEM data in certificate input".into());
        }
        let key = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|_| "tls: failed to find any PEM data in key input".to_string())?;
        identity = Some((certs, key));
    }
    let mut roots = rustls::RootCertStore::empty();
    if !c.cacert.is_empty() {
        let pem = read_file(&c.cacert)?;
        for cert in CertificateDer::pem_slice_iter(&pem).flatten() {
            let _ = roots.add(cert);
        }
    } else {
        // Go falls back to the system pool.
        for path in [
            "/etc/ssl/certs/ca-certificates.crt",
            "/etc/pki/tls/certs/ca-bundle.crt",
        ] {
            if let Ok(pem) = std::fs::read(path) {
                for cert in CertificateDer::pem_slice_iter(&pem).flatten() {
                    let _ = roots.add(cert);
                }
                break;
            }
        }
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS12])
        .map_err(|e| e.to_string())?;
    let builder = if c.insecure_skip_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(provider.clone())))
    } else {
        builder.with_root_certificates(roots)
    };
    let mut cfg = match identity {
        Some((certs, key)) => builder
            .with_client_auth_cert(certs, key)
            .map_err(|e| format!("tls: {e}"))?,
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Some(Arc::new(cfg)))
}

/// A fake but stable-looking pointer for the `target` field.
fn target_for(ep: &str) -> String {
    format!(
        "etcd-endpoints://0xc000{:06x}/{}",
        std::process::id() & 0xffffff,
        split_endpoint(ep).0
    )
}

fn endpoint_for(
    c: &ConnConf,
    ep: &str,
    tls: &Option<Arc<rustls::ClientConfig>>,
) -> Result<(Endpoint, Connector), String> {
    let (addr, scheme_tls) = split_endpoint(ep);
    let use_tls = match scheme_tls {
        Some(t) => t,
        None => tls.is_some(),
    };
    let tls = if use_tls {
        match tls {
            Some(t) => Some(t.clone()),
            None => tls_config(&ConnConf {
                insecure_transport: false,
                ..c.clone()
            })?,
        }
    } else {
        None
    };
    let uri = format!("http://{addr}");
    let mut e = Endpoint::from_shared(uri).map_err(|e| e.to_string())?;
    if !c.dial_timeout.is_zero() {
        e = e.connect_timeout(c.dial_timeout);
    }
    if !c.keepalive_time.is_zero() {
        // grpc-go raises a keepalive time under 10 s to 10 s (etcd's
        // servers answer more frequent pings with GOAWAY too_many_pings,
        // which ends long-running watches and keep-alives).
        e = e
            .http2_keep_alive_interval(c.keepalive_time.max(Duration::from_secs(10)))
            .keep_alive_timeout(c.keepalive_timeout);
    }
    Ok((
        e,
        Connector {
            addr,
            tls,
            server_name: c.server_name.clone(),
            last_err: Arc::new(Mutex::new(None)),
        },
    ))
}

/// Connects to the first reachable endpoint, retrying until `deadline`
/// (`None`: forever, as etcdctl's commands without a timeout do). Errors
/// are already reported as etcdctl does (log line); the caller prints
/// `Error: <msg>` with the code in the `Exit`.
pub async fn connect(c: &ConnConf, deadline: Option<Instant>) -> Result<Conn, Exit> {
    let tls = tls_config(c).map_err(|e| Exit::new(EXIT_BAD_ARGS, e))?;
    let Some(first) = c.endpoints.first() else {
        return Err(Exit::new(
            EXIT_BAD_CONNECTION,
            "etcdclient: no available endpoints",
        ));
    };
    let target = target_for(first);
    let mut eps = Vec::new();
    for ep in &c.endpoints {
        eps.push((
            ep.clone(),
            endpoint_for(c, ep, &tls).map_err(|e| Exit::new(EXIT_BAD_ARGS, e))?,
        ));
    }
    let mut last = String::new();
    let channel_ep = loop {
        let mut found = None;
        for (ep, (e, conn)) in &eps {
            match e.connect_with_connector(conn.clone()).await {
                Ok(ch) => {
                    found = Some((ch, ep.clone()));
                    break;
                }
                Err(err) => {
                    last = conn
                        .last_err
                        .lock()
                        .expect("lock")
                        .clone()
                        .unwrap_or_else(|| err.to_string());
                }
            }
        }
        if let Some(f) = found {
            break f;
        }
        if deadline.is_some_and(|d| Instant::now() + Duration::from_millis(100) >= d) {
            if let Some(d) = deadline {
                tokio::time::sleep_until(d.into()).await;
            }
            let e = RpcError {
                code: "DeadlineExceeded",
                desc: format!(
                    "latest balancer error: last connection error: connection error: desc = {}",
                    gofmt::quote(&last)
                ),
            };
            log_unary_failure(&target, &e);
            return Err(Exit::new(EXIT_ERROR, "context deadline exceeded"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (channel, endpoint) = channel_ep;
    let (client, token) = match &c.user {
        None => (client_on(&channel, ConnectOptions::new()).await?, None),
        Some((u, p)) => {
            // clientv3 authenticates once at New; "auth not enabled" is fine.
            let mut auth = retcd_api::etcdserverpb::auth_client::AuthClient::new(channel.clone());
            let req = retcd_api::etcdserverpb::AuthenticateRequest {
                name: u.clone(),
                password: p.clone(),
            };
            let r = until(deadline, async {
                auth.authenticate(req).await.map_err(RpcError::from)
            })
            .await;
            match r {
                Ok(resp) => {
                    let token = resp.into_inner().token;
                    let opts = ConnectOptions::new().with_user(u.clone(), p.clone());
                    (client_on(&channel, opts).await?, Some(token))
                }
                Err(e) => {
                    log_unary_failure(&target, &e);
                    if e.desc != "etcdserver: authentication is not enabled" {
                        return Err(Exit::new(EXIT_BAD_CONNECTION, e.message()));
                    }
                    (client_on(&channel, ConnectOptions::new()).await?, None)
                }
            }
        }
    };
    Ok(Conn {
        client,
        channel,
        token,
        target,
        endpoint,
    })
}

/// etcd-client's client on the connected channel.
async fn client_on(channel: &Channel, opts: ConnectOptions) -> Result<Client, Exit> {
    Client::from_channel(etcd_client::Channel::Tonic(channel.clone()), Some(opts))
        .await
        .map_err(|e| Exit::new(EXIT_BAD_CONNECTION, RpcError::from(e).message()))
}

impl Conn {
    /// Runs one unary call the way clientv3's retry interceptor reports it:
    /// a failure is logged (warn line) and returned.
    pub async fn unary<T, Fut>(&self, deadline: Option<Instant>, fut: Fut) -> Result<T, RpcError>
    where
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.logged(until(deadline, async { fut.await.map_err(RpcError::from) }).await)
    }

    /// Like [`Conn::unary`] for a raw tonic call.
    pub async fn unary_raw<T, Fut>(
        &self,
        deadline: Option<Instant>,
        fut: Fut,
    ) -> Result<T, RpcError>
    where
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let call = async { fut.await.map(|r| r.into_inner()).map_err(RpcError::from) };
        self.logged(until(deadline, call).await)
    }

    /// The retry interceptor's warn line for a failed call.
    fn logged<T>(&self, r: Result<T, RpcError>) -> Result<T, RpcError> {
        if let Err(e) = &r {
            log_unary_failure(&self.target, e);
        }
        r
    }

    /// A request carrying the auth token, for raw tonic calls.
    pub fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if let Some(t) = &self.token {
            if let Ok(v) = t.parse() {
                r.metadata_mut().insert("token", v);
            }
        }
        r
    }
}

/// `fut`, or the deadline error once `deadline` passes (`None`: no limit).
async fn until<T>(
    deadline: Option<Instant>,
    fut: impl Future<Output = Result<T, RpcError>>,
) -> Result<T, RpcError> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d.into(), fut)
            .await
            .unwrap_or_else(|_| Err(RpcError::deadline())),
        None => fut.await,
    }
}

/// A zap fatal line (the caller exits 1).
pub fn log_fatal(caller: &str, msg: &str, fields: &[(&str, &str)]) {
    log_epoch("fatal", None, caller, msg, fields);
}

/// A zap info line (production logger: epoch timestamps).
pub fn log_info(logger: Option<&str>, caller: &str, msg: &str, fields: &[(&str, &str)]) {
    log_epoch("info", logger, caller, msg, fields);
}
