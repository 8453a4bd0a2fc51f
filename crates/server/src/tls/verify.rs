//! Certificate checks on top of rustls' WebPKI verifiers, as etcd's
//! `baseConfig` adds them: `--peer-cert-allowed-cn` (the certificate's
//! common name is one of the list), `--peer-cert-allowed-hostname` and
//! `--client-cert-allowed-hostname` (its SANs match one of the names).
//! etcd applies the peer lists both to a peer connecting here and to the
//! server certificate of a peer this member dials.

use super::names::{common_name, matches_hostname};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use std::sync::Arc;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::crypto::{
    verify_tls12_signature, verify_tls13_signature, CryptoProvider,
};
use tokio_rustls::rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use tokio_rustls::rustls::{DigitallySignedStruct, DistinguishedName, Error, SignatureScheme};

/// Who a certificate must name, beside being valid.
#[derive(Debug, Clone, Default)]
pub enum Allowed {
    #[default]
    Any,
    /// One of these common names.
    CommonNames(Vec<String>),
    /// A SAN matching one of these host names.
    Hostnames(Vec<String>),
}

impl Allowed {
    /// From the comma-separated CN and hostname flags (exclusive, as in etcd).
    pub fn from_flags(what: &str, cns: &str, hosts: &str) -> anyhow::Result<Allowed> {
        let list = |s: &str| -> Vec<String> {
            s.split(',')
                .map(str::trim)
                .filter(|x| !x.is_empty())
                .map(String::from)
                .collect()
        };
        let (cns, hosts) = (list(cns), list(hosts));
        match (cns.is_empty(), hosts.is_empty()) {
            (true, true) => Ok(Allowed::Any),
            (false, true) => Ok(Allowed::CommonNames(cns)),
            (true, false) => Ok(Allowed::Hostnames(hosts)),
            (false, false) => anyhow::bail!(
                "{what}: AllowedCN and AllowedHostname are mutually exclusive (cn={cns:?}, hostname={hosts:?})"
            ),
        }
    }

    fn check(&self, leaf: &CertificateDer<'_>) -> Result<(), Error> {
        let ok = match self {
            Allowed::Any => true,
            Allowed::CommonNames(cns) => {
                common_name(leaf.as_ref()).is_some_and(|cn| cns.contains(&cn))
            }
            Allowed::Hostnames(hosts) => hosts.iter().any(|h| matches_hostname(leaf.as_ref(), h)),
        };
        if ok {
            Ok(())
        } else {
            // etcd's text
            Err(Error::General(
                "client certificate authentication failed".into(),
            ))
        }
    }

    pub fn is_any(&self) -> bool {
        matches!(self, Allowed::Any)
    }
}

/// A client certificate verifier that also checks [`Allowed`].
#[derive(Debug)]
pub struct AllowedClients {
    pub inner: Arc<dyn ClientCertVerifier>,
    pub allowed: Allowed,
}

impl ClientCertVerifier for AllowedClients {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }
    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }
    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        let v = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        self.allowed.check(end_entity)?;
        Ok(v)
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// How a dialed server's certificate is checked.
#[derive(Debug)]
pub enum ServerCheck {
    /// WebPKI against the trusted roots and the dialed name, then [`Allowed`].
    Verified {
        inner: Arc<dyn ServerCertVerifier>,
        allowed: Allowed,
    },
    /// Any certificate (etcd's `InsecureSkipVerify`, for `--peer-auto-tls`,
    /// whose certificates are self-signed by each member); the handshake
    /// signatures are still checked.
    Unverified(Arc<CryptoProvider>),
}

impl ServerCertVerifier for ServerCheck {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        match self {
            ServerCheck::Verified { inner, allowed } => {
                let v = inner.verify_server_cert(
                    end_entity,
                    intermediates,
                    server_name,
                    ocsp_response,
                    now,
                )?;
                allowed.check(end_entity)?;
                Ok(v)
            }
            ServerCheck::Unverified(_) => Ok(ServerCertVerified::assertion()),
        }
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        match self {
            ServerCheck::Verified { inner, .. } => inner.verify_tls12_signature(message, cert, dss),
            ServerCheck::Unverified(p) => {
                verify_tls12_signature(message, cert, dss, &p.signature_verification_algorithms)
            }
        }
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        match self {
            ServerCheck::Verified { inner, .. } => inner.verify_tls13_signature(message, cert, dss),
            ServerCheck::Unverified(p) => {
                verify_tls13_signature(message, cert, dss, &p.signature_verification_algorithms)
            }
        }
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        match self {
            ServerCheck::Verified { inner, .. } => inner.supported_verify_schemes(),
            ServerCheck::Unverified(p) => p.signature_verification_algorithms.supported_schemes(),
        }
    }
}
