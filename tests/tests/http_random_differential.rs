//! A seeded random differential test of the *non-gateway* HTTP endpoints
//! of the client port and of `--listen-metrics-urls`: the same sequence of
//! raw HTTP/1.x requests (and, between them, server state changed over
//! gRPC) goes to a fresh 1-member real etcd 3.5.1 (the reference) and a
//! fresh 1-member target (retcd by default; `RETCD_TEST_FLAVOR=etcd` makes
//! it a second etcd 3.5.1, which checks the generator and the
//! normalisation), started with the same flags.
//!
//! Two pairs of servers run: "open" with etcd's defaults (`--cors` and
//! `--host-whitelist` `*`) and "strict" with a list of CORS origins and
//! of allowed Host names (etcd's access controller answers 421 to
//! others, on insecure URLs only). Each has a metrics URL.
//!
//! Each step is one of:
//! * an HTTP request, written byte for byte on a `TcpStream` (one
//!   connection each, `Connection: close`), to a pair's client or metrics
//!   port: a method (GET, HEAD, POST, PUT, DELETE, OPTIONS, rarely PATCH,
//!   a lower-case or unknown one); a path (`/health`, `/livez`,
//!   `/readyz` and their checks, `/version`, `/metrics`, `/debug/vars`,
//!   `/debug/pprof/...`, `/debug/requests`, `/config/local/log`,
//!   `/v2/...`, `/members`, `/`, unknown ones, gRPC method paths over
//!   HTTP/1.1, a few JSON-gateway shapes: `/v3`, `/v3/`, `/v3/kv`,
//!   `/v3beta`, non-POST methods on `/v3/kv/range` and friends, a POST of
//!   `{}`), mutated or not (a trailing, doubled or inner `//` slash, `/./`,
//!   `/x/../`, a letter in upper case, a percent-encoded character, an
//!   invalid escape); a query (`exclude=NOSPACE|CORRUPT|...`,
//!   `serializable=...`, `verbose`, repeated, empty, bare, percent-encoded,
//!   with `+`, invalid escapes, `&&`); a `Host` (its own address,
//!   `localhost`, an allowed or unknown name, none, two), an `Origin`
//!   (none, allowed, unknown, `null`), a `Content-Type` (none, JSON, text,
//!   `application/grpc`), `Accept-Encoding: gzip`, a body (none, sized,
//!   chunked); HTTP/1.1 or HTTP/1.0; rarely the request targets `*` and
//!   the absolute form;
//! * Maintenance Alarm ACTIVATE / DEACTIVATE of NOSPACE or CORRUPT for
//!   the member itself or for member 0 (etcd keeps an alarm of a member
//!   that is not in the cluster: two alarms of one type), so that the
//!   probes' answers change;
//! * a Put (not once two alarms were raised at once, until none is:
//!   etcd 3.5.1 lets writes through once any alarm is cleared, or refuses
//!   them as the last raised type says, where retcd refuses them while
//!   any alarm is raised, see `cluster_maint_random_differential`'s
//!   `alarm-overlap`).
//!
//! Compared per HTTP step: the status code; the headers a client reads:
//! `content-type`, `allow`, `location`, `content-encoding`,
//! `x-content-type-options` and the three CORS headers (not `date`,
//! `content-length`, `transfer-encoding`, `connection`, nor the reason
//! phrase); the body (gunzipped when `content-encoding: gzip`), as it is
//! but for:
//! * `/version`: `etcdserver` as major.minor (3.5.1 against the 3.5.x
//!   retcd reports), retcd's own extra `retcd` field dropped (on purpose,
//!   see docs/design.md "Versions"); key order compared;
//! * `/metrics` (a 200, but to HEAD): only which of [`METRICS`] (well-known
//!   etcd metric names) it exposes;
//! * `/debug/vars` (a 200): the sorted top-level keys, the number of
//!   `cmdline` arguments, `file_descriptor_limit` being a number, and
//!   `raft.status`'s keys, `raftState`, whether `lead` and `vote` are the
//!   member's `id` and how many `progress` entries it has; `memstats` (Go's
//!   runtime statistics) is not compared (retcd, with no Go runtime, has
//!   none: on purpose);
//! * `/health` 503 whose reason is "ALARM X" while two alarm types could
//!   be the one named: etcd 3.5 walks its alarms in Go map order, so the
//!   reason is "ALARM <raised>" then;
//! * `/livez`, `/readyz` lines sorted (etcd runs the checks in Go map
//!   order), the closing `ok` kept last.
//!
//! A gRPC step compares the answer's code and message, or the raised
//! alarms it lists (member IDs as `me` / `0`).
//!
//! On purpose (against retcd only; each counted and named in the
//! summary): where retcd follows a newer etcd, the expected answer is the
//! newer etcd's, computed by a model written from its source (etcd 3.5.24,
//! the version retcd reports, `server/etcdserver/api/etcdhttp/health.go`),
//! with the reference's CORS headers, instead of etcd 3.5.1's:
//! * `livez-readyz`: `/livez`, `/readyz` and their per-check paths exist
//!   from 3.5.11 on, on the client and metrics URLs (3.5.1: 404). The
//!   model: GET only (else 405, `Allow: GET`); the root runs every check
//!   less the `exclude`d ones (unknown names ignored), a check's path runs
//!   it alone; a failure answers 503 with a line per check and an empty
//!   line (`http.Error`), a success `ok` after the lines when `verbose` is
//!   in the query; `data_corruption` fails while a CORRUPT alarm is raised
//!   ("alarm activated: CORRUPT"), the reads and `non_learner` pass on a
//!   healthy 1-member voter.
//! * `health-3.5.24`: `/health` with an `exclude` of a type two alarms
//!   have (etcd 3.5.1's `checkHealth` deletes an excluded type from the
//!   set at its first alarm, so the second one fails the check; 3.5.24's
//!   `checkAlarms` skips every alarm of an excluded type), or with a `;`
//!   in the query (Go 1.16, which built 3.5.1, splits the query at `;` as
//!   at `&`; Go 1.17+ drops a pair with a `;`).
//!
//! Left out, and why:
//! * `/health?serializable=true` against a member without a leader
//!   (etcd 3.5.3+ skips the leader check, 3.5.1 does not; retcd follows
//!   3.5.3+): a 1-member cluster always has its leader, so both answer
//!   alike here; `ops.rs`' `health_endpoints_as_etcd` holds it;
//! * `--enable-pprof` (Go's pprof handlers; retcd serves only
//!   `/debug/pprof/profile`, which samples for seconds): every
//!   `/debug/pprof/...` path is asked without it (404 on both);
//! * a fragment (`#x`) in the request target: hyper's URI parser drops
//!   it, Go routes it as part of the path (404);
//! * a malformed `Content-Length` and other framing errors (a chunked
//!   HTTP/1.0 body, which Go reads and hyper refuses): hyper answers 400
//!   with an empty body before any handler, Go with `400 Bad Request` as
//!   text; and a body with HEAD (Go reads none and takes the bytes for a
//!   next request);
//! * the body of an answer to HEAD (never read; Go's server writes its
//!   own 400 text even then, hyper never sends one);
//! * `Accept` asking for Prometheus' protobuf format on `/metrics`
//!   (promhttp would answer it; retcd writes only the text format);
//! * the gateway's own paths with a body (`gateway_random_differential`).
//!
//! A run first replays [`prelude`] (each difference the seeded steps
//! found in retcd, reduced, and the on-purpose cases), then the seeded
//! steps, on the same servers.
//!
//! Against retcd the test found (787 of 2545 steps of seed 1 differed),
//! all fixed in `crates/server/src/api` (`http::go_front` in front of
//! both ports' routes):
//! * Go's `ServeMux` was not followed: a path that is not clean (`//x`,
//!   `/./x`, `/a/../x`) is a 301 to its clean form, the query kept (retcd:
//!   404); routing is on the percent-decoded path (`/%68ealth`,
//!   `/v3/kv%2Frange`; retcd: 404); `/v3?q` redirects to `/v3/?q` (retcd
//!   dropped the query); the target `*` is 400;
//! * Go's server: an HTTP/1.1 request without `Host` or with two, or
//!   with an invalid `%` escape in its path, is 400 with Go's text (retcd
//!   served it), `OPTIONS *` is 200 without CORS headers (retcd: with
//!   them on the client URL, 404 on the metrics URL);
//! * a gRPC method path over HTTP/1.1 with `Content-Type:
//!   application/grpc` is an HTTP request (404), as etcd's cmux hands
//!   every HTTP/1 connection to its HTTP server (retcd answered gRPC);
//! * etcd's access controller ran only for paths a route had: on the
//!   others a listed CORS origin got no CORS headers, OPTIONS none, an
//!   unlisted Host no 421; and an absolute-form target's host is the one
//!   checked (Go's `r.Host`; retcd checked the `Host` header);
//! * `/debug/vars` (etcd's expvar: `cmdline`, `file_descriptor_limit`,
//!   `raft.status`) was not served (404, 404 to other methods for 405);
//! * `/version` wrote `etcdcluster` before `etcdserver`;
//! * `/metrics` was never gzipped (promhttp gzips when `Accept-Encoding`
//!   has a part `gzip` or `gzip;...`);
//! * against the 3.5.24 model: `/readyz?verbose` listed excluded checks
//!   (`[+]x excluded: ok`; etcd runs and lists only the others), and the
//!   query was read with Rust's form decoding, which keeps a pair with an
//!   invalid escape (`verbose=%zz`) that Go drops.
//!
//! `RETCD_HTTP_DIFF_SEED` (default 1) and `RETCD_HTTP_DIFF_STEPS`
//! (default 2500, a few seconds) replay and size a run;
//! `RETCD_HTTP_DIFF_TRACE=1` prints every step and both answers;
//! `RETCD_HTTP_DIFF_SHOW` (default 20) is how many differing steps are
//! printed;
//! `RETCD_HTTP_DIFF_TARGET_BIN` runs another binary of the flavour as the
//! target.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use retcd_api::etcdserverpb::{
    alarm_request::AlarmAction, kv_client::KvClient, maintenance_client::MaintenanceClient,
    AlarmRequest, AlarmType, PutRequest, StatusRequest,
};
use retcd_tests::http::dechunk_complete;
use retcd_tests::random_diff::{answer, env_u64, Dice};
use retcd_tests::{
    bounded, etcd351_bin, free_port, limit::NORMAL as LIMIT, test_flavor, Cluster, Flavor, FAST,
};
use tokio::time::timeout;
use tonic::transport::Channel;

