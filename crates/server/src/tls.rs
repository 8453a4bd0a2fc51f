//! TLS for the client and peer ports, with etcd's flags: an `https://`
//! listen URL is served with `--cert-file`/`--key-file` (clients) or
//! `--peer-cert-file`/`--peer-key-file` (peers); `--client-cert-auth` /
//! `--peer-client-cert-auth` require a certificate signed by
//! `--trusted-ca-file` / `--peer-trusted-ca-file`.
//!
//! The server terminates TLS itself (rustls) rather than through tonic, so
//! that client connections get the `:authority` repair (`authority_fix`)
//! on the decrypted stream, as plain ones do. Handshakes run in their own
//! tasks, bounded by a timeout, so a slow client never holds up accepting.
//!
//! This member dials `https://` URLs (peers; its own client URL for the
//! lock and election services; peers' client URLs for the corruption
//! check) with the peer or client certificate as its identity, trusting
//! the configured CA, or the certificate itself when no CA is given (a
//! self-signed setup).

use crate::config::Config;
use anyhow::Context;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// How long a TLS handshake may take before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// One side's (client or peer) TLS settings, from the flags.
struct Side {
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    ca: Option<PathBuf>,
    cert_auth: bool,
}

/// The member's TLS setup; see the module documentation.
#[derive(Default, Clone)]
pub struct Tls {
    /// Serves `https://` client URLs.
    pub client_acceptor: Option<TlsAcceptor>,
    /// Serves `https://` peer URLs.
    pub peer_acceptor: Option<TlsAcceptor>,
    /// Dials peers' `https://` URLs.
    pub peer_dial: Option<ClientTlsConfig>,
    /// Dials `https://` client URLs (peers').
    pub client_dial: Option<ClientTlsConfig>,
    /// Dials this member's own `https://` client URL (the lock and
    /// election services): trusts exactly the certificate it serves, so it
    /// works with or without a CA file (etcd's services call the server in
    /// process and need no TLS at all).
    pub self_dial: Option<Arc<tokio_rustls::rustls::ClientConfig>>,
    /// The certificate this member serves on client URLs (and presents
    /// when dialing itself).
    pub own_client_cert: Option<CertificateDer<'static>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("client", &self.client_acceptor.is_some())
            .field("peer", &self.peer_acceptor.is_some())
            .finish()
    }
}

fn read_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("cannot read certificates from {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("invalid certificate in {}", path.display()))?;
    anyhow::ensure!(!certs.is_empty(), "no certificate in {}", path.display());
    Ok(certs)
}

fn read(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}

/// A side's certificate chain and private key, read once.
struct Keys {
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl Side {
    /// The side's certificate and key, if it has them (both or neither).
    fn keys(&self, what: &str) -> anyhow::Result<Option<Keys>> {
        let (Some(cert), Some(key)) = (&self.cert, &self.key) else {
            anyhow::ensure!(
                self.cert.is_none() && self.key.is_none(),
                "{what}: a certificate needs its key and a key its certificate"
            );
            return Ok(None);
        };
        Ok(Some(Keys {
            certs: read_certs(cert)?,
            key: PrivateKeyDer::from_pem_file(key)
                .with_context(|| format!("cannot read the private key {}", key.display()))?,
        }))
    }

    fn acceptor(&self, what: &str, keys: &Keys) -> anyhow::Result<TlsAcceptor> {
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let builder = if self.cert_auth {
            let ca = self.ca.as_ref().with_context(|| {
                format!("{what}: client certificate auth needs a trusted CA file")
            })?;
            let mut roots = RootCertStore::empty();
            for c in read_certs(ca)? {
                roots.add(c)?;
            }
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider).build()?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let mut cfg = builder
            .with_single_cert(keys.certs.clone(), keys.key.clone_key())
            .with_context(|| format!("{what}: certificate and key do not match"))?;
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(TlsAcceptor::from(Arc::new(cfg)))
    }

    /// A client config that accepts only this side's own certificate and
    /// presents it (for `--client-cert-auth`).
    fn self_dial(keys: &Keys) -> anyhow::Result<Arc<tokio_rustls::rustls::ClientConfig>> {
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let verifier = Arc::new(PinnedCert {
            cert: keys.certs[0].clone(),
            provider: provider.clone(),
        });
        let mut cfg = tokio_rustls::rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_client_auth_cert(keys.certs.clone(), keys.key.clone_key())?;
        cfg.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(cfg))
    }

