//! TLS for the client and peer ports, with etcd's flags and etcd's rules
//! (`client/pkg/transport/listener.go`):
//!
//! * an `https://` listen URL is served with `--cert-file`/`--key-file`
//!   (clients) or `--peer-cert-file`/`--peer-key-file` (peers), or with a
//!   self-signed certificate made at start (`--auto-tls`,
//!   `--peer-auto-tls`, `self_cert`);
//! * a trusted CA file (`--trusted-ca-file`, `--peer-trusted-ca-file`) or
//!   `--client-cert-auth` / `--peer-client-cert-auth` means client
//!   certificates are **required** and verified against it (etcd's
//!   `RequireAndVerifyClientCert`), a CRL file (`--client-crl-file`,
//!   `--peer-crl-file`) refuses the certificates it lists, and the allowed
//!   CN / hostname lists (`--peer-cert-allowed-cn`,
//!   `--peer-cert-allowed-hostname`, `--client-cert-allowed-hostname`)
//!   narrow who may connect (`verify`);
//! * on the peer port a client certificate with SANs must also match the
//!   address it connects from (etcd's `checkSAN`; off with
//!   `--experimental-peer-skip-client-san-verification`);
//! * `--cipher-suites` (Go's names; TLS 1.2 suites: TLS 1.3 ones are not
//!   configurable, as in Go), `--tls-min-version`, `--tls-max-version`.
//!
//! The server terminates TLS itself (rustls) rather than through tonic, so
//! that client connections get the `:authority` repair
//! (`api::h2_authority`) on the decrypted stream, as plain ones do.
//! Handshakes run in their own tasks, bounded by a timeout, so a slow
//! client never holds up accepting.
//!
//! This member dials `https://` URLs (peers; peers' client URLs for a
//! forwarded promote) through a [`Dialer`], with rustls of its own (so the
//! same versions, suites and allowed lists apply): it presents
//! `--peer-client-cert-file` (default `--peer-cert-file`) or
//! `--client-cert-file` (default `--cert-file`) and trusts the configured
//! CA, or the certificate itself when no CA is given (a self-signed
//! setup). The dialer is handed to whatever dials; nothing here is
//! process-global. Who a verified client certificate names is
//! `auth::cert`'s job.

pub mod names;
mod self_cert;
mod verify;

use crate::config::{split_urls, url_host_port, Config};
use anyhow::Context;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer, ServerName};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{
    CipherSuite, ClientConfig, RootCertStore, ServerConfig, SupportedProtocolVersion,
};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tonic::transport::{Channel, Endpoint};
use verify::{Allowed, AllowedClients, ServerCheck};

/// How long a TLS handshake may take before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The member's TLS setup; see the module documentation.
#[derive(Default, Clone)]
pub struct Tls {
    /// Serves `https://` client URLs.
    pub client_acceptor: Option<TlsAcceptor>,
    /// Serves `https://` peer URLs.
    pub peer_acceptor: Option<TlsAcceptor>,
    /// Whether a peer's certificate SANs must match its address.
    pub peer_san_check: bool,
    /// Dials peers' and clients' `https://` URLs.
    pub dialer: Dialer,
    /// Why the client side's certificate, key, CA or CRL files could not
    /// be loaded: etcd loads them only when it serves an `https://` client
    /// URL, once its server is ready (`serveCtx.serve`), or when it opens
    /// an `https://` metrics listener; with `http://` URLs it never does.
    /// The caller raises it there (`run`).
    pub client_error: Option<String>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("client", &self.client_acceptor.is_some())
            .field("peer", &self.peer_acceptor.is_some())
            .finish()
    }
}

/// The versions and cipher suites both sides use.
struct Protocol {
    provider: Arc<CryptoProvider>,
    versions: Vec<&'static SupportedProtocolVersion>,
}