/// Each request's bound.
const CALL: Duration = Duration::from_secs(10);

/// The strict pair's extra flags: CORS for two origins, three Host names.
const STRICT_FLAGS: [&str; 2] = [
    "--cors=http://ok.example:8080,http://also.example:9090",
    "--host-whitelist=127.0.0.1,localhost,ok.example",
];

/// Origins a request may name.
const ORIGINS: [&str; 5] = [
    "http://ok.example:8080",
    "http://also.example:9090",
    "http://evil.example:8080",
    "null",
    "http://ok.example",
];

/// Well-known etcd metrics: both servers must expose the same of these.
const METRICS: [&str; 33] = [
    "etcd_server_has_leader",
    "etcd_server_is_leader",
    "etcd_server_leader_changes_seen_total",
    "etcd_server_proposals_committed_total",
    "etcd_server_proposals_applied_total",
    "etcd_server_proposals_pending",
    "etcd_server_proposals_failed_total",
    "etcd_server_health_success",
    "etcd_server_health_failures",
    "etcd_server_version",
    "etcd_cluster_version",
    "etcd_server_quota_backend_bytes",
    "etcd_server_id",
    "etcd_server_go_version",
    "etcd_server_heartbeat_send_failures_total",
    "etcd_server_slow_apply_total",
    "etcd_server_slow_read_indexes_total",
    "etcd_server_read_indexes_failed_total",
    "etcd_server_learner_promote_successes",
    "etcd_mvcc_db_total_size_in_bytes",
    "etcd_mvcc_db_total_size_in_use_in_bytes",
    "etcd_mvcc_put_total",
    "etcd_mvcc_range_total",
    "etcd_debugging_mvcc_current_revision",
    "etcd_debugging_mvcc_compact_revision",
    "etcd_debugging_lease_granted_total",
    "etcd_disk_wal_fsync_duration_seconds_count",
    "etcd_disk_backend_commit_duration_seconds_count",
    "etcd_snap_db_save_total_duration_seconds_count",
    "etcd_network_client_grpc_received_bytes_total",
    "etcd_network_client_grpc_sent_bytes_total",
    "grpc_server_started_total",
    "process_open_fds",
];

/// The paths of etcd 3.5.11+'s `/livez` and `/readyz` (see the doc).
const PROBE_ROUTES: [&str; 7] = [
    "/livez",
    "/livez/serializable_read",
    "/readyz",
    "/readyz/data_corruption",
    "/readyz/serializable_read",
    "/readyz/linearizable_read",
    "/readyz/non_learner",
];

/// The headers compared.
const HEADERS: [&str; 8] = [
    "content-type",
    "allow",
    "location",
    "content-encoding",
    "x-content-type-options",
    "access-control-allow-origin",
    "access-control-allow-methods",
    "access-control-allow-headers",
];

/// Which port of a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Port {
    Client,
    Metrics,
}

/// The request's `Host` header.
#[derive(Debug, Clone, Copy)]
enum Host {
    /// `127.0.0.1:<port>`
    Own,
    /// `localhost:<port>`
    Localhost,
    /// this name, no port
    Named(&'static str),
    /// none
    Missing,
    /// two: the own one twice
    Twice,
}

/// The request's body.
#[derive(Debug, Clone)]
enum Body {
    None,
    Sized(String),
    Chunked(String),
}

/// One raw HTTP request (see the module doc).
#[derive(Debug, Clone)]
struct HttpReq {
    method: String,
    /// The request target; `PORT` is the server's port (absolute form).
    target: String,
    version: &'static str,
    host: Host,
    headers: Vec<(String, String)>,
    body: Body,
}

impl HttpReq {
    fn get(target: &str) -> HttpReq {
        HttpReq {
            method: "GET".into(),
            target: target.into(),
            version: "HTTP/1.1",
            host: Host::Own,
            headers: Vec::new(),
            body: Body::None,
        }
    }