    fn dial(&self) -> anyhow::Result<Option<ClientTlsConfig>> {
        let (Some(cert), Some(key)) = (&self.cert, &self.key) else {
            return Ok(None);
        };
        let ca = self.ca.as_ref().unwrap_or(cert);
        Ok(Some(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(read(ca)?))
                .identity(Identity::from_pem(read(cert)?, read(key)?)),
        ))
    }
}

impl Tls {
    pub fn from_config(cfg: &Config) -> anyhow::Result<Tls> {
        let client = Side {
            cert: cfg.cert_file.clone(),
            key: cfg.key_file.clone(),
            ca: cfg.trusted_ca_file.clone(),
            cert_auth: cfg.client_cert_auth,
        };
        let peer = Side {
            cert: cfg.peer_cert_file.clone(),
            key: cfg.peer_key_file.clone(),
            ca: cfg.peer_trusted_ca_file.clone(),
            cert_auth: cfg.peer_client_cert_auth,
        };
        let client_keys = client.keys("client TLS")?;
        let peer_keys = peer.keys("peer TLS")?;
        Ok(Tls {
            client_acceptor: match &client_keys {
                Some(k) => Some(client.acceptor("client TLS", k)?),
                None => None,
            },
            peer_acceptor: match &peer_keys {
                Some(k) => Some(peer.acceptor("peer TLS", k)?),
                None => None,
            },
            peer_dial: peer.dial()?,
            client_dial: client.dial()?,
            self_dial: client_keys.as_ref().map(Side::self_dial).transpose()?,
            own_client_cert: client_keys.map(|k| k.certs[0].clone()),
        })
    }

    /// An endpoint for `url`, with `dial` applied to `https://` URLs.
    pub fn endpoint(
        url: &str,
        dial: Option<&ClientTlsConfig>,
    ) -> Result<Endpoint, tonic::transport::Error> {
        let ep = Endpoint::from_shared(url.to_string())?;
        match dial {
            Some(t) if url.starts_with("https://") => ep.tls_config(t.clone()),
            _ => Ok(ep),
        }
    }
}

/// The process's TLS setup for dialing, set once at start (`run`). Every
/// place that dials a peer or client URL goes through [`peer_endpoint`] or
/// [`client_endpoint`]; without it (unit tests, plain URLs) no TLS is used.
static DIAL: std::sync::OnceLock<Tls> = std::sync::OnceLock::new();

pub fn set_dial(t: Tls) {
    let _ = DIAL.set(t);
}

/// An endpoint for a peer URL (`https://` with the peer certificate).
pub fn peer_endpoint(url: &str) -> Result<Endpoint, tonic::transport::Error> {
    Tls::endpoint(url, DIAL.get().and_then(|t| t.peer_dial.as_ref()))
}

/// An endpoint for a client URL (`https://` with the client certificate).
pub fn client_endpoint(url: &str) -> Result<Endpoint, tonic::transport::Error> {
    Tls::endpoint(url, DIAL.get().and_then(|t| t.client_dial.as_ref()))
}

/// A channel to this member's own client URL `url` (`http://` or
/// `https://host:port`), connected lazily.
pub fn self_channel(url: &str) -> tonic::transport::Channel {
    let hp = url.split_once("://").map_or(url, |(_, r)| r).to_string();
    let plain = Endpoint::from_shared(format!("http://{hp}"))
        .expect("valid self URL")
        .tcp_nodelay(true);
    let Some(cfg) = DIAL
        .get()
        .and_then(|t| t.self_dial.clone())
        .filter(|_| url.starts_with("https://"))
    else {
        return plain.connect_lazy();
    };
    // TLS by our own connector: the endpoint itself stays `http://` (h2
    // with prior knowledge over the TLS stream).
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let (cfg, hp) = (cfg.clone(), hp.clone());
        async move {
            let tcp = TcpStream::connect(&hp).await?;
            tcp.set_nodelay(true)?;
            let host = hp.rsplit_once(':').map_or(hp.as_str(), |(h, _)| h);
            let name = rustls_pki_types::ServerName::try_from(host.to_string())
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            let tls = tokio_rustls::TlsConnector::from(cfg)
                .connect(name, tcp)
                .await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
        }
    });
    plain.connect_with_connector_lazy(connector)
}

