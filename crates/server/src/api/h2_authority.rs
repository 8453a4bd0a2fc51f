//! Client connections, with one repair on the way in: etcdctl 3.4 (and Go
//! clientv3 3.4's per-endpoint calls: `endpoint status`, `endpoint hashkv`,
//! `defrag`, `move-leader`) dial the endpoint string itself as the gRPC
//! target, so its requests carry `:authority: http://127.0.0.1:2379`. Go's
//! server accepts that; Rust's HTTP/2 server (h2) rejects it as a malformed
//! URI authority and resets the stream. `AuthorityFix` wraps the TCP stream
//! and rewrites such an `:authority` value to `127.0.0.1:2379` inside the
//! HEADERS frames the client sends, before h2 parses them. Everything else
//! passes through byte for byte.
//!
//! Why rewriting one literal keeps HPACK consistent: the rewritten value is
//! shorter, so when the client adds the field to its dynamic table, the
//! server's copy of that entry is smaller. Indices count from the newest
//! entry, so every index the client can send (≤ its table's length) still
//! names the same entry on the server, which at worst keeps a few more old
//! entries within the same size limit.
//!
//! Worked example. The client sends HEADERS with the block
//! `41 15 "http://127.0.0.1:2379" …` (literal with incremental indexing,
//! name = static index 1 `:authority`, 21-byte raw value). The wrapper
//! emits `41 0e "127.0.0.1:2379" …` and fixes the frame length. The next
//! request on the connection refers to the pair by index (`be`), which the
//! server's table now resolves to the repaired value.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::server::Connected;

/// The HTTP/2 client connection preface.
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const PREFACE_LEN: usize = PREFACE.len();
const FRAME_HEADER: usize = 9;
const TYPE_HEADERS: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// Frames above this are passed through unparsed, so a connection buffers
/// at most this much: HTTP/2's default SETTINGS_MAX_FRAME_SIZE (16 KiB),
/// which the server advertises, so h2 refuses a larger frame anyway.
const MAX_PARSED_FRAME: usize = 16 * 1024;
/// Bytes read from the socket at a time.
const READ_CHUNK: usize = 16 * 1024;

/// A client connection (plain TCP, or TLS over it) with the repair.
pub struct AuthorityFix<S = TcpStream> {
    inner: S,
    fixer: FrameFixer,
    /// Bytes ready for the reader, from `ready_pos` on.
    ready_pos: usize,
    /// What the socket delivers is read into this (kept, not re-zeroed per
    /// read).
    read_buf: Box<[u8]>,
}

impl<S> AuthorityFix<S> {
    pub fn new(inner: S) -> Self {
        AuthorityFix {
            inner,
            fixer: FrameFixer::default(),
            ready_pos: 0,
            read_buf: vec![0u8; READ_CHUNK].into_boxed_slice(),
        }
    }
}

/// The byte-level part: fed what the socket delivers, it hands on complete
/// frames (repaired) in `ready`, keeping incomplete ones in `pending`.
struct FrameFixer {
    pending: Vec<u8>,
    ready: Vec<u8>,
    /// Preface bytes still to pass through before the first frame.
    preface_left: usize,
    /// Not HTTP/2, or a frame too large to parse: everything passes through.
    passthrough: bool,
}

impl Default for FrameFixer {
    fn default() -> Self {
        FrameFixer {
            pending: Vec::new(),
            ready: Vec::new(),
            preface_left: PREFACE_LEN,
            passthrough: false,
        }
    }
}

impl FrameFixer {
    fn feed(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
        self.process();
    }

    /// At EOF: whatever is pending goes on as it is.
    fn flush(&mut self) {
        let rest = std::mem::take(&mut self.pending);
        self.ready.extend_from_slice(&rest);
    }