    fn method(mut self, m: &str) -> HttpReq {
        self.method = m.into();
        self
    }

    fn header(mut self, k: &str, v: &str) -> HttpReq {
        self.headers.push((k.into(), v.into()));
        self
    }

    fn host(mut self, h: Host) -> HttpReq {
        self.host = h;
        self
    }

    fn body(mut self, b: &str) -> HttpReq {
        self.body = Body::Sized(b.into());
        self
    }

    /// The bytes sent to a server listening on `port`.
    fn render(&self, port: u16) -> Vec<u8> {
        let mut s = format!(
            "{} {} {}\r\n",
            self.method,
            self.target.replace("PORT", &port.to_string()),
            self.version
        );
        match self.host {
            Host::Own => s.push_str(&format!("Host: 127.0.0.1:{port}\r\n")),
            Host::Localhost => s.push_str(&format!("Host: localhost:{port}\r\n")),
            Host::Named(h) => s.push_str(&format!("Host: {h}\r\n")),
            Host::Missing => {}
            Host::Twice => s.push_str(&format!(
                "Host: 127.0.0.1:{port}\r\nHost: 127.0.0.1:{port}\r\n"
            )),
        }
        for (k, v) in &self.headers {
            s.push_str(&format!("{k}: {v}\r\n"));
        }
        let body = match &self.body {
            Body::None => String::new(),
            Body::Sized(b) => {
                s.push_str(&format!("Content-Length: {}\r\n", b.len()));
                b.clone()
            }
            Body::Chunked(b) => {
                s.push_str("Transfer-Encoding: chunked\r\n");
                if b.is_empty() {
                    "0\r\n\r\n".to_string()
                } else {
                    format!("{:x}\r\n{b}\r\n0\r\n\r\n", b.len())
                }
            }
        };
        s.push_str("Connection: close\r\n\r\n");
        s.push_str(&body);
        s.into_bytes()
    }

    /// The request line and headers as the failure report shows them.
    fn show(&self) -> String {
        let raw = String::from_utf8_lossy(&self.render(0)).replace(":0\r\n", ":PORT\r\n");
        format!("{raw:?}")
    }
}

/// Who an alarm is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Who {
    Me,
    Zero,
}

/// One step of the sequence; `pair` is 0 (open) or 1 (strict).
#[derive(Debug, Clone)]
enum Step {
    Http {
        pair: usize,
        port: Port,
        req: HttpReq,
    },
    Alarm {
        pair: usize,
        activate: bool,
        alarm: AlarmType,
        who: Who,
    },
    Put {
        pair: usize,
    },
}

impl Step {
    fn show(&self) -> String {
        match self {
            Step::Http { pair, port, req } => {
                format!("{} {port:?} {}", PAIR_NAMES[*pair], req.show())
            }
            other => format!("{other:?}"),
        }
    }
}

const PAIR_NAMES: [&str; 2] = ["open", "strict"];

/// A raw HTTP answer: status (0: none), headers (lower-case names, as
/// sent), body (de-chunked), or the I/O error that ended the exchange
/// before any byte came.
#[derive(Debug, Clone, Default)]
struct Raw {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    error: Option<String>,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Sends `bytes` to `127.0.0.1:port` and reads until EOF (or [`CALL`]).
fn exchange(port: u16, bytes: &[u8]) -> Raw {
    use std::io::ErrorKind;
    let until = Instant::now() + CALL;
    let mut raw = Vec::new();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let res = TcpStream::connect_timeout(&addr, CALL).and_then(|mut s| {
        s.write_all(bytes)?;
        let mut buf = [0u8; 16384];
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            s.set_read_timeout(Some(left.max(Duration::from_millis(10))))?;
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => raw.extend_from_slice(&buf[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                // a reset after the answer (Go closes a connection it
                // refused with bytes unread): keep what came
                Err(e) if !raw.is_empty() => {
                    let _ = e;
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    });
    let mut out = Raw::default();
    if let Err(e) = res {
        out.error = Some(e.to_string());
        return out;
    }
    let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        out.error = Some(format!(
            "no end of headers in {:?}",
            String::from_utf8_lossy(&raw)
        ));
        return out;
    };
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    out.status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    out.headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if out
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        body = dechunk_complete(&body);
    } else if let Some(n) = out.header("content-length").and_then(|v| v.parse().ok()) {
        body.truncate(n);
    }
    out.body = body;
    out
}

// ---------------------------------------------------------------------
// Go's URL handling, as the reference and the models read a request.

/// Go's `url.unescape`: `%XX` decoded (an invalid escape is an error);
/// in a query, `+` is a space.
fn go_unescape(s: &str, query: bool) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = b.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                if !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
                    return None;
                }
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' if query => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Some(out)
}

/// Go's `url.ParseQuery` as `r.URL.Query()` uses it: pairs split at `&`
/// (and at `;` before Go 1.17, `go116`; from 1.17 on a pair holding a
/// `;` is dropped), a pair with an invalid escape dropped.
fn go_query(raw: &str, go116: bool) -> Vec<(String, String)> {
    let seps: &[char] = if go116 { &['&', ';'] } else { &['&'] };
    let mut out = Vec::new();
    for pair in raw.split(seps) {
        if pair.is_empty() || (!go116 && pair.contains(';')) {
            continue;
        }
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let (Some(k), Some(v)) = (go_unescape(k, true), go_unescape(v, true)) else {
            continue;
        };
        out.push((
            String::from_utf8_lossy(&k).into_owned(),
            String::from_utf8_lossy(&v).into_owned(),
        ));
    }
    out
}

/// A request target's decoded path and raw query, as Go's server reads
/// it (`*` and invalid escapes: None).
fn go_target(target: &str) -> Option<(String, Option<String>)> {
    let t = match target.strip_prefix("http://") {
        Some(rest) => &rest[rest.find('/')?..],
        None => target,
    };
    if !t.starts_with('/') {
        return None;
    }
    let (p, q) = match t.split_once('?') {
        Some((p, q)) => (p, Some(q.to_string())),
        None => (t, None),
    };
    let p = go_unescape(p, false)?;
    Some((String::from_utf8_lossy(&p).into_owned(), q))
}

/// Go's `path.Clean` as `ServeMux` applies it (`cleanPath`: a trailing
/// slash kept).
fn go_clean(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    let mut out = format!("/{}", parts.join("/"));
    if p.ends_with('/') && out != "/" {
        out.push('/');
    }
    out
}

// ---------------------------------------------------------------------
// What a pair's servers hold, as the test tracks it.

/// The alarms raised on a pair (as the reference answered).
#[derive(Debug, Clone, Default)]
struct PairState {
    alarms: BTreeSet<(Who, i32)>,
    /// Two alarms were raised at once since the set was last empty.
    overlapped: bool,
}

impl PairState {
    fn types(&self) -> BTreeSet<i32> {
        self.alarms.iter().map(|(_, t)| *t).collect()
    }

    fn count(&self, t: i32) -> usize {
        self.alarms.iter().filter(|(_, a)| *a == t).count()
    }

