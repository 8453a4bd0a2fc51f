//! go-grpc-prometheus's server metrics for the client port, as etcd
//! exports them: `grpc_server_started_total`, `grpc_server_handled_total`
//! (per gRPC code), `grpc_server_msg_received_total`,
//! `grpc_server_msg_sent_total` and, with `--metrics extensive`,
//! `grpc_server_handling_seconds`; plus etcd's own
//! `etcd_network_client_grpc_{received,sent}_bytes_total` (message bytes,
//! as etcd's codec counts them) and `etcd_server_client_requests_total`.
//!
//! Counted in front of the gRPC services (`api::client_port`): it reads
//! the gRPC framing of the request and response bodies (a 5-byte prefix
//! per message) to count
//! messages and their bytes, and the `grpc-status` of the trailers (or of
//! a trailers-only answer) for the code. A response body dropped before
//! its trailers is a call the client cancelled (`Canceled`, as etcd
//! reports a watch stream the client closed).
//!
//! Every method of the services etcd registers before calling
//! `grpc_prometheus.Register` has its children created at start (zeros
//! exported, the 17 codes each); Lock and Election (registered later in
//! etcd) get theirs on first call. The children of each method are made
//! once, so a call only finds its method by path.

use crate::api::error_map::GRPC_STATUS;
use crate::metrics::{extensive, global};
use axum::http;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use prometheus::{Histogram, IntCounter};
use std::pin::Pin;
use std::sync::{LazyLock, OnceLock};
use std::task::{Context, Poll};
use std::time::Instant;
use tonic::body::Body;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Unary,
    ServerStream,
    BidiStream,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Unary => "unary",
            Kind::ServerStream => "server_stream",
            Kind::BidiStream => "bidi_stream",
        }
    }
}

/// (service, method, kind, exported from the start)
const METHODS: &[(&str, &str, Kind, bool)] = {
    use Kind::*;
    &[
        ("etcdserverpb.KV", "Range", Unary, true),
        ("etcdserverpb.KV", "RangeStream", ServerStream, false),
        ("etcdserverpb.KV", "Put", Unary, true),
        ("etcdserverpb.KV", "DeleteRange", Unary, true),
        ("etcdserverpb.KV", "Txn", Unary, true),
        ("etcdserverpb.KV", "Compact", Unary, true),
        ("etcdserverpb.Watch", "Watch", BidiStream, true),
        ("etcdserverpb.Lease", "LeaseGrant", Unary, true),
        ("etcdserverpb.Lease", "LeaseRevoke", Unary, true),
        ("etcdserverpb.Lease", "LeaseKeepAlive", BidiStream, true),
        ("etcdserverpb.Lease", "LeaseTimeToLive", Unary, true),
        ("etcdserverpb.Lease", "LeaseLeases", Unary, true),
        ("etcdserverpb.Cluster", "MemberAdd", Unary, true),
        ("etcdserverpb.Cluster", "MemberRemove", Unary, true),
        ("etcdserverpb.Cluster", "MemberUpdate", Unary, true),
        ("etcdserverpb.Cluster", "MemberList", Unary, true),
        ("etcdserverpb.Cluster", "MemberPromote", Unary, true),
        ("etcdserverpb.Maintenance", "Alarm", Unary, true),
        ("etcdserverpb.Maintenance", "Status", Unary, true),
        ("etcdserverpb.Maintenance", "Defragment", Unary, true),
        ("etcdserverpb.Maintenance", "Hash", Unary, true),
        ("etcdserverpb.Maintenance", "HashKV", Unary, true),
        ("etcdserverpb.Maintenance", "Snapshot", ServerStream, true),
        ("etcdserverpb.Maintenance", "MoveLeader", Unary, true),
        ("etcdserverpb.Maintenance", "Downgrade", Unary, true),
        ("etcdserverpb.Auth", "AuthEnable", Unary, true),
        ("etcdserverpb.Auth", "AuthDisable", Unary, true),
        ("etcdserverpb.Auth", "AuthStatus", Unary, true),
        ("etcdserverpb.Auth", "Authenticate", Unary, true),
        ("etcdserverpb.Auth", "UserAdd", Unary, true),
        ("etcdserverpb.Auth", "UserGet", Unary, true),
        ("etcdserverpb.Auth", "UserList", Unary, true),
        ("etcdserverpb.Auth", "UserDelete", Unary, true),
        ("etcdserverpb.Auth", "UserChangePassword", Unary, true),
        ("etcdserverpb.Auth", "UserGrantRole", Unary, true),
        ("etcdserverpb.Auth", "UserRevokeRole", Unary, true),
        ("etcdserverpb.Auth", "RoleAdd", Unary, true),
        ("etcdserverpb.Auth", "RoleGet", Unary, true),
        ("etcdserverpb.Auth", "RoleList", Unary, true),
        ("etcdserverpb.Auth", "RoleDelete", Unary, true),
        ("etcdserverpb.Auth", "RoleGrantPermission", Unary, true),
        ("etcdserverpb.Auth", "RoleRevokePermission", Unary, true),
        ("grpc.health.v1.Health", "Check", Unary, true),
        ("grpc.health.v1.Health", "Watch", ServerStream, true),
        ("v3lockpb.Lock", "Lock", Unary, false),
        ("v3lockpb.Lock", "Unlock", Unary, false),
        ("v3electionpb.Election", "Campaign", Unary, false),
        ("v3electionpb.Election", "Proclaim", Unary, false),
        ("v3electionpb.Election", "Leader", Unary, false),
        ("v3electionpb.Election", "Observe", ServerStream, false),
        ("v3electionpb.Election", "Resign", Unary, false),
    ]
};