    /// Moves every complete frame from `pending` to `ready`, repaired.
    fn process(&mut self) {
        let mut pos = 0;
        let buf = std::mem::take(&mut self.pending);
        loop {
            let rest = &buf[pos..];
            if self.passthrough {
                self.ready.extend_from_slice(rest);
                pos = buf.len();
                break;
            }
            if self.preface_left > 0 {
                // Only HTTP/2 (prior knowledge) is parsed; an HTTP/1.1
                // request (`/health`, the JSON gateway) passes through.
                let n = self.preface_left.min(rest.len());
                let at = PREFACE_LEN - self.preface_left;
                if rest[..n] != PREFACE[at..at + n] {
                    self.passthrough = true;
                    continue;
                }
                self.ready.extend_from_slice(&rest[..n]);
                self.preface_left -= n;
                pos += n;
                if self.preface_left > 0 {
                    break;
                }
                continue;
            }
            if rest.len() < FRAME_HEADER {
                break;
            }
            let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
            if len > MAX_PARSED_FRAME {
                self.passthrough = true;
                continue;
            }
            if rest.len() < FRAME_HEADER + len {
                break;
            }
            let frame = &rest[..FRAME_HEADER + len];
            if frame[3] == TYPE_HEADERS && frame[4] & FLAG_END_HEADERS != 0 {
                match rewrite_headers_frame(frame) {
                    Some(fixed) => self.ready.extend_from_slice(&fixed),
                    None => self.ready.extend_from_slice(frame),
                }
            } else {
                self.ready.extend_from_slice(frame);
            }
            pos += FRAME_HEADER + len;
        }
        let mut buf = buf;
        buf.drain(..pos);
        self.pending = buf;
    }
}

/// The bytes the server's HTTP/2 layer reads from a client that sent
/// `chunks` (one read each) and then closed: the repair without a socket,
/// for tests and the fuzz targets (crates/fuzz).
pub fn repair_stream(chunks: &[&[u8]]) -> Vec<u8> {
    let mut f = FrameFixer::default();
    for c in chunks {
        f.feed(c);
    }
    f.flush();
    f.ready
}

/// Returns the frame with its `:authority` repaired, or None when there is
/// nothing to repair (or the block is not understood: then it is passed on
/// unchanged and h2 judges it).
fn rewrite_headers_frame(frame: &[u8]) -> Option<Vec<u8>> {
    let flags = frame[4];
    let payload = &frame[FRAME_HEADER..];
    let mut start = 0;
    let mut end = payload.len();
    if flags & FLAG_PADDED != 0 {
        let pad = *payload.first()? as usize;
        start = 1;
        end = end.checked_sub(pad)?;
    }
    let prio = if flags & FLAG_PRIORITY != 0 { 5 } else { 0 };
    if start + prio > end {
        return None;
    }
    let block = &payload[start + prio..end];
    let new_block = rewrite_block(block)?;
    let mut out = Vec::with_capacity(frame.len());
    let new_len = prio + new_block.len();
    out.extend_from_slice(&(new_len as u32).to_be_bytes()[1..]);
    out.push(frame[3]);
    out.push(flags & !FLAG_PADDED);
    out.extend_from_slice(&frame[5..9]);
    out.extend_from_slice(&payload[start..start + prio]);
    out.extend_from_slice(&new_block);
    Some(out)
}

/// HPACK integer with an `n`-bit prefix at `b[*i]` (RFC 7541 §5.1).
fn read_int(b: &[u8], i: &mut usize, n: u8) -> Option<usize> {
    let max = (1usize << n) - 1;
    let mut v = (*b.get(*i)? as usize) & max;
    *i += 1;
    if v < max {
        return Some(v);
    }
    let mut shift = 0;
    loop {
        let byte = *b.get(*i)?;
        *i += 1;
        v = v.checked_add(((byte & 0x7f) as usize).checked_shl(shift)?)?;
        if byte & 0x80 == 0 {
            return Some(v);
        }
        shift += 7;
        if shift > 28 {
            return None;
        }
    }
}