/// Accepts exactly one certificate (this member's own), with the usual
/// handshake signature checks.
#[derive(Debug)]
struct PinnedCert {
    cert: CertificateDer<'static>,
    provider: Arc<tokio_rustls::rustls::crypto::CryptoProvider>,
}

impl tokio_rustls::rustls::client::danger::ServerCertVerifier for PinnedCert {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &rustls_pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls_pki_types::UnixTime,
    ) -> Result<tokio_rustls::rustls::client::danger::ServerCertVerified, tokio_rustls::rustls::Error>
    {
        if end_entity.as_ref() == self.cert.as_ref() {
            Ok(tokio_rustls::rustls::client::danger::ServerCertVerified::assertion())
        } else {
            Err(tokio_rustls::rustls::Error::General(
                "not this member's own certificate".into(),
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &tokio_rustls::rustls::DigitallySignedStruct,
    ) -> Result<
        tokio_rustls::rustls::client::danger::HandshakeSignatureValid,
        tokio_rustls::rustls::Error,
    > {
        tokio_rustls::rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &tokio_rustls::rustls::DigitallySignedStruct,
    ) -> Result<
        tokio_rustls::rustls::client::danger::HandshakeSignatureValid,
        tokio_rustls::rustls::Error,
    > {
        tokio_rustls::rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<tokio_rustls::rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Accepted TLS connections on `l` (TCP_NODELAY set), handshakes done in
/// their own tasks. The accept loop ends when the returned stream is
/// dropped.
pub fn incoming(
    l: TcpListener,
    acceptor: TlsAcceptor,
) -> impl tokio_stream::Stream<Item = std::io::Result<TlsStream<TcpStream>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = l.accept() => a,
                _ = tx.closed() => return,
            };
            let s = match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let _ = s.set_nodelay(true);
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(s)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(tls)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!("TLS handshake timed out"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// Metadata key under which the client port hands a verified client
/// certificate's common name to the services (set by `grpc::client_guard`
/// after removing whatever the client sent under that name).
pub const CERT_CN_HEADER: &str = "x-retcd-cert-cn";

/// Sets [`CERT_CN_HEADER`] to the verified client certificate's common
/// name (etcd's AuthInfoFromTLS), never to what the client sent under that
/// name, unless the client is this member forwarding its caller's.
pub fn pass_cert_user(req: &mut axum::extract::Request) {
    let peer = cert_peer(req.extensions());
    let headers = req.headers_mut();
    match peer {
        CertPeer::Own => {}
        CertPeer::Named(cn) => {
            headers.remove(CERT_CN_HEADER);
            if let Ok(v) = axum::http::HeaderValue::from_str(&cn) {
                headers.insert(CERT_CN_HEADER, v);
            }
        }
        CertPeer::Unnamed => {
            headers.remove(CERT_CN_HEADER);
        }
    }
}

/// Who a request on the client port came from, by its TLS connection.
pub enum CertPeer {
    /// This member itself (its lock and election services, which forward
    /// their caller's identity).
    Own,
    /// A verified client certificate with this common name.
    Named(String),
    /// No certificate, or one without a common name.
    Unnamed,
}

/// The verified client certificate of the connection a request came on
/// (`--client-cert-auth`), from its connect info.
pub fn cert_peer(ext: &axum::http::Extensions) -> CertPeer {
    type Info = tonic::transport::server::TlsConnectInfo<tonic::transport::server::TcpConnectInfo>;
    let Some(certs) = ext.get::<Info>().and_then(|i| i.peer_certs()) else {
        return CertPeer::Unnamed;
    };
    let Some(leaf) = certs.first() else {
        return CertPeer::Unnamed;
    };
    let own = DIAL
        .get()
        .and_then(|t| t.own_client_cert.as_ref())
        .is_some_and(|c| c.as_ref() == leaf.as_ref());
    if own {
        return CertPeer::Own;
    }
    common_name(leaf.as_ref()).map_or(CertPeer::Unnamed, CertPeer::Named)
}

/// One DER element: (tag, contents, rest).
fn der(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, b) = b.split_first()?;
    let (&l, mut b) = b.split_first()?;
    let len = if l < 0x80 {
        l as usize
    } else {
        let n = (l & 0x7f) as usize;
        if n == 0 || n > 4 || b.len() < n {
            return None;
        }
        let len = b[..n].iter().fold(0usize, |a, &x| (a << 8) | x as usize);
        b = &b[n..];
        len
    };
    (b.len() >= len).then(|| (tag, &b[..len], &b[len..]))
}

/// The subject's common name (OID 2.5.4.3) of an X.509 certificate in
/// DER: Certificate → tbsCertificate → [version], serial, signature,
/// issuer, validity, subject.
pub fn common_name(cert: &[u8]) -> Option<String> {
    const SEQ: u8 = 0x30;
    const CN_OID: &[u8] = &[0x55, 0x04, 0x03];
    let (_, certificate, _) = der(cert).filter(|e| e.0 == SEQ)?;
    let (_, tbs, _) = der(certificate).filter(|e| e.0 == SEQ)?;
    let mut rest = tbs;
    if rest.first() == Some(&0xa0) {
        rest = der(rest)?.2; // explicit version
    }
    for _ in 0..4 {
        rest = der(rest)?.2; // serial, signature, issuer, validity
    }
    let (_, mut subject, _) = der(rest).filter(|e| e.0 == SEQ)?;
    let mut cn = None;
    while !subject.is_empty() {
        let (_, mut rdn, next) = der(subject)?;
        subject = next;
        while !rdn.is_empty() {
            let (_, atv, next) = der(rdn)?;
            rdn = next;
            let (oid_tag, oid, value) = der(atv)?;
            if oid_tag == 0x06 && oid == CN_OID {
                let (_, v, _) = der(value)?;
                cn = Some(String::from_utf8_lossy(v).into_owned());
            }
        }
    }
    cn
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DER element with a short or long length.
    fn tlv(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![tag];
        if body.len() < 0x80 {
            v.push(body.len() as u8);
        } else {
            v.push(0x82);
            v.extend_from_slice(&(body.len() as u16).to_be_bytes());
        }
        v.extend_from_slice(body);
        v
    }

    fn name(attrs: &[(&[u8], &str)]) -> Vec<u8> {
        let mut rdns = Vec::new();
        for (oid, val) in attrs {
            let atv = [tlv(0x06, oid), tlv(0x0c, val.as_bytes())].concat();
            rdns.extend(tlv(0x31, &tlv(0x30, &atv)));
        }
        tlv(0x30, &rdns)
    }

    #[test]
    fn test_common_name_of_subject_not_issuer() {
        let o: &[u8] = &[0x55, 0x04, 0x0a];
        let cn: &[u8] = &[0x55, 0x04, 0x03];
        let tbs = [
            tlv(0xa0, &tlv(0x02, &[2])),
            tlv(0x02, &[1, 2, 3]),
            tlv(0x30, &tlv(0x06, &[0x2a, 0x86, 0x48])),
            name(&[(cn, "the-ca")]),
            tlv(0x30, &[0u8; 200]),
            name(&[(o, "org"), (cn, "bob")]),
            tlv(0x30, &[]),
        ]
        .concat();
        let cert = tlv(
            0x30,
            &[tlv(0x30, &tbs), tlv(0x30, &[]), tlv(0x03, &[0])].concat(),
        );
        assert_eq!(common_name(&cert).as_deref(), Some("bob"));
        assert_eq!(common_name(&cert[..cert.len() - 3]), None);
        assert_eq!(common_name(&[0x30, 0x81]), None);
    }
}