/// gRPC's codes by number, named as go-grpc-prometheus labels them.
const CODES: [&str; 17] = [
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];
/// The header etcd's clients name their API version in.
const CLIENT_API_VERSION: http::HeaderName = http::HeaderName::from_static("client-api-version");

const CANCELED: usize = 1;
const UNKNOWN: usize = 2;

/// One method's children.
struct Children {
    index: usize,
    kind: Kind,
    started: IntCounter,
    handled: [IntCounter; 17],
    received: IntCounter,
    sent: IntCounter,
    /// Only with `--metrics extensive`.
    handling: OnceLock<Histogram>,
}

impl Children {
    fn new(i: usize) -> Children {
        let (service, method, kind, _) = METHODS[i];
        let g = &global().grpc;
        let l = [kind.label(), service, method];
        Children {
            index: i,
            kind,
            started: g.started.with_label_values(&l),
            handled: CODES.map(|c| g.handled.with_label_values(&[l[0], l[1], l[2], c])),
            received: g.msg_received.with_label_values(&l),
            sent: g.msg_sent.with_label_values(&l),
            handling: OnceLock::new(),
        }
    }

    fn handling(&self, i: usize) -> &Histogram {
        self.handling.get_or_init(|| {
            let (service, method, kind, _) = METHODS[i];
            global()
                .grpc
                .handling_seconds
                .with_label_values(&[kind.label(), service, method])
        })
    }

    fn finish(&self, code: usize, started: Instant) {
        self.handled[code.min(16)].inc();
        if extensive() {
            self.handling(self.index)
                .observe(started.elapsed().as_secs_f64());
        }
    }
}

struct Table {
    /// Method index by path (foldhash: looked up on every call).
    by_path: foldhash::HashMap<String, usize>,
    children: Vec<OnceLock<Children>>,
}

static TABLE: LazyLock<Table> = LazyLock::new(|| {
    let children: Vec<OnceLock<Children>> = METHODS.iter().map(|_| OnceLock::new()).collect();
    for (i, m) in METHODS.iter().enumerate() {
        if m.3 {
            let _ = children[i].set(Children::new(i));
        }
    }
    Table {
        by_path: METHODS
            .iter()
            .enumerate()
            .map(|(i, (s, m, _, _))| (format!("/{s}/{m}"), i))
            .collect(),
        children,
    }
});

fn children(path: &str) -> Option<&'static Children> {
    let t = &*TABLE;
    let i = *t.by_path.get(path)?;
    Some(t.children[i].get_or_init(|| Children::new(i)))
}

/// Creates the exported-from-start children now (etcd registers them when
/// its gRPC server is built). Call after `metrics::set_extensive`.
pub fn init() {
    let t = LazyLock::force(&TABLE);
    if extensive() {
        for (i, c) in t.children.iter().enumerate() {
            if let Some(c) = c.get() {
                c.handling(i);
            }
        }
    }
}

