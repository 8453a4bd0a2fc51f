//! A minimal HTTP/1.1 GET over a plain `std::net::TcpStream`, bounded in
//! time — enough to probe `/health`, `/version` and friends on a member's
//! client port without an HTTP client dependency.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

/// Status code, lower-cased headers and (de-chunked) body of a response.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpResponse {
    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON.
    pub fn json(&self) -> Result<serde_json::Value> {
        serde_json::from_str(self.body.trim())
            .with_context(|| format!("body is not JSON: {:?}", self.body))
    }
}

/// `GET <path>` on `127.0.0.1:<port>` with `Connection: close`; connect,
/// read and write are each bounded by `timeout`.
pub fn http_get(port: u16, path: &str, timeout: Duration) -> Result<HttpResponse> {
    http_request(port, "GET", path, "", &[], timeout)
}

/// `POST path` with a JSON `body` (the JSON gateway), same as [`http_get`].
pub fn http_post(port: u16, path: &str, body: &str, timeout: Duration) -> Result<HttpResponse> {
    http_request(port, "POST", path, body, &[], timeout)
}

/// [`http_post`] with more request headers (e.g. the gateway's
/// `Grpc-Metadata-…`); a stream's answer is read until the server ends it.
pub fn http_post_with(
    port: u16,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> Result<HttpResponse> {
    http_request(port, "POST", path, body, headers, timeout)
}

fn http_request(
    port: u16,
    method: &str,
    path: &str,
    body: &str,
    extra: &[(&str, &str)],
    timeout: Duration,
) -> Result<HttpResponse> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s =
        TcpStream::connect_timeout(&addr, timeout).with_context(|| format!("connect {addr}"))?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let len = body.len();
    let extra: String = extra.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: retcd-tests\r\nAccept: */*\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n{extra}Connection: close\r\n\r\n{body}"
    )?;
    s.flush()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).context("read response")?;
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> Result<HttpResponse> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| anyhow!("no end of headers in {:?}", String::from_utf8_lossy(raw)))?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut body = raw[split + 4..].to_vec();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.split_whitespace();
    let proto = parts.next().unwrap_or_default();
    if !proto.starts_with("HTTP/1.") {
        bail!("bad status line {status_line:?}");
    }
    let status: u16 = parts
        .next()
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked"));
    if chunked {
        body = dechunk(&body)?;
    } else if let Some(len) = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok())
    {
        body.truncate(len);
    }
    Ok(HttpResponse {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

fn dechunk(mut b: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| anyhow!("truncated chunk header"))?;
        let size_str = String::from_utf8_lossy(&b[..eol]);
        let size = usize::from_str_radix(size_str.split(';').next().unwrap_or("").trim(), 16)
            .with_context(|| format!("bad chunk size {size_str:?}"))?;
        b = &b[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if b.len() < size {
            bail!("truncated chunk");
        }
        out.extend_from_slice(&b[..size]);
        b = b.get(size + 2..).unwrap_or(&[]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_chunked() {
        let r = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nabcdEXTRA").unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "abcd"));
        let r = parse_response(
            b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!((r.status, r.body.as_str()), (503, "abcde"));
    }
}

/// Status (0 if none came), content type (without parameters) and body of
/// a [`raw_exchange`]; the body is `<io error: …>` when the exchange failed.
#[derive(Debug, Clone)]
pub struct RawResp {
    pub status: u16,
    pub ctype: String,
    pub body: String,
}

/// Sends `request` as it is (a whole HTTP/1.1 request, meant with
/// `Connection: close`) to `127.0.0.1:port` and reads the answer until EOF
/// or `until`, whatever it is: what the gateway tests compare byte for
/// byte, malformed requests included.
pub fn raw_exchange(port: u16, request: &[u8], until: std::time::Instant) -> RawResp {
    use std::io::ErrorKind;
    let mut raw = Vec::new();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let connect = until
        .checked_duration_since(std::time::Instant::now())
        .unwrap_or_default()
        .max(Duration::from_millis(10));
    let res = TcpStream::connect_timeout(&addr, connect).and_then(|mut s| {
        s.write_all(request)?;
        let mut buf = [0u8; 8192];
        while let Some(left) = until.checked_duration_since(std::time::Instant::now()) {
            s.set_read_timeout(Some(left.max(Duration::from_millis(10))))?;
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => raw.extend_from_slice(&buf[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    });
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n");
    let split = split.unwrap_or(raw.len());
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let header = |name: &str| {
        let mut kv = head.lines().skip(1).filter_map(|l| l.split_once(':'));
        let v = kv.find(|(k, _)| k.trim() == name).map(|(_, v)| v.trim());
        v.unwrap_or("").split(';').next().unwrap_or("").to_string()
    };
    let mut body = raw.get(split + 4..).unwrap_or(&[]).to_vec();
    if header("transfer-encoding") == "chunked" {
        body = dechunk_complete(&body);
    }
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok());
    RawResp {
        status: status.unwrap_or(0),
        ctype: header("content-type"),
        body: match res {
            Ok(()) => String::from_utf8_lossy(&body).into_owned(),
            Err(e) => format!("<io error: {e}>"),
        },
    }
}

/// The complete chunks of a (possibly unfinished) chunked body.
pub fn dechunk_complete(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size = String::from_utf8_lossy(&b[..eol]);
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16);
        let Some(n) = size.ok().filter(|&n| n > 0 && b.len() >= eol + 2 + n) else {
            break;
        };
        out.extend_from_slice(&b[eol + 2..eol + 2 + n]);
        b = b.get(eol + 4 + n..).unwrap_or(&[]);
    }
    out
}