fn write_int(out: &mut Vec<u8>, first_bits: u8, n: u8, v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(first_bits | v as u8);
        return;
    }
    out.push(first_bits | max as u8);
    let mut rest = v - max;
    while rest >= 0x80 {
        out.push((rest as u8 & 0x7f) | 0x80);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// Skips a string literal at `b[*i]` without decoding it.
fn skip_string(b: &[u8], i: &mut usize) -> Option<()> {
    let len = read_int(b, i, 7)?;
    b.get(*i..i.checked_add(len)?)?;
    *i += len;
    Some(())
}

/// A string literal at `b[*i]`: (decoded bytes, raw range).
fn read_string(b: &[u8], i: &mut usize) -> Option<Vec<u8>> {
    let huffman = *b.get(*i)? & 0x80 != 0;
    let len = read_int(b, i, 7)?;
    let raw = b.get(*i..i.checked_add(len)?)?;
    *i += len;
    if huffman {
        let mut out = Vec::new();
        httlib_huffman::decode(raw, &mut out, httlib_huffman::DecoderSpeed::FourBits).ok()?;
        Some(out)
    } else {
        Some(raw.to_vec())
    }
}

/// `http://host:port/` → `host:port`; None if `v` has no scheme.
fn repaired(v: &[u8]) -> Option<Vec<u8>> {
    let s = std::str::from_utf8(v).ok()?;
    let rest = s
        .strip_prefix("http://")
        .or_else(|| s.strip_prefix("https://"))?;
    Some(rest.trim_end_matches('/').as_bytes().to_vec())
}

/// Rewrites every literal `:authority` with a scheme in a header block.
/// None when nothing changed or the block is not understood.
///
/// Every request carries a HEADERS frame, so the common case (nothing to
/// repair) is a first walk that decodes only `:authority` values and
/// allocates nothing; the block is rebuilt only when a repair is needed.
fn rewrite_block(b: &[u8]) -> Option<Vec<u8>> {
    if !walk_block(b, None)? {
        return None;
    }
    let mut out = Vec::with_capacity(b.len());
    walk_block(b, Some(&mut out))?;
    Some(out)
}

/// Walks the fields of a header block. Returns whether a literal
/// `:authority` with a scheme is present (without `out`, it stops at the
/// first one); with `out`, writes the block there with each such value
/// repaired. None when the block is not understood.
fn walk_block(b: &[u8], mut out: Option<&mut Vec<u8>>) -> Option<bool> {
    let mut i = 0;
    let mut changed = false;
    while i < b.len() {
        let first = b[i];
        let field_start = i;
        if first & 0x80 != 0 {
            read_int(b, &mut i, 7)?; // indexed field
        } else if first & 0xe0 == 0x20 {
            read_int(b, &mut i, 5)?; // dynamic table size update
        } else {
            // literal: 01 (incremental, 6-bit), 0000 (without), 0001 (never), 4-bit
            let n = if first & 0x40 != 0 { 6 } else { 4 };
            let name_index = read_int(b, &mut i, n)?;
            let name_is_authority = if name_index == 0 {
                read_string(b, &mut i)? == b":authority"
            } else {
                name_index == 1
            };
            let name_end = i;
            if !name_is_authority {
                skip_string(b, &mut i)?;
            } else if let Some(fixed) = repaired(&read_string(b, &mut i)?) {
                changed = true;
                let Some(out) = out.as_deref_mut() else {
                    return Some(true);
                };
                out.extend_from_slice(&b[field_start..name_end]);
                write_int(out, 0x00, 7, fixed.len());
                out.extend_from_slice(&fixed);
                continue;
            }
        }
        if let Some(out) = out.as_deref_mut() {
            out.extend_from_slice(&b[field_start..i]);
        }
    }
    Some(changed)
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            let ready = &mut this.fixer.ready;
            if this.ready_pos < ready.len() {
                let n = (ready.len() - this.ready_pos).min(buf.remaining());
                buf.put_slice(&ready[this.ready_pos..this.ready_pos + n]);
                this.ready_pos += n;
                if this.ready_pos == ready.len() {
                    ready.clear();
                    this.ready_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let mut rb = ReadBuf::new(&mut this.read_buf);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) => {
                    let got = rb.filled();
                    if got.is_empty() {
                        if this.fixer.pending.is_empty() {
                            return Poll::Ready(Ok(())); // EOF
                        }
                        this.fixer.flush();
                        continue;
                    }
                    this.fixer.feed(got);
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<S: crate::api::defer_writes::SendMore> crate::api::defer_writes::SendMore for AuthorityFix<S> {
    fn can_send_more(&self) -> bool {
        self.inner.can_send_more()
    }
    fn poll_send_more(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_send_more(cx, bufs)
    }
    fn push(&self) -> io::Result<()> {
        self.inner.push()
    }
}

impl<S: Connected> Connected for AuthorityFix<S> {
    type ConnectInfo = S::ConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers_frame(block: &[u8], flags: u8) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&(block.len() as u32).to_be_bytes()[1..]);
        f.push(TYPE_HEADERS);
        f.push(flags);
        f.extend_from_slice(&1u32.to_be_bytes());
        f.extend_from_slice(block);
        f
    }

    #[test]
    fn test_raw_authority_with_scheme_is_repaired() {
        // :method POST (idx 3), literal-incremental :authority (idx 1) raw.
        let mut block = vec![0x83, 0x41, 21];
        block.extend_from_slice(b"http://127.0.0.1:2379");
        block.push(0x86); // :scheme http
        let frame = headers_frame(&block, FLAG_END_HEADERS);
        let fixed = rewrite_headers_frame(&frame).expect("rewritten");
        let mut want = vec![0x83, 0x41, 14];
        want.extend_from_slice(b"127.0.0.1:2379");
        want.push(0x86);
        assert_eq!(&fixed[FRAME_HEADER..], &want[..]);
        assert_eq!(fixed[..3], [0, 0, want.len() as u8]);
    }

    #[test]
    fn test_huffman_authority_is_repaired() {
        let mut huff = Vec::new();
        httlib_huffman::encode(b"http://localhost:2379/", &mut huff).unwrap();
        let mut block = vec![0x41];
        write_int(&mut block, 0x80, 7, huff.len());
        block.extend_from_slice(&huff);
        let frame = headers_frame(&block, FLAG_END_HEADERS);
        let fixed = rewrite_headers_frame(&frame).expect("rewritten");
        let mut i = FRAME_HEADER + 1;
        assert_eq!(read_string(&fixed, &mut i).unwrap(), b"localhost:2379");
    }

    #[test]
    fn test_valid_authority_and_other_frames_untouched() {
        let mut block = vec![0x41, 14];
        block.extend_from_slice(b"127.0.0.1:2379");
        assert!(rewrite_headers_frame(&headers_frame(&block, FLAG_END_HEADERS)).is_none());
        // Garbage never panics.
        for n in 0..40u8 {
            let block: Vec<u8> = (0..n).map(|x| x.wrapping_mul(37) ^ 0xa5).collect();
            let _ = rewrite_headers_frame(&headers_frame(&block, FLAG_END_HEADERS | FLAG_PADDED));
            let _ = rewrite_headers_frame(&headers_frame(&block, FLAG_END_HEADERS | FLAG_PRIORITY));
        }
    }

    #[test]
    fn test_http1_passes_through() {
        let req = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1:2379\r\nConnection: close\r\n\r\n";
        let mut f = FrameFixer::default();
        // In small pieces, as a socket may deliver them.
        for chunk in req.chunks(5) {
            f.feed(chunk);
        }
        assert_eq!(f.ready, req.to_vec());
        assert!(f.pending.is_empty());
    }

    #[test]
    fn test_h2_stream_repaired_across_reads() {
        let mut block = vec![0x83, 0x41, 21];
        block.extend_from_slice(b"http://127.0.0.1:2379");
        let headers = headers_frame(&block, FLAG_END_HEADERS);
        let settings = [0u8, 0, 0, 0x4, 0, 0, 0, 0, 0]; // empty SETTINGS
        let mut stream = PREFACE.to_vec();
        stream.extend_from_slice(&settings);
        stream.extend_from_slice(&headers);
        let mut f = FrameFixer::default();
        for chunk in stream.chunks(7) {
            f.feed(chunk);
        }
        let mut want = PREFACE.to_vec();
        want.extend_from_slice(&settings);
        want.extend_from_slice(&rewrite_headers_frame(&headers).unwrap());
        assert_eq!(f.ready, want);
        assert!(f.pending.is_empty());
    }

    #[test]
    fn test_frame_over_cap_is_not_buffered() {
        // A frame header declaring 16 MiB: the fixer must not wait for (and
        // hold) the body; from here on everything passes straight through.
        let mut stream = PREFACE.to_vec();
        stream.extend_from_slice(&[0xff, 0xff, 0xff, TYPE_HEADERS, FLAG_END_HEADERS, 0, 0, 0, 1]);
        let mut f = FrameFixer::default();
        f.feed(&stream);
        assert_eq!(f.ready, stream);
        assert!(f.pending.is_empty());
        for _ in 0..64 {
            f.feed(&[0u8; 4096]);
            assert!(f.pending.is_empty(), "bytes held back after the cap");
        }
        // A frame exactly at the cap is still parsed (held until complete).
        let mut f = FrameFixer::default();
        let mut s = PREFACE.to_vec();
        s.extend_from_slice(&(MAX_PARSED_FRAME as u32).to_be_bytes()[1..]);
        s.extend_from_slice(&[0, 0, 0, 0, 0, 1]);
        f.feed(&s);
        assert_eq!(f.pending.len(), FRAME_HEADER);
        f.feed(&vec![0u8; MAX_PARSED_FRAME]);
        assert!(f.pending.is_empty());
        assert_eq!(f.ready.len(), PREFACE_LEN + FRAME_HEADER + MAX_PARSED_FRAME);
    }

    #[test]
    fn test_long_integers_round_trip() {
        for v in [0usize, 5, 126, 127, 128, 300, 16_384, 1 << 20] {
            let mut b = Vec::new();
            write_int(&mut b, 0, 7, v);
            let mut i = 0;
            assert_eq!(read_int(&b, &mut i, 7), Some(v));
            assert_eq!(i, b.len());
        }
    }
}