/// One client gRPC call of a known method, counted from its start (see
/// the module documentation); `api::client_port` makes one for every call
/// before anything else looks at it.
pub(crate) struct Call {
    c: &'static Children,
    start: Instant,
    in_flight: InFlight,
}

impl Call {
    /// Starts counting a call to `path` (None: not a method of etcd's
    /// services, not counted).
    pub(crate) fn begin(path: &str, headers: &http::HeaderMap) -> Option<Call> {
        let c = children(path)?;
        let in_flight = InFlight::new();
        let start = Instant::now();
        c.started.inc();
        let version = headers
            .get(CLIENT_API_VERSION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("unknown");
        global().client_requests.inc(c.kind != Kind::Unary, version);
        if c.kind == Kind::Unary {
            // go-grpc-prometheus counts a unary call's one request message
            // as the call starts
            c.received.inc();
        }
        Some(Call {
            c,
            start,
            in_flight,
        })
    }

    /// The request body, its messages counted as they arrive, without its
    /// trailers ([`drop_request_trailers`]).
    pub(crate) fn request_body(&self, b: Body) -> Body {
        Body::new(Counted {
            inner: b,
            frames: Frames::default(),
            side: Side::Request(Some(self.c)),
        })
    }

    /// The response, its messages counted as they leave and its status
    /// when it ends (the call is in flight until then).
    pub(crate) fn response(self, mut resp: http::Response<Body>) -> http::Response<Body> {
        crate::api::error_map::grpc_go_size_error(resp.headers_mut());
        // a trailers-only answer: the status is in the headers
        let mut reply = self.into_reply();
        if let Some(code) = resp.headers().get(GRPC_STATUS).map(code_of) {
            reply.finish(code);
        }
        resp.map(|b| {
            Body::new(Counted {
                inner: b,
                frames: Frames::default(),
                side: Side::Response(reply),
            })
        })
    }
}

/// A call's reply: its messages and its status counted as they leave,
/// by [`Counted`] around a response body, or by the body itself (the KV
/// route's unary replies, `kv_server::ReplyBody`: no counting body and
/// its box around them). The call stays in flight until the reply is
/// dropped; a reply dropped before its status is a call the client
/// cancelled.
pub(crate) struct Reply {
    c: &'static Children,
    start: Instant,
    done: bool,
    _in_flight: InFlight,
}

impl Call {
    /// The call whose reply will count itself ([`Reply`]).
    pub(crate) fn into_reply(self) -> Reply {
        Reply {
            c: self.c,
            start: self.start,
            done: false,
            _in_flight: self.in_flight,
        }
    }
}

impl Reply {
    /// A message of `len` bytes goes out.
    fn message(&self, len: u64) {
        self.c.sent.inc();
        global().client_grpc_sent_bytes.inc_by(len);
    }

    /// A message goes out; `prefix` starts with its 5-byte gRPC prefix.
    pub(crate) fn sent(&self, prefix: &[u8]) {
        if let Some(len) = prefix.get(1..5) {
            self.message(u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as u64);
        }
    }