/// rustls' TLS 1.2 suites by Go's names (Go also names the ChaCha20 ones
/// without the `_SHA256` suffix).
const SUITES: &[(&str, CipherSuite)] = &[
    (
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
        CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
];

/// Go's other cipher suite names: etcd accepts them, rustls implements
/// none of them (CBC modes, RSA key exchange, 3DES, RC4).
const GO_SUITES_NOT_IN_RUSTLS: &[&str] = &[
    "TLS_RSA_WITH_RC4_128_SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
];

fn tls_version(flag: &str, v: &str) -> anyhow::Result<Option<&'static SupportedProtocolVersion>> {
    use tokio_rustls::rustls::version::{TLS12, TLS13};
    match v {
        "" => Ok(None),
        "TLS1.2" => Ok(Some(&TLS12)),
        "TLS1.3" => Ok(Some(&TLS13)),
        "TLS1.0" | "TLS1.1" => anyhow::bail!(
            "--{flag} {v}: retcd speaks TLS1.2 and TLS1.3 only (TLS1.0 and 1.1 are deprecated)"
        ),
        other => anyhow::bail!("unexpected TLS version value {other:?} for --{flag}"),
    }
}

impl Protocol {
    fn from_config(cfg: &Config) -> anyhow::Result<Protocol> {
        use tokio_rustls::rustls::version::{TLS12, TLS13};
        let min = tls_version("tls-min-version", &cfg.tls_min_version)?.unwrap_or(&TLS12);
        let max = tls_version("tls-max-version", &cfg.tls_max_version)?.unwrap_or(&TLS13);
        let rank = |v: &SupportedProtocolVersion| if v.version == TLS12.version { 2 } else { 3 };
        if rank(min) > rank(max) {
            anyhow::bail!(
                "min version ({}) is greater than max version ({})",
                cfg.tls_min_version,
                cfg.tls_max_version
            );
        }
        let versions: Vec<&'static SupportedProtocolVersion> = [&TLS12, &TLS13]
            .into_iter()
            .filter(|v| rank(v) >= rank(min) && rank(v) <= rank(max))
            .collect();
        let mut provider = tokio_rustls::rustls::crypto::ring::default_provider();
        let names: Vec<&str> = cfg
            .cipher_suites
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        if !names.is_empty() {
            if rank(min) == 3 {
                anyhow::bail!(
                    "cipher suites cannot be configured when only TLS1.3 or greater is enabled"
                );
            }
            let mut wanted = Vec::new();
            for n in names {
                match SUITES.iter().find(|(name, _)| *name == n) {
                    Some((_, s)) => wanted.push(*s),
                    None if GO_SUITES_NOT_IN_RUSTLS.contains(&n) => anyhow::bail!(
                        "TLS cipher suite {n:?} is not supported by retcd (supported: {})",
                        SUITES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(",")
                    ),
                    None => anyhow::bail!("unexpected TLS cipher suite {n:?}"),
                }
            }
            // TLS 1.3 suites stay (not configurable, as in Go).
            provider
                .cipher_suites
                .retain(|cs| cs.tls13().is_some() || wanted.contains(&cs.suite()));
        }
        Ok(Protocol {
            provider: Arc::new(provider),
            versions,
        })
    }
}

/// One side's (client or peer) TLS settings, from the flags.
struct Side {
    what: &'static str,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    ca: Option<PathBuf>,
    crl: Option<PathBuf>,
    cert_auth: bool,
    allowed: Allowed,
    /// What this member presents when it dials (defaults: `cert`, `key`).
    dial_cert: Option<PathBuf>,
    dial_key: Option<PathBuf>,
    /// The certificate is self-signed (auto TLS): dialed peers are not
    /// verified.
    auto: bool,
}

fn read_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let data = read_pem_file(path)?;
    let certs = CertificateDer::pem_slice_iter(&data)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("invalid certificate in {}", path.display()))?;
    if certs.is_empty() {
        // Go's tls.X509KeyPair
        let text = String::from_utf8_lossy(&data);
        if text.contains("PRIVATE KEY-----") {
            anyhow::bail!("tls: failed to find certificate PEM data in certificate input, but did find a private key; PEM inputs may have been switched");
        }
        anyhow::bail!("tls: failed to find any PEM data in certificate input");
    }
    Ok(certs)
}