    fn corrupt(&self) -> bool {
        self.count(AlarmType::Corrupt as i32) > 0
    }
}

fn alarm_name(t: i32) -> &'static str {
    match AlarmType::try_from(t) {
        Ok(AlarmType::Nospace) => "NOSPACE",
        Ok(AlarmType::Corrupt) => "CORRUPT",
        _ => "UNKNOWN",
    }
}

// ---------------------------------------------------------------------
// etcd 3.5.24's handlers, for the on-purpose cases (see the module doc).

/// Go's `http.Error(w, text, code)`.
fn go_error(status: u16, text: &str, head: bool) -> Raw {
    Raw {
        status,
        headers: vec![
            ("content-type".into(), "text/plain; charset=utf-8".into()),
            ("x-content-type-options".into(), "nosniff".into()),
        ],
        body: if head {
            Vec::new()
        } else {
            format!("{text}\n").into_bytes()
        },
        error: None,
    }
}

fn not_allowed(head: bool) -> Raw {
    let mut r = go_error(405, "Method Not Allowed", head);
    r.headers.push(("allow".into(), "GET".into()));
    r
}

/// 3.5.24's `/livez`, `/readyz` and their checks.
fn model_probe(path: &str, method: &str, query: &[(String, String)], st: &PairState) -> Raw {
    let head = method == "HEAD";
    if method != "GET" {
        return not_allowed(head);
    }
    let rest = path.strip_prefix('/').unwrap_or(path);
    let (root, only) = match rest.split_once('/') {
        Some((root, check)) => (root, Some(check)),
        None => (rest, None),
    };
    let all: &[&str] = if root == "livez" {
        &["serializable_read"]
    } else {
        &[
            "data_corruption",
            "serializable_read",
            "linearizable_read",
            "non_learner",
        ]
    };
    let excluded: Vec<&str> = query
        .iter()
        .filter(|(k, v)| k == "exclude" && !v.is_empty())
        .map(|(_, v)| v.as_str())
        .collect();
    let checks: Vec<&str> = match only {
        Some(c) => vec![c],
        None => all
            .iter()
            .copied()
            .filter(|c| !excluded.contains(c))
            .collect(),
    };
    let mut lines = String::new();
    let mut failed = false;
    for c in checks {
        if c == "data_corruption" && st.corrupt() {
            failed = true;
            lines.push_str("[-]data_corruption failed: alarm activated: CORRUPT\n");
        } else {
            lines.push_str(&format!("[+]{c} ok\n"));
        }
    }
    if failed {
        return go_error(503, &lines, head);
    }
    let verbose = query.iter().any(|(k, _)| k == "verbose");
    let body = if verbose {
        format!("{lines}ok\n")
    } else {
        "ok\n".into()
    };
    Raw {
        status: 200,
        headers: vec![
            ("content-type".into(), "text/plain; charset=utf-8".into()),
            ("x-content-type-options".into(), "nosniff".into()),
        ],
        body: body.into_bytes(),
        error: None,
    }
}

/// 3.5.24's `/health` on a healthy 1-member leader.
fn model_health(method: &str, query: &[(String, String)], st: &PairState) -> Raw {
    let head = method == "HEAD";
    if method != "GET" {
        return not_allowed(head);
    }
    let excluded = excluded_alarms(query);
    if let Some(t) = st
        .types()
        .into_iter()
        .find(|t| !excluded.contains(alarm_name(*t)))
    {
        let body = format!(r#"{{"health":"false","reason":"ALARM {}"}}"#, alarm_name(t));
        return go_error(503, &body, head);
    }
    Raw {
        status: 200,
        headers: vec![("content-type".into(), "text/plain; charset=utf-8".into())],
        body: br#"{"health":"true","reason":""}"#.to_vec(),
        error: None,
    }
}

fn excluded_alarms(query: &[(String, String)]) -> BTreeSet<String> {
    query
        .iter()
        .filter(|(k, v)| k == "exclude" && !v.is_empty())
        .map(|(_, v)| v.clone())
        .collect()
}

/// The on-purpose case a request falls in against retcd, and the answer
/// expected then (the model's, with the reference's CORS headers).
fn on_purpose(req: &HttpReq, reference: &Raw, st: &PairState) -> Option<(&'static str, Raw)> {
    let (path, q) = go_target(&req.target)?;
    let raw_q = q.unwrap_or_default();
    let query = go_query(&raw_q, false);
    let not_found = reference.status == 404
        && (reference.body == b"404 page not found\n"
            || (req.method == "HEAD" && reference.header("x-content-type-options").is_some()));
    let mut model = if not_found && PROBE_ROUTES.contains(&path.as_str()) {
        ("livez-readyz", model_probe(&path, &req.method, &query, st))
    } else if path == "/health"
        && req.method == "GET"
        && matches!(reference.status, 200 | 503)
        && (raw_q.contains(';')
            || excluded_alarms(&query).iter().any(|e| {
                st.types()
                    .iter()
                    .any(|t| alarm_name(*t) == e && st.count(*t) > 1)
            }))
    {
        ("health-3.5.24", model_health(&req.method, &query, st))
    } else {
        return None;
    };
    for (k, v) in &reference.headers {
        if k.starts_with("access-control-") {
            model.1.headers.push((k.clone(), v.clone()));
        }
    }
    Some(model)
}

// ---------------------------------------------------------------------
// What is compared.

/// How a step's answers are read: the request, the pair's alarms and
/// which etcd's `/health` alarm walk applies (3.5.1's, or 3.5.24's for a
/// model's answer).
struct Cx<'a> {
    req: &'a HttpReq,
    /// The server's port (written `PORT` in answers).
    port: u16,
    st: &'a PairState,
    go116: bool,
}

/// An HTTP answer as compared (see the module doc).
fn view(r: &Raw, cx: &Cx) -> String {
    if let Some(e) = &r.error {
        return format!("(no answer: {e})");
    }
    let mut hs: Vec<(&str, &str)> = r
        .headers
        .iter()
        .filter(|(k, _)| HEADERS.contains(&k.as_str()))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    hs.sort();
    let mut body = r.body.clone();
    if r.header("content-encoding") == Some("gzip") {
        let mut out = Vec::new();
        match flate2::read::GzDecoder::new(&body[..]).read_to_end(&mut out) {
            Ok(_) => body = out,
            Err(e) => body = format!("(bad gzip: {e})").into_bytes(),
        }
    }
    if cx.req.method == "HEAD" {
        // never read (Go's server writes its own 400 text even to HEAD;
        // hyper sends no body to HEAD)
        body.clear();
    }
    let text = String::from_utf8_lossy(&body).into_owned();
    let target = go_target(&cx.req.target);
    let path = target.as_ref().map(|(p, _)| p.as_str()).unwrap_or("");
    let query = target
        .as_ref()
        .and_then(|(_, q)| q.as_deref())
        .map(|q| go_query(q, cx.go116))
        .unwrap_or_default();
    let reached = r.header("location").is_none();
    let body = match (path, r.status) {
        ("/metrics", 200) if cx.req.method != "HEAD" && reached => {
            let present: Vec<&str> = METRICS
                .iter()
                .copied()
                .filter(|m| {
                    text.lines().any(|l| {
                        l.strip_prefix(m)
                            .is_some_and(|rest| rest.starts_with([' ', '{']))
                    })
                })
                .collect();
            format!("(metrics: {})", present.join(" "))
        }
        ("/version", 200) if !text.is_empty() => version_view(&text),
        ("/debug/vars", 200) if !text.is_empty() => vars_view(&text),
        ("/health", 503) => health_view(&text, &query, cx),
        (p, 200 | 503) if PROBE_ROUTES.contains(&p) => {
            let mut lines: Vec<&str> = text.lines().collect();
            let last = if text.ends_with("ok\n") && !lines.is_empty() {
                lines.pop()
            } else {
                None
            };
            lines.sort();
            lines.extend(last);
            lines.join("|")
        }
        _ => format!("{text:?}"),
    };
    let mut body = body.replace(&format!(":{}", cx.port), ":PORT");
    if body.len() > 600 {
        let mut end = 600;
        while !body.is_char_boundary(end) {
            end -= 1;
        }
        body = format!("{}…({} bytes)", &body[..end], body.len());
    }
    let hs: Vec<(&str, String)> = hs
        .into_iter()
        .map(|(k, v)| (k, v.replace(&format!(":{}", cx.port), ":PORT")))
        .collect();
    format!("{} {hs:?} {body}", r.status)
}

