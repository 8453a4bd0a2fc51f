//! gRPC framing for the routes that write their own response bodies
//! (`kv_server`'s Range, `watch_server`): what tonic's generated server
//! does around a body, shared by both; and the client port's refusal of
//! compressed requests.

use tonic::codegen::http;
use tonic::codegen::http::HeaderName;
use tonic::Status;

/// (a constant header name is not parsed again at every lookup)
const GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");

/// Refuses a compressed request as etcd (grpc-go without decompressors)
/// does, before any service sees it: `identity` (or no `grpc-encoding`)
/// passes; anything else is UNIMPLEMENTED.
pub(crate) fn refuse_compressed(headers: &http::HeaderMap) -> Result<(), Status> {
    match headers.get(GRPC_ENCODING) {
        Some(enc) if enc.as_bytes() != b"identity" => Err(Status::unimplemented(format!(
            "grpc: Decompressor is not installed for grpc-encoding \"{}\"",
            String::from_utf8_lossy(enc.as_bytes())
        ))),
        _ => Ok(()),
    }
}

/// A gRPC message's 5-byte prefix: not compressed, its length.
pub(super) fn message_prefix(len: usize) -> Result<[u8; 5], Status> {
    let n = message_len(len)?;
    let b = n.to_be_bytes();
    Ok([0, b[0], b[1], b[2], b[3]])
}

/// A message length as the prefix holds it, or grpc-go's error for one
/// that does not fit.
pub(super) fn message_len(len: usize) -> Result<u32, Status> {
    u32::try_from(len).map_err(|_| {
        Status::resource_exhausted(format!(
            "grpc: trying to send message larger than max ({len} vs. {})",
            u32::MAX
        ))
    })
}

/// The trailers that end a call with `status`. Success (every answered
/// put) is built directly: `grpc-status: 0` alone, which is what tonic's
/// `add_header` writes for it after ~500 instructions of checks.
pub(super) fn trailers(status: &Status) -> Result<http::HeaderMap, Status> {
    if status.code() == tonic::Code::Ok
        && status.message().is_empty()
        && status.details().is_empty()
        && status.metadata().is_empty()
    {
        let mut h = http::HeaderMap::with_capacity(1);
        h.insert(
            crate::api::error_map::GRPC_STATUS,
            http::HeaderValue::from_static("0"),
        );
        return Ok(h);
    }
    let mut h = http::HeaderMap::with_capacity(3);
    status.add_header(&mut h)?;
    Ok(h)
}

/// Marks a response as gRPC (`content-type: application/grpc`).
pub(super) fn set_grpc_content_type<B>(resp: &mut http::Response<B>) {
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_ok_trailers_are_what_tonic_writes() {
        let mut tonic_ok = http::HeaderMap::new();
        Status::ok("").add_header(&mut tonic_ok).unwrap();
        assert_eq!(trailers(&Status::ok("")).unwrap(), tonic_ok);
        let mut with_msg = http::HeaderMap::new();
        Status::ok("x").add_header(&mut with_msg).unwrap();
        assert_eq!(trailers(&Status::ok("x")).unwrap(), with_msg);
    }
}