fn read_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    let data = read_pem_file(path)?;
    match PrivateKeyDer::from_pem_slice(&data) {
        Ok(k) => Ok(k),
        Err(_) if String::from_utf8_lossy(&data).contains("CERTIFICATE-----") => {
            anyhow::bail!(
                "tls: found a certificate rather than a key in the PEM for the private key"
            )
        }
        Err(e) => Err(anyhow::anyhow!(e))
            .with_context(|| format!("cannot read the private key {}", path.display())),
    }
}

/// A PEM file's bytes; a missing or unreadable file as Go's `os.Open`
/// words it.
fn read_pem_file(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        let why = match e.kind() {
            std::io::ErrorKind::NotFound => "no such file or directory".to_string(),
            std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
            _ => e.to_string(),
        };
        anyhow::anyhow!("open {}: {why}", path.display())
    })
}

/// A CRL file, PEM or DER (as Go's `x509.ParseCRL`).
fn read_crls(path: &Path) -> anyhow::Result<Vec<CertificateRevocationListDer<'static>>> {
    let data = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let pem: Vec<_> = CertificateRevocationListDer::pem_slice_iter(&data)
        .collect::<Result<_, _>>()
        .with_context(|| format!("invalid CRL in {}", path.display()))?;
    if !pem.is_empty() {
        return Ok(pem);
    }
    Ok(vec![CertificateRevocationListDer::from(data)])
}

fn roots(path: &Path) -> anyhow::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for c in read_certs(path)? {
        roots
            .add(c)
            .with_context(|| format!("unusable CA certificate in {}", path.display()))?;
    }
    Ok(roots)
}

impl Side {
    /// The served certificate chain and key, if the side has them (both or
    /// neither).
    fn served(
        &self,
    ) -> anyhow::Result<Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>> {
        // A certificate without its key (or a key without its
        // certificate) serves nothing; as in etcd, that is an error only
        // for an https URL (see `run::https_acceptor`).
        let (Some(cert), Some(key)) = (&self.cert, &self.key) else {
            return Ok(None);
        };
        Ok(Some((read_certs(cert)?, read_key(key)?)))
    }

    fn acceptor(&self, proto: &Protocol) -> anyhow::Result<Option<TlsAcceptor>> {
        let what = self.what;
        let Some((certs, key)) = self.served()? else {
            return Ok(None);
        };
        let builder = ServerConfig::builder_with_provider(proto.provider.clone())
            .with_protocol_versions(&proto.versions)
            .with_context(|| format!("{what}: TLS versions"))?;
        // etcd: a trusted CA file, or client cert auth, means client
        // certificates are required and verified.
        let builder = if self.ca.is_some() || self.cert_auth {
            // Without a CA file Go verifies client certificates against
            // the system's roots (etcd starts).
            let system = PathBuf::from("/etc/ssl/certs/ca-certificates.crt");
            let ca = match self.ca.as_ref() {
                Some(ca) => ca,
                None if system.is_file() => &system,
                None => anyhow::bail!("{what}: client certificate auth needs a trusted CA file"),
            };
            let mut b = WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots(ca)?),
                proto.provider.clone(),
            );
            if let Some(crl) = &self.crl {
                // as etcd: the CRL lists serials to refuse; a certificate
                // whose issuer has no CRL in the file is not refused for it
                b = b
                    .with_crls(read_crls(crl)?)
                    .allow_unknown_revocation_status();
            }
            let inner = b
                .build()
                .with_context(|| format!("{what}: client verifier"))?;
            builder.with_client_cert_verifier(Arc::new(AllowedClients {
                inner,
                allowed: self.allowed.clone(),
            }))
        } else {
            if self.crl.is_some() || !self.allowed.is_any() {
                tracing::warn!(
                    "{what}: no client certificates are asked for (no trusted CA file), so the CRL and allowed names have no effect"
                );
            }
            builder.with_no_client_auth()
        };
        let mut cfg = builder
            .with_single_cert(certs, key)
            .with_context(|| format!("{what}: certificate and key do not match"))?;
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Some(TlsAcceptor::from(Arc::new(cfg))))
    }

    /// The client config this member dials the side's `https://` URLs with.
    fn dial(
        &self,
        proto: &Protocol,
        allowed: Allowed,
    ) -> anyhow::Result<Option<Arc<ClientConfig>>> {
        let what = self.what;
        let cert = self.dial_cert.as_ref().or(self.cert.as_ref());
        let key = self.dial_key.as_ref().or(self.key.as_ref());
        let (Some(cert), Some(key)) = (cert, key) else {
            return Ok(None);
        };
        let check = if self.auto {
            ServerCheck::Unverified(proto.provider.clone())
        } else {
            let ca = self.ca.as_ref().unwrap_or(cert);
            let inner = tokio_rustls::rustls::client::WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots(ca)?),
                proto.provider.clone(),
            )
            .build()
            .with_context(|| format!("{what}: server verifier"))?;
            ServerCheck::Verified { inner, allowed }
        };
        let mut cfg = ClientConfig::builder_with_provider(proto.provider.clone())
            .with_protocol_versions(&proto.versions)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(check))
            .with_client_auth_cert(read_certs(cert)?, read_key(key)?)
            .with_context(|| format!("{what}: dial certificate and key do not match"))?;
        cfg.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Some(Arc::new(cfg)))
    }
}