    /// The call ended with gRPC code `code` (only its first end counts).
    pub(crate) fn finish(&mut self, code: usize) {
        if !self.done {
            self.done = true;
            self.c.finish(code, self.start);
        }
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if !self.done {
            // the client went away before the call ended
            self.c.finish(CANCELED, self.start);
        }
    }
}

/// A request message of `len` bytes came in (counted by [`Counted`], or
/// by the KV route for its unary calls).
pub(crate) fn received_bytes(len: u64) {
    global().client_grpc_received_bytes.inc_by(len);
}

// Client gRPC calls in progress: counted in `metrics` (the raft layer's
// read batching reads the count too).
pub(crate) use crate::metrics::{in_flight, InFlight};

fn code_of(v: &http::HeaderValue) -> usize {
    std::str::from_utf8(v.as_bytes())
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .filter(|c| *c < CODES.len())
        .unwrap_or(UNKNOWN)
}

/// Finds message boundaries in a gRPC body (5-byte prefix: compressed
/// flag, big-endian length).
#[derive(Default)]
struct Frames {
    header: [u8; 5],
    have: usize,
    remaining: u64,
}

impl Frames {
    /// Feeds body bytes; `message(len)` for every message header seen.
    fn feed(&mut self, mut data: &[u8], mut message: impl FnMut(u64)) {
        while !data.is_empty() {
            if self.remaining > 0 {
                let n = (self.remaining.min(data.len() as u64)) as usize;
                self.remaining -= n as u64;
                data = &data[n..];
                continue;
            }
            let n = (5 - self.have).min(data.len());
            self.header[self.have..self.have + n].copy_from_slice(&data[..n]);
            self.have += n;
            data = &data[n..];
            if self.have == 5 {
                self.have = 0;
                let len = u32::from_be_bytes([
                    self.header[1],
                    self.header[2],
                    self.header[3],
                    self.header[4],
                ]) as u64;
                message(len);
                self.remaining = len;
            }
        }
    }
}

enum Side {
    /// A request body; None: not counted (a call of no known method),
    /// only its trailers dropped.
    Request(Option<&'static Children>),
    Response(Reply),
}

/// A body whose gRPC messages are counted as they pass.
struct Counted {
    inner: Body,
    frames: Frames,
    side: Side,
}

impl http_body::Body for Counted {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = &mut *self;
        let mut r = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(f))) = &mut r {
            if let Some(t) = f.trailers_mut() {
                crate::api::error_map::grpc_go_size_error(t);
            }
        }
        match (&r, &mut this.side) {
            (Poll::Ready(Some(Ok(f))), Side::Request(_)) if f.is_trailers() => {
                // see `drop_request_trailers`: trailers end the body
                return Poll::Ready(None);
            }
            (Poll::Ready(Some(Ok(f))), Side::Request(Some(c))) => {
                if let Some(d) = f.data_ref() {
                    let streaming = c.kind != Kind::Unary;
                    this.frames.feed(d, |len| {
                        if streaming {
                            c.received.inc();
                        }
                        received_bytes(len);
                    });
                }
            }
            (Poll::Ready(Some(Ok(f))), Side::Response(reply)) => {
                if let Some(d) = f.data_ref() {
                    this.frames.feed(d, |len| reply.message(len));
                } else if let Some(t) = f.trailers_ref() {
                    reply.finish(t.get(GRPC_STATUS).map_or(UNKNOWN, code_of));
                }
            }
            // ended without a status
            (Poll::Ready(None), Side::Response(reply)) => reply.finish(UNKNOWN),
            _ => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A request body without its trailers (the body ends where they would
/// come). gRPC requests carry no trailers, grpc-go ignores any, and tonic
/// would merge them into the call's metadata over the headers: a client
/// could then name itself in `token` or in the certificate header the
/// client port's guard sets (`auth::cert`) after the guard looked.
/// [`Call::request_body`] drops them too (the same body, counted).
pub(crate) fn drop_request_trailers(b: Body) -> Body {
    Body::new(Counted {
        inner: b,
        frames: Frames::default(),
        side: Side::Request(None),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_frames_across_chunks() {
        let mut msg = vec![0u8, 0, 0, 0, 3, b'a', b'b', b'c'];
        msg.extend_from_slice(&[0, 0, 0, 0, 0]); // an empty message
        msg.extend_from_slice(&[0, 0, 0, 0, 2, b'x', b'y']);
        for split in 0..msg.len() {
            let mut f = Frames::default();
            let mut seen = Vec::new();
            f.feed(&msg[..split], |l| seen.push(l));
            f.feed(&msg[split..], |l| seen.push(l));
            assert_eq!(seen, vec![3, 0, 2], "split at {split}");
        }
    }

    #[test]
    fn test_every_method_has_a_path() {
        assert!(children("/etcdserverpb.KV/Put").is_some());
        assert!(children("/v3lockpb.Lock/Lock").is_some());
        assert!(children("/etcdserverpb.KV/Nope").is_none());
        assert_eq!(METHODS.iter().filter(|m| m.3).count(), 43);
    }

    #[test]
    fn test_extensive_exports_handling_seconds() {
        crate::metrics::set_extensive(true);
        init();
        let t = global().render();
        assert!(
            t.contains("grpc_server_handling_seconds_bucket{grpc_method=\"Put\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\",le=\"0.005\"} 0"),
            "{t}"
        );
        assert!(t.contains("# TYPE grpc_server_handling_seconds histogram"));
        // 43 methods x 17 codes, as etcd 3.5.1 exports before any call
        let handled = t
            .lines()
            .filter(|l| l.starts_with("grpc_server_handled_total{"))
            .count();
        assert!(handled >= 43 * 17, "{handled}");
    }
}