/// `/version`: keys in order, `etcdserver` as major.minor, no `retcd`.
fn version_view(text: &str) -> String {
    let Ok(serde_json::Value::Object(m)) = serde_json::from_str::<serde_json::Value>(text) else {
        return format!("(not JSON: {text:?})");
    };
    let order = retcd_tests::random_diff::key_order(text);
    let mut out = Vec::new();
    for k in order
        .first()
        .map(|o| o.split(',').collect::<Vec<_>>())
        .unwrap_or_default()
    {
        if k == "retcd" {
            continue;
        }
        let v = m.get(k).cloned().unwrap_or_default();
        let v = match (k, v.as_str()) {
            ("etcdserver", Some(s)) => s.split('.').take(2).collect::<Vec<_>>().join("."),
            _ => v.to_string(),
        };
        out.push(format!("{k}={v}"));
    }
    format!("(version: {})", out.join(" "))
}

/// `/debug/vars` (see the module doc).
fn vars_view(text: &str) -> String {
    let Ok(serde_json::Value::Object(mut m)) = serde_json::from_str::<serde_json::Value>(text)
    else {
        return format!("(not JSON: {:?})", &text[..text.len().min(200)]);
    };
    m.remove("memstats");
    let keys: Vec<&String> = m.keys().collect();
    let args = m["cmdline"].as_array().map(|a| a.len());
    let fds = m
        .get("file_descriptor_limit")
        .map(|v| v.is_u64())
        .unwrap_or(false);
    let raft = match m.get("raft.status") {
        Some(serde_json::Value::Object(r)) => {
            let id = r.get("id");
            format!(
                "keys {:?} state {} lead-is-id {} vote-is-id {} progress {:?}",
                r.keys().collect::<Vec<_>>(),
                r.get("raftState").cloned().unwrap_or_default(),
                r.get("lead") == id,
                r.get("vote") == id,
                r.get("progress")
                    .and_then(|p| p.as_object())
                    .map(|p| p.len()),
            )
        }
        other => format!("{other:?}"),
    };
    format!("(vars: keys {keys:?} cmdline args {args:?} fd limit a number {fds} raft {raft})")
}

/// `/health`'s 503: the reason "ALARM <raised>" when two alarm types
/// could be the one named (see the module doc).
fn health_view(text: &str, query: &[(String, String)], cx: &Cx) -> String {
    let excluded = excluded_alarms(query);
    // the types whose alarm may fail the check: not excluded, or (3.5.1)
    // excluded but held by two members
    let candidates: Vec<&str> = cx
        .st
        .types()
        .into_iter()
        .filter(|t| !excluded.contains(alarm_name(*t)) || (cx.go116 && cx.st.count(*t) > 1))
        .map(alarm_name)
        .collect();
    let mut text = text.to_string();
    if candidates.len() > 1 {
        for c in &candidates {
            text = text.replace(&format!("\"ALARM {c}\""), "\"ALARM <raised>\"");
        }
    }
    format!("{text:?}")
}

// ---------------------------------------------------------------------
// The servers.

struct Server {
    client: u16,
    metrics: u16,
    chan: Channel,
    me: u64,
    _cluster: Cluster,
}

impl Server {
    async fn start(flavor: Flavor, bin: std::path::PathBuf, extra: &[&str]) -> Server {
        let metrics = free_port();
        let mflag = format!("--listen-metrics-urls=http://127.0.0.1:{metrics}");
        let mut flags: Vec<&str> = FAST.to_vec();
        flags.push(&mflag);
        flags.extend_from_slice(extra);
        let c = Cluster::start_with_binary(flavor, bin, 1, &flags)
            .await
            .expect("start a server");
        let m = &c.members[0];
        let chan = Channel::from_shared(m.endpoint())
            .expect("url")
            .connect()
            .await
            .expect("connect");
        let st = MaintenanceClient::new(chan.clone())
            .status(StatusRequest {})
            .await
            .expect("status");
        let me = st.get_ref().header.as_ref().map_or(0, |h| h.member_id);
        Server {
            client: m.client_port,
            metrics,
            chan,
            me,
            _cluster: c,
        }
    }

    fn port(&self, p: Port) -> u16 {
        match p {
            Port::Client => self.client,
            Port::Metrics => self.metrics,
        }
    }

    /// A gRPC step's answer.
    async fn call(&self, step: &Step) -> String {
        match step {
            Step::Alarm {
                activate,
                alarm,
                who,
                ..
            } => {
                let req = AlarmRequest {
                    action: if *activate {
                        AlarmAction::Activate
                    } else {
                        AlarmAction::Deactivate
                    } as i32,
                    member_id: match who {
                        Who::Me => self.me,
                        Who::Zero => 0,
                    },
                    alarm: *alarm as i32,
                };
                let mut mt = MaintenanceClient::new(self.chan.clone());
                let me = self.me;
                let a = answer(timeout(CALL, mt.alarm(req)).await, |r| r).map(|r| {
                    let mut v: Vec<String> = r
                        .alarms
                        .iter()
                        .map(|a| {
                            let who = match a.member_id {
                                0 => "0".to_string(),
                                id if id == me => "me".to_string(),
                                id => format!("{id:x}"),
                            };
                            format!("{who}:{}", alarm_name(a.alarm))
                        })
                        .collect();
                    v.sort();
                    v
                });
                format!("{a:?}")
            }
            Step::Put { .. } => {
                let mut kv = KvClient::new(self.chan.clone());
                let req = PutRequest {
                    key: b"k".to_vec(),
                    value: b"v".to_vec(),
                    ..Default::default()
                };
                let a = answer(timeout(CALL, kv.put(req)).await, |_| ());
                format!("{a:?}")
            }
            Step::Http { .. } => unreachable!("an HTTP step is no gRPC call"),
        }
    }
}

// ---------------------------------------------------------------------
// The generator.