/// The hosts of `urls`, for a self-signed certificate.
fn hosts(urls: &str) -> Vec<String> {
    let mut out: Vec<String> = split_urls(urls)
        .iter()
        .filter_map(|u| url_host_port(u).ok())
        .filter_map(|hp| {
            hp.rsplit_once(':')
                .map(|(h, _)| h.trim_matches(['[', ']']).to_string())
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

impl Tls {
    pub fn from_config(cfg: &Config) -> anyhow::Result<Tls> {
        let proto = Protocol::from_config(cfg)?;
        let fixtures = cfg.data_dir().join("fixtures");
        let auto = |on: bool, what: &str, cert: &Option<PathBuf>, dir: &str, urls: &str| {
            if !on {
                return Ok::<_, anyhow::Error>(None);
            }
            if cert.is_some() {
                tracing::warn!("ignoring {what} auto TLS since certs given");
                return Ok(None);
            }
            let (c, k) = self_cert::ensure(
                &fixtures.join(dir),
                &hosts(urls),
                cfg.self_signed_cert_validity,
            )?;
            Ok(Some((c, k)))
        };
        let client_auto = auto(
            cfg.auto_tls,
            "client",
            &cfg.cert_file,
            "client",
            &cfg.listen_client_urls,
        )?;
        let peer_auto = auto(
            cfg.peer_auto_tls,
            "peer",
            &cfg.peer_cert_file,
            "peer",
            &cfg.listen_peer_urls,
        )?;
        let client = Side {
            what: "client TLS",
            cert: client_auto
                .as_ref()
                .map(|a| a.0.clone())
                .or(cfg.cert_file.clone()),
            key: client_auto
                .as_ref()
                .map(|a| a.1.clone())
                .or(cfg.key_file.clone()),
            ca: cfg.trusted_ca_file.clone(),
            crl: cfg.client_crl_file.clone(),
            cert_auth: cfg.client_cert_auth,
            allowed: Allowed::from_flags("client TLS", "", &cfg.client_cert_allowed_hostname)?,
            dial_cert: cfg.client_cert_file.clone(),
            dial_key: cfg.client_key_file.clone(),
            auto: client_auto.is_some(),
        };
        let peer = Side {
            what: "peer TLS",
            cert: peer_auto
                .as_ref()
                .map(|a| a.0.clone())
                .or(cfg.peer_cert_file.clone()),
            key: peer_auto
                .as_ref()
                .map(|a| a.1.clone())
                .or(cfg.peer_key_file.clone()),
            ca: cfg.peer_trusted_ca_file.clone(),
            crl: cfg.peer_crl_file.clone(),
            cert_auth: cfg.peer_client_cert_auth,
            allowed: Allowed::from_flags(
                "peer TLS",
                &cfg.peer_cert_allowed_cn,
                &cfg.peer_cert_allowed_hostname,
            )?,
            dial_cert: cfg.peer_client_cert_file.clone(),
            dial_key: cfg.peer_client_key_file.clone(),
            auto: peer_auto.is_some(),
        };
        let peer_acceptor = peer.acceptor(&proto)?;
        // etcd applies the peer allow-list to the peers it dials too.
        let peer_dial = peer.dial(&proto, peer.allowed.clone())?;
        let client_side = client
            .acceptor(&proto)
            .and_then(|a| Ok((a, client.dial(&proto, Allowed::Any)?)));
        let ((client_acceptor, client_dial), client_error) = match client_side {
            Ok(side) => (side, None),
            Err(e) => ((None, None), Some(format!("{e:#}"))),
        };
        Ok(Tls {
            client_acceptor,
            peer_acceptor,
            peer_san_check: !cfg.experimental_peer_skip_client_san_verification && !peer.auto,
            dialer: Dialer {
                peer: peer_dial,
                client: client_dial,
            },
            client_error,
        })
    }
}

/// How this member dials other members: their peer URLs with the peer
/// settings, their client URLs with the client settings (plain `http://`
/// URLs without TLS). Cheap to clone.
#[derive(Default, Clone)]
pub struct Dialer {
    peer: Option<Arc<ClientConfig>>,
    client: Option<Arc<ClientConfig>>,
}

impl Dialer {
    /// A dial of a peer URL.
    pub fn peer(&self, url: &str) -> Result<Dial, tonic::transport::Error> {
        Dial::new(url, self.peer.as_ref())
    }

    /// A dial of a client URL.
    pub fn client(&self, url: &str) -> Result<Dial, tonic::transport::Error> {
        Dial::new(url, self.client.as_ref())
    }
}

/// One URL to connect to: a tonic endpoint, and for `https://` the TLS
/// this member's own connector does.
pub struct Dial {
    endpoint: Endpoint,
    tls: Option<(Arc<ClientConfig>, String)>,
    /// TCP_USER_TIMEOUT of the connections ([`Dial::with_tcp_user_timeout`]).
    user_timeout: Option<Duration>,
}

impl Dial {
    fn new(url: &str, tls: Option<&Arc<ClientConfig>>) -> Result<Dial, tonic::transport::Error> {
        match (url.strip_prefix("https://"), tls) {
            (Some(rest), Some(cfg)) => {
                let hp = rest.trim_end_matches('/').to_string();
                // h2 with prior knowledge over the TLS stream the
                // connector makes
                let endpoint = Endpoint::from_shared(format!("http://{hp}"))?;
                Ok(Dial {
                    endpoint,
                    tls: Some((cfg.clone(), hp)),
                    user_timeout: None,
                })
            }
            _ => Ok(Dial {
                endpoint: Endpoint::from_shared(url.to_string())?,
                tls: None,
                user_timeout: None,
            }),
        }
    }

    /// Sets timeouts and the like on the endpoint.
    pub fn configure(mut self, f: impl FnOnce(Endpoint) -> Endpoint) -> Dial {
        self.endpoint = f(self.endpoint);
        self
    }

    /// Connections whose sent bytes stay unacknowledged for `d` are
    /// aborted by the kernel (TCP_USER_TIMEOUT), which drops what they
    /// still had to send. For requests that must not reach the other end
    /// long after the caller gave up on them: behind a cut link TCP keeps
    /// retransmitting them with a growing backoff, and after the heal it
    /// delivers them seconds later.
    pub fn with_tcp_user_timeout(mut self, d: Duration) -> Dial {
        self.user_timeout = Some(d);
        self
    }

    pub async fn connect(self) -> Result<Channel, tonic::transport::Error> {
        let ut = self.user_timeout;
        match self.tls {
            Some((cfg, hp)) => {
                self.endpoint
                    .connect_with_connector(connector(cfg, hp, ut))
                    .await
            }
            None if ut.is_some() => {
                self.endpoint
                    .connect_with_connector(plain_connector(ut))
                    .await
            }
            None => self.endpoint.connect().await,
        }
    }

    pub fn connect_lazy(self) -> Channel {
        let ut = self.user_timeout;
        match self.tls {
            Some((cfg, hp)) => self
                .endpoint
                .connect_with_connector_lazy(connector(cfg, hp, ut)),
            None if ut.is_some() => self
                .endpoint
                .connect_with_connector_lazy(plain_connector(ut)),
            None => self.endpoint.connect_lazy(),
        }
    }
}

/// A TCP connection to `hp`, TCP_NODELAY and the given TCP_USER_TIMEOUT set.
async fn tcp_connect(hp: &str, user_timeout: Option<Duration>) -> std::io::Result<TcpStream> {
    let tcp = TcpStream::connect(hp).await?;
    tcp.set_nodelay(true)?;
    if let Some(d) = user_timeout {
        let ms = u32::try_from(d.as_millis()).unwrap_or(u32::MAX).max(1);
        rustix::net::sockopt::set_tcp_user_timeout(&tcp, ms)?;
    }
    Ok(tcp)
}

/// Plain TCP to the URI's host and port ([`tcp_connect`]).
fn plain_connector(
    user_timeout: Option<Duration>,
) -> impl tower::Service<
    tonic::transport::Uri,
    Response = hyper_util::rt::TokioIo<TcpStream>,
    Error = std::io::Error,
    Future = impl Send,
> + Clone
       + Send {
    tower::service_fn(move |uri: tonic::transport::Uri| async move {
        let hp = match (uri.host(), uri.port_u16()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => format!("{h}:80"),
            _ => return Err(std::io::Error::other(format!("no host in {uri}"))),
        };
        Ok(hyper_util::rt::TokioIo::new(
            tcp_connect(&hp, user_timeout).await?,
        ))
    })
}

/// TCP + TLS to `hp` with `cfg`, verifying the server as the host of `hp`.
fn connector(
    cfg: Arc<ClientConfig>,
    hp: String,
    user_timeout: Option<Duration>,
) -> impl tower::Service<
    tonic::transport::Uri,
    Response = hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<TcpStream>>,
    Error = std::io::Error,
    Future = impl Send,
> + Clone
       + Send {
    tower::service_fn(move |_: tonic::transport::Uri| {
        let (cfg, hp) = (cfg.clone(), hp.clone());
        async move {
            let tcp = tcp_connect(&hp, user_timeout).await?;
            let host = hp.rsplit_once(':').map_or(hp.as_str(), |(h, _)| h);
            let host = host.trim_matches(['[', ']']);
            let name = ServerName::try_from(host.to_string())
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            let tls = tokio_rustls::TlsConnector::from(cfg)
                .connect(name, tcp)
                .await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
        }
    })
}

/// Accepted TLS connections on `l` (TCP_NODELAY set), handshakes done in
/// their own tasks; with `san_check`, a client certificate with SANs must
/// match the address it connects from (etcd's peer `checkSAN`). The accept
/// loop ends when the returned stream is dropped.
pub fn incoming(
    l: TcpListener,
    acceptor: TlsAcceptor,
    san_check: bool,
) -> impl tokio_stream::Stream<Item = std::io::Result<TlsStream<TcpStream>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = l.accept() => a,
                _ = tx.closed() => return,
            };
            let (s, remote) = match accepted {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let _ = s.set_nodelay(true);
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                let handshake = async {
                    let tls = acceptor.accept(s).await?;
                    if san_check {
                        check_san(&tls, remote.ip()).await?;
                    }
                    Ok::<_, std::io::Error>(tls)
                };
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(tls)).await;
                    }
                    Ok(Err(e)) => {
                        tracing::info!(remote = %remote, error = %e, "rejected connection")
                    }
                    Err(_) => tracing::debug!(remote = %remote, "TLS handshake timed out"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// etcd's `checkSAN`: a client certificate with IP or DNS SANs must name
/// `remote`, by an IP SAN or a DNS SAN that resolves to it.
async fn check_san(tls: &TlsStream<TcpStream>, remote: IpAddr) -> std::io::Result<()> {
    let Some(leaf) = tls.get_ref().1.peer_certificates().and_then(|c| c.first()) else {
        return Ok(());
    };
    let (dns, ips) = names::subject_alt_names(leaf.as_ref());
    if dns.is_empty() && ips.is_empty() {
        return Ok(());
    }
    let remote = match remote {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(remote, IpAddr::V4),
        v4 => v4,
    };
    if ips.contains(&remote) {
        return Ok(());
    }
    for d in &dns {
        if let Ok(addrs) = tokio::net::lookup_host((d.as_str(), 0)).await {
            if addrs.map(|a| a.ip()).any(|ip| ip == remote) {
                return Ok(());
            }
        }
    }
    Err(std::io::Error::other(format!(
        "tls: {remote:?} does not match any of DNSNames {dns:?} or IPAddresses {ips:?}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    fn cfg(args: &[&str]) -> Config {
        Config::from_args(args).unwrap()
    }

    #[test]
    fn test_tls_versions_and_suites() {
        let p = Protocol::from_config(&cfg(&[])).unwrap();
        assert_eq!(p.versions.len(), 2);
        let p = Protocol::from_config(&cfg(&["--tls-min-version", "TLS1.3"])).unwrap();
        assert_eq!(p.versions.len(), 1);
        let e = Protocol::from_config(&cfg(&[
            "--tls-min-version",
            "TLS1.3",
            "--tls-max-version",
            "TLS1.2",
        ]))
        .err()
        .unwrap();
        assert!(e.to_string().contains("greater than max version"), "{e}");
        assert!(Protocol::from_config(&cfg(&["--tls-min-version", "TLS1.0"])).is_err());
        assert!(Protocol::from_config(&cfg(&["--tls-min-version", "SSL3"])).is_err());
        let p = Protocol::from_config(&cfg(&[
            "--cipher-suites",
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        ]))
        .unwrap();
        let tls12: Vec<_> = p
            .provider
            .cipher_suites
            .iter()
            .filter(|s| s.tls13().is_none())
            .map(|s| s.suite())
            .collect();
        assert_eq!(
            tls12,
            vec![CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]
        );
        let e = Protocol::from_config(&cfg(&["--cipher-suites", "TLS_RSA_WITH_AES_128_CBC_SHA"]))
            .err()
            .unwrap();
        assert!(e.to_string().contains("not supported by retcd"), "{e}");
        let e = Protocol::from_config(&cfg(&["--cipher-suites", "bogus"]))
            .err()
            .unwrap();
        assert!(e.to_string().contains("unexpected TLS cipher suite"), "{e}");
        let e = Protocol::from_config(&cfg(&[
            "--cipher-suites",
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            "--tls-min-version",
            "TLS1.3",
        ]))
        .err()
        .unwrap();
        assert!(e.to_string().contains("cannot be configured"), "{e}");
    }

    #[test]
    fn test_allowed_cn_and_hostname_are_exclusive() {
        assert!(Allowed::from_flags("peer", "a", "b").is_err());
        assert!(matches!(
            Allowed::from_flags("peer", "a, b", "").unwrap(),
            Allowed::CommonNames(v) if v == ["a", "b"]
        ));
        assert!(Allowed::from_flags("peer", "", "").unwrap().is_any());
    }

    #[test]
    fn test_hosts_of_listen_urls() {
        assert_eq!(
            hosts("https://127.0.0.1:2379,http://localhost:1,https://[::1]:3"),
            vec!["127.0.0.1".to_string(), "::1".to_string()]
        );
    }
}
