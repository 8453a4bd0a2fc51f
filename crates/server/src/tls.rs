//! TLS for the client and peer ports, with etcd's flags: an `https://`
//! listen URL is served with `--cert-file`/`--key-file` (clients) or
//! `--peer-cert-file`/`--peer-key-file` (peers); `--client-cert-auth` /
//! `--peer-client-cert-auth` require a certificate signed by
//! `--trusted-ca-file` / `--peer-trusted-ca-file`.
//!
//! The server terminates TLS itself (rustls) rather than through tonic, so
//! that client connections get the `:authority` repair
//! (`api::h2_authority`) on the decrypted stream, as plain ones do.
//! Handshakes run in their own tasks, bounded by a timeout, so a slow
//! client never holds up accepting.
//!
//! This member dials `https://` URLs (peers; peers' client URLs for the
//! corruption check and a forwarded promote) through a [`Dialer`], with
//! the peer or client certificate as its identity, trusting the configured
//! CA, or the certificate itself when no CA is given (a self-signed setup).
//! The dialer is handed to whatever dials; nothing here is process-global.
//! Who a verified client certificate names is `auth::cert`'s job.

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
    /// Dials peers' and clients' `https://` URLs.
    pub dialer: Dialer,
}

/// How this member dials other members: their peer URLs with the peer
/// certificate, their client URLs with the client certificate (plain
/// `http://` URLs without TLS). Cheap to clone.
#[derive(Default, Clone)]
pub struct Dialer {
    peer: Option<ClientTlsConfig>,
    client: Option<ClientTlsConfig>,
}

impl Dialer {
    /// An endpoint for a peer URL (`https://` with the peer certificate).
    pub fn peer_endpoint(&self, url: &str) -> Result<Endpoint, tonic::transport::Error> {
        endpoint(url, self.peer.as_ref())
    }

    /// An endpoint for a client URL (`https://` with the client certificate).
    pub fn client_endpoint(&self, url: &str) -> Result<Endpoint, tonic::transport::Error> {
        endpoint(url, self.client.as_ref())
    }
}

/// An endpoint for `url`, with `dial` applied to `https://` URLs.
fn endpoint(
    url: &str,
    dial: Option<&ClientTlsConfig>,
) -> Result<Endpoint, tonic::transport::Error> {
    let ep = Endpoint::from_shared(url.to_string())?;
    match dial {
        Some(t) if url.starts_with("https://") => ep.tls_config(t.clone()),
        _ => Ok(ep),
    }
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
            dialer: Dialer {
                peer: peer.dial()?,
                client: client.dial()?,
            },
        })
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