struct Gen {
    rng: StdRng,
    /// Per pair, as the reference answered.
    states: [PairState; 2],
}

impl Dice for Gen {
    fn rng(&mut self) -> &mut StdRng {
        &mut self.rng
    }
}

/// Paths (and their weights): probes, etcd's other endpoints, what it
/// does not serve, gRPC paths, the gateway's shapes.
const PATHS: [(&str, u32); 46] = [
    ("/health", 14),
    ("/livez", 4),
    ("/readyz", 6),
    ("/livez/serializable_read", 2),
    ("/readyz/data_corruption", 3),
    ("/readyz/serializable_read", 1),
    ("/readyz/linearizable_read", 1),
    ("/readyz/non_learner", 1),
    ("/readyz/nosuch", 1),
    ("/livez/", 1),
    ("/version", 6),
    ("/metrics", 4),
    ("/debug/vars", 3),
    ("/debug/pprof/", 1),
    ("/debug/pprof/profile", 1),
    ("/debug/pprof/heap", 1),
    ("/debug/requests", 1),
    ("/debug/events", 1),
    ("/debug", 1),
    ("/config/local/log", 2),
    ("/v2/keys", 1),
    ("/v2/keys/foo", 1),
    ("/v2/members", 1),
    ("/v2/stats/self", 1),
    ("/v2/machines", 1),
    ("/members", 2),
    ("/members/leader", 1),
    ("/", 2),
    ("/nosuch", 1),
    ("/proxy/health", 1),
    ("/etcdserverpb.KV/Range", 2),
    ("/etcdserverpb.Maintenance/Status", 1),
    ("/grpc.health.v1.Health/Check", 1),
    ("/etcdserverpb.Nope/Get", 1),
    ("/v3", 3),
    ("/v3/", 2),
    ("/v3/kv", 2),
    ("/v3/kv/range", 4),
    ("/v3/kv/nosuch", 1),
    ("/v3/maintenance/status", 1),
    ("/v3/watch", 1),
    ("/v3/lease/keepalive", 1),
    ("/v3/election/observe", 1),
    ("/v3beta", 1),
    ("/v3beta/", 1),
    ("/v3beta/kv/range", 1),
];

/// The gateway RPCs among [`PATHS`] (see [`Gen::http`]).
const GATEWAY_RPCS: [&str; 5] = [
    "/v3/kv/range",
    "/v3/maintenance/status",
    "/v3/watch",
    "/v3/lease/keepalive",
    "/v3/election/observe",
];

/// Query pairs etcd reads (or not).
const QUERY_PARTS: [&str; 26] = [
    "exclude=NOSPACE",
    "exclude=CORRUPT",
    "exclude=nospace",
    "exclude=",
    "exclude",
    "exclude=data_corruption",
    "exclude=linearizable_read",
    "exclude=serializable_read",
    "exclude=non_learner",
    "exclude=nosuch",
    "exclude=%4EOSPACE",
    "exclude=NO+SPACE",
    "exclude=NOSPACE%zz",
    "exclude%3DNOSPACE",
    "serializable=true",
    "serializable=false",
    "serializable=TRUE",
    "serializable",
    "verbose",
    "verbose=0",
    "verbose=%zz",
    "%zz=1",
    "a=b",
    "seconds=1",
    "exclude=NOSPACE;verbose",
    "verbose;x",
];

impl Gen {
    fn new(seed: u64) -> Gen {
        Gen {
            rng: StdRng::seed_from_u64(seed),
            states: Default::default(),
        }
    }

    fn next(&mut self) -> Step {
        let pair = if self.p(0.7) { 0 } else { 1 };
        match self.rng.random_range(0..100) {
            0..10 => {
                let alarm = if self.p(0.5) {
                    AlarmType::Nospace
                } else {
                    AlarmType::Corrupt
                };
                let who = if self.p(0.8) { Who::Me } else { Who::Zero };
                // more clearing than raising once something is raised
                let raised = self.states[pair].alarms.contains(&(who, alarm as i32));
                let activate = if raised { self.p(0.2) } else { self.p(0.7) };
                Step::Alarm {
                    pair,
                    activate,
                    alarm,
                    who,
                }
            }
            10..13 if !self.states[pair].overlapped => Step::Put { pair },
            _ => {
                let port = if self.p(0.7) {
                    Port::Client
                } else {
                    Port::Metrics
                };
                Step::Http {
                    pair,
                    port,
                    req: self.http(pair),
                }
            }
        }
    }

    fn weighted<T: Copy>(&mut self, xs: &[(T, u32)]) -> T {
        let total: u32 = xs.iter().map(|(_, w)| w).sum();
        let mut n = self.rng.random_range(0..total);
        for (x, w) in xs {
            if n < *w {
                return *x;
            }
            n -= w;
        }
        xs[0].0
    }

    fn http(&mut self, pair: usize) -> HttpReq {
        let method = self.weighted(&[
            ("GET", 60),
            ("HEAD", 6),
            ("POST", 10),
            ("PUT", 4),
            ("DELETE", 4),
            ("OPTIONS", 6),
            ("PATCH", 1),
            ("get", 1),
            ("FOO", 1),
        ]);
        let path = self.weighted(&PATHS);
        let path = self.mutate(path);
        let mut target = path;
        if self.p(0.45) {
            let n = self.rng.random_range(1..=3);
            let parts: Vec<&str> = (0..n).map(|_| self.pick(&QUERY_PARTS)).collect();
            let sep = if self.p(0.1) { "&&" } else { "&" };
            target = format!("{target}?{}", parts.join(sep));
            if self.p(0.05) {
                target.push('&');
            }
        } else if self.p(0.03) {
            target.push('?');
        }
        // rare targets: `*`, the absolute form
        match self.rng.random_range(0..100) {
            0 => target = "*".into(),
            1 | 2 => target = format!("http://127.0.0.1:PORT{target}"),
            _ => {}
        }
        let version = if self.p(0.05) { "HTTP/1.0" } else { "HTTP/1.1" };
        let host = match self.rng.random_range(0..100) {
            0..70 => Host::Own,
            70..78 => Host::Localhost,
            78..84 => Host::Named("ok.example"),
            84..92 => Host::Named(if pair == 1 { "evil.example" } else { "x" }),
            92..96 => Host::Missing,
            _ => Host::Twice,
        };
        let mut req = HttpReq {
            method: method.into(),
            target,
            version,
            host,
            headers: Vec::new(),
            body: Body::None,
        };
        if self.p(0.35) {
            let o = self.pick(&ORIGINS);
            req.headers.push(("Origin".into(), o.into()));
        }
        if self.p(0.25) {
            let ct = self.pick(&[
                "application/json",
                "text/plain",
                "application/grpc",
                "application/x-www-form-urlencoded",
            ]);
            req.headers.push(("Content-Type".into(), ct.into()));
        }
        if self.p(0.3) {
            let ae = self.pick(&["gzip", "gzip, deflate", "deflate", "identity", "gzip;q=0"]);
            req.headers.push(("Accept-Encoding".into(), ae.into()));
        }
        // (no body with HEAD: Go reads none, and takes the bytes for the
        // next request)
        req.body = match self.rng.random_range(0..100) {
            _ if req.method == "HEAD" => Body::None,
            90.. if version == "HTTP/1.0" => Body::None,
            0..70 => Body::None,
            70..90 => Body::Sized(self.pick(&["{}", "", "abc", "exclude=NOSPACE"]).into()),
            _ => Body::Chunked(self.pick(&["{}", "", "abc"]).into()),
        };
        // A POST reaching one of the gateway's RPCs: only a Range that
        // both refuse alike ("key is not provided"); the others (a
        // stream, Status's IDs) are asked with GET.
        let rpc = go_target(&req.target).map(|(p, _)| go_clean(&p).replacen("/v3beta/", "/v3/", 1));
        if req.method == "POST" && rpc.as_deref().is_some_and(|p| GATEWAY_RPCS.contains(&p)) {
            if rpc.as_deref() == Some("/v3/kv/range") {
                req.body = Body::Sized(self.pick(&["{}", ""]).into());
            } else {
                req.method = "GET".into();
            }
        }
        req
    }

