//! Who a client certificate names (etcd's `AuthInfoFromTLS`): with
//! `--client-cert-auth`, a request that carries no token acts as the
//! common name of its connection's verified client certificate.
//!
//! The client port's guard (`api::client_port`) sets [`CERT_CN_HEADER`]
//! from the connection's certificate and removes whatever a client sent
//! under that name, so the header the services read is always the one the
//! TLS handshake verified. The lock and election services call the other
//! services in process (not through the port) and pass their caller's
//! header on unchanged.

/// Metadata key under which the client port hands a verified client
/// certificate's common name to the services.
pub const CERT_CN_HEADER: &str = "x-retcd-cert-cn";

/// Sets [`CERT_CN_HEADER`] to the common name of the verified client
/// certificate of the connection `req` came on, never to what the client
/// sent under that name.
pub fn pass_cert_user<B>(req: &mut axum::http::Request<B>) {
    let cn = cert_user(req.extensions());
    let headers = req.headers_mut();
    headers.remove(CERT_CN_HEADER);
    if let Some(v) = cn.and_then(|cn| axum::http::HeaderValue::from_str(&cn).ok()) {
        headers.insert(CERT_CN_HEADER, v);
    }
}

/// The common name of the verified client certificate of the connection a
/// request came on, from its connect info (None: no certificate, or one
/// without a common name).
fn cert_user(ext: &axum::http::Extensions) -> Option<String> {
    type Info = tonic::transport::server::TlsConnectInfo<tonic::transport::server::TcpConnectInfo>;
    let certs = ext.get::<Info>()?.peer_certs()?;
    crate::tls::names::common_name(certs.first()?.as_ref())
}