    /// A path as written: mostly as it is, else with a slash more or
    /// less, `/./`, `/x/../`, a letter in upper case, a character
    /// percent-encoded, an invalid escape.
    fn mutate(&mut self, path: &str) -> String {
        let p = path.to_string();
        match self.rng.random_range(0..100) {
            0..70 => p,
            70..74 => format!("{p}/"),
            74..76 if p.len() > 1 && p.ends_with('/') => p[..p.len() - 1].to_string(),
            74..79 => format!("/{p}"),
            79..82 => match p[1..].find('/') {
                Some(i) => format!("{}/{}", &p[..=i], &p[i + 1..]),
                None => format!("/.{p}"),
            },
            82..84 => format!("/x/..{p}"),
            84..86 => format!("/.{p}"),
            86..90 => {
                // one letter in upper case
                let idx: Vec<usize> = p
                    .char_indices()
                    .filter(|(_, c)| c.is_ascii_lowercase())
                    .map(|(i, _)| i)
                    .collect();
                if idx.is_empty() {
                    return p;
                }
                let i = idx[self.rng.random_range(0..idx.len())];
                let mut b = p.into_bytes();
                b[i] = b[i].to_ascii_uppercase();
                String::from_utf8(b).expect("ascii")
            }
            90..97 => {
                // one character (not the first slash) percent-encoded
                if p.len() < 2 {
                    return "/%2F".into();
                }
                let i = self.rng.random_range(1..p.len());
                format!("{}%{:02X}{}", &p[..i], p.as_bytes()[i], &p[i + 1..])
            }
            97 => format!("{p}%zz"),
            _ => format!("{p}%"),
        }
    }

    /// Records what a step did to the pair's state (the reference's
    /// answer decides).
    fn learn(&mut self, step: &Step, reference: &str) {
        if let Step::Alarm {
            pair,
            activate,
            alarm,
            who,
        } = step
        {
            if reference.starts_with("Ok(") {
                let key = (*who, *alarm as i32);
                let st = &mut self.states[*pair];
                if *activate {
                    st.alarms.insert(key);
                } else {
                    st.alarms.remove(&key);
                }
                st.overlapped = match st.alarms.len() {
                    0 => false,
                    1 => st.overlapped,
                    _ => true,
                };
            }
        }
    }
}

/// Each difference the seeded steps found in retcd, reduced, replayed
/// first (on the open pair unless said otherwise), and the on-purpose
/// cases.
fn prelude() -> Vec<Step> {
    use Port::{Client, Metrics};
    let http = |port: Port, req: HttpReq| Step::Http { pair: 0, port, req };
    let strict = |port: Port, req: HttpReq| Step::Http { pair: 1, port, req };
    let get = HttpReq::get;
    let alarm = |activate: bool, who: Who| Step::Alarm {
        pair: 0,
        activate,
        alarm: AlarmType::Nospace,
        who,
    };
    let grpc = |path: &str, body: &str| {
        get(path)
            .method("POST")
            .header("Content-Type", "application/grpc")
            .body(body)
    };
    vec![
        http(Client, get("/health")),
        // /version: etcd's key order (retcd wrote etcdcluster first)
        http(Client, get("/version")),
        // /debug/vars is served on the client URL, GET only (retcd: 404)
        http(Client, get("/debug/vars")),
        http(Client, get("/debug/vars").method("DELETE")),
        http(Metrics, get("/debug/vars")),
        // Go's ServeMux redirects a path that is not clean (retcd: 404)
        http(Client, get("//health")),
        http(Metrics, get("//health")),
        http(Client, get("/./version?x=1")),
        http(Client, get("/a/../version")),
        http(Client, get("//version").method("POST").body("")),
        http(Client, get("//version").method("HEAD")),
        http(Client, get("/v3//kv/range").method("POST").body("{}")),
        http(Client, get("http://127.0.0.1:PORT//version")),
        // and routes on the decoded path (retcd: 404)
        http(Client, get("/%68ealth")),
        http(Metrics, get("/%68ealth")),
        http(Client, get("/v3/kv%2Frange")),
        http(Client, get("/v3/kv%2Frange").method("POST").body("{}")),
        // `/v3` → `/v3/` keeps the query (retcd dropped it), not a bare `?`
        http(Client, get("/v3?x=1")),
        http(Client, get("//v3?")),
        // Go's server: no Host or two (HTTP/1.1), an invalid escape (checked
        // first): 400 (retcd served them)
        http(Client, get("/health").host(Host::Missing)),
        http(Metrics, get("/health").host(Host::Twice)),
        http(Client, get("/%zz")),
        http(Metrics, get("/v2/keys%")),
        http(Client, get("/health%").host(Host::Twice)),
        // the target `*`: 400 from the mux, `OPTIONS *` 200 from the
        // server (retcd: 404)
        http(Client, get("*")),
        http(Client, get("*").method("OPTIONS")),
        http(Metrics, get("*").method("OPTIONS")),
        // a gRPC path over HTTP/1.1 is an HTTP request (retcd answered
        // gRPC)
        http(Client, grpc("/etcdserverpb.KV/Range", "\0\0\0\0\0")),
        http(Client, grpc("/etcdserverpb.Nope/Get", "")),
        // /metrics gzipped when the client takes gzip (retcd: never)
        http(Client, get("/metrics").header("Accept-Encoding", "gzip")),
        http(
            Metrics,
            get("/metrics").header("Accept-Encoding", "x, gzip;q=0"),
        ),
        // /readyz lists no excluded check (retcd: "[+]x excluded: ok"); Go
        // drops a query pair with an invalid escape or a `;` (retcd: kept)
        http(Client, get("/readyz?verbose&exclude=data_corruption")),
        http(Metrics, get("/readyz?verbose=%zz")),
        // (on purpose: no `verbose` for etcd 3.5.24's Go, 3.5.1's has one)
        http(Client, get("/livez?verbose;x")),
        http(Metrics, get("/livez/serializable_read").method("HEAD")),
        // the access controller on paths no route has (retcd: no CORS
        // headers for a listed origin, no 421, OPTIONS without CORS)
        strict(
            Client,
            get("/nosuch").header("Origin", "http://ok.example:8080"),
        ),
        strict(
            Client,
            get("/nosuch")
                .method("OPTIONS")
                .header("Origin", "http://ok.example:8080"),
        ),
        strict(Client, get("/nosuch").host(Host::Named("evil.example"))),
        // an absolute target's host is the one checked
        strict(
            Client,
            get("http://127.0.0.1:PORT/health").host(Host::Named("evil.example")),
        ),
        // on purpose (health-3.5.24): two NOSPACE alarms, one excluded type
        alarm(true, Who::Me),
        alarm(true, Who::Zero),
        http(Client, get("/health?exclude=NOSPACE")),
        http(Client, get("/health?exclude=NOSPACE;x")),
        alarm(false, Who::Me),
        alarm(false, Who::Zero),
    ]
}

// ---------------------------------------------------------------------
// The run.

struct Run {
    seed: u64,
    tname: &'static str,
    trace: bool,
    diffs: usize,
    /// Differing steps printed at most (the count is always given).
    show: usize,
    shown: Vec<String>,
    on_purpose: BTreeMap<&'static str, usize>,
    statuses: BTreeMap<u16, usize>,
}

impl Run {
    fn record(&mut self, n: &str, step: &Step, r: &str, t: &str, case: Option<&str>) {
        let tname = self.tname;
        let label = match case {
            Some(c) => format!("etcd (3.5.24 model, on purpose: {c})"),
            None => "etcd".into(),
        };
        let line = || format!("{}\n  {label}: {r}\n  {tname}: {t}", step.show());
        if self.trace {
            eprintln!("step {n}: {}", line());
        }
        if r != t {
            self.diffs += 1;
            if self.shown.len() < self.show {
                self.shown
                    .push(format!("seed {} step {n}: {}", self.seed, line()));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_random_differential() {
    let seed = env_u64("RETCD_HTTP_DIFF_SEED", 1);
    let steps = env_u64("RETCD_HTTP_DIFF_STEPS", 2500);
    let trace = std::env::var_os("RETCD_HTTP_DIFF_TRACE").is_some();
    let limit = LIMIT.max(Duration::from_millis(steps * 100));
    bounded(limit, async {
        let flavor = test_flavor();
        let bin = std::env::var_os("RETCD_HTTP_DIFF_TARGET_BIN").map_or_else(
            || match flavor {
                Flavor::Etcd => etcd351_bin(),
                _ => flavor.binary(),
            },
            std::path::PathBuf::from,
        );
        let (r0, t0, r1, t1) = tokio::join!(
            Server::start(Flavor::Etcd, etcd351_bin(), &[]),
            Server::start(flavor, bin.clone(), &[]),
            Server::start(Flavor::Etcd, etcd351_bin(), &STRICT_FLAGS),
            Server::start(flavor, bin, &STRICT_FLAGS),
        );
        let pairs = [(r0, t0), (r1, t1)];
        let mut g = Gen::new(seed);
        let mut run = Run {
            seed,
            tname: flavor.name(),
            trace,
            diffs: 0,
            show: env_u64("RETCD_HTTP_DIFF_SHOW", 20) as usize,
            shown: Vec::new(),
            on_purpose: BTreeMap::new(),
            statuses: BTreeMap::new(),
        };
        let started = Instant::now();
        let fixed = prelude();
        let total = fixed.len() as u64 + steps;
        for n in 0..total {
            let step = match fixed.get(n as usize) {
                Some(s) => s.clone(),
                None => g.next(),
            };
            let name = if (n as usize) < fixed.len() {
                format!("prelude {n}")
            } else {
                n.to_string()
            };
            match &step {
                Step::Http { pair, port, req } => {
                    let (rs, ts) = (&pairs[*pair].0, &pairs[*pair].1);
                    let (rb, tb) = (req.render(rs.port(*port)), req.render(ts.port(*port)));
                    let (rp, tp) = (rs.port(*port), ts.port(*port));
                    let (ra, ta) = tokio::join!(
                        tokio::task::spawn_blocking(move || exchange(rp, &rb)),
                        tokio::task::spawn_blocking(move || exchange(tp, &tb)),
                    );
                    let (ra, ta) = (ra.expect("exchange"), ta.expect("exchange"));
                    *run.statuses.entry(ra.status).or_insert(0) += 1;
                    let st = &g.states[*pair];
                    let model = match flavor {
                        Flavor::Retcd => on_purpose(req, &ra, st),
                        Flavor::Etcd => None,
                    };
                    let (expected, case, go116) = match &model {
                        Some((case, m)) => (m, Some(*case), false),
                        None => (&ra, None, true),
                    };
                    if let Some(c) = case {
                        *run.on_purpose.entry(c).or_insert(0) += 1;
                    }
                    let cx = |port| Cx {
                        req,
                        port,
                        st,
                        go116,
                    };
                    let (rv, tv) = (view(expected, &cx(rp)), view(&ta, &cx(tp)));
                    run.record(&name, &step, &rv, &tv, case);
                }
                Step::Alarm { pair, .. } | Step::Put { pair } => {
                    let (rs, ts) = (&pairs[*pair].0, &pairs[*pair].1);
                    let (ra, ta) = tokio::join!(rs.call(&step), ts.call(&step));
                    run.record(&name, &step, &ra, &ta, None);
                    g.learn(&step, &ra);
                }
            }
        }
        eprintln!(
            "http_random_differential: etcd vs {}, seed {seed}: {total} steps ({} prelude) in \
             {:.1?}; etcd's statuses {:?}; on purpose (3.5.24 model): {:?}; {} differing steps",
            run.tname,
            fixed.len(),
            started.elapsed(),
            run.statuses,
            run.on_purpose,
            run.diffs
        );
        assert!(
            run.diffs == 0,
            "{} of the steps differ between etcd and {} (seed {seed}; the first {} below):\n\n{}",
            run.diffs,
            run.tname,
            run.shown.len(),
            run.shown.join("\n\n")
        );
    })
    .await;
}

#[test]
fn go_helpers() {
    assert_eq!(go_clean("//health"), "/health");
    assert_eq!(go_clean("/a/../version"), "/version");
    assert_eq!(go_clean("/./v3/"), "/v3/");
    assert_eq!(go_clean("/v3//kv/range/"), "/v3/kv/range/");
    assert_eq!(go_clean("/"), "/");
    assert_eq!(go_unescape("/%68ealth", false), Some(b"/health".to_vec()));
    assert_eq!(go_unescape("/%zz", false), None);
    assert_eq!(go_unescape("a+b", true), Some(b"a b".to_vec()));
    let q = |raw, go116| go_query(raw, go116);
    assert_eq!(
        q("exclude=NOSPACE;verbose&verbose=%zz&&x", true),
        vec![
            ("exclude".into(), "NOSPACE".into()),
            ("verbose".into(), "".into()),
            ("x".into(), "".into())
        ]
    );
    assert_eq!(
        q("exclude=NOSPACE;verbose&verbose=%zz&&x", false),
        vec![("x".to_string(), String::new())]
    );
    assert_eq!(
        go_target("http://127.0.0.1:1/h%2Fx?a"),
        Some(("/h/x".into(), Some("a".into())))
    );
    assert_eq!(go_target("*"), None);
}
