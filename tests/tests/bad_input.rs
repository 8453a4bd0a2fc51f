//! Bad input on the request paths issue 13 names, through the wire: each
//! gets etcd's error (or a clear one of retcd's where etcd has none), the
//! server keeps serving, nothing is half-applied.

use retcd_api::etcdserverpb::{
    alarm_request::AlarmAction, auth_client::AuthClient, cluster_client::ClusterClient,
    kv_client::KvClient, maintenance_client::MaintenanceClient, request_op,
    watch_client::WatchClient, AlarmRequest, AlarmType, AuthUserAddRequest, MemberAddRequest,
    MemberUpdateRequest, PutRequest, RangeRequest, RequestOp, TxnRequest, WatchCreateRequest,
    WatchRequest,
};
use retcd_tests::limit::QUICK as LIMIT;
use retcd_tests::{bounded, test_flavor, Cluster, Flavor};
use std::time::Duration;
use tonic::transport::Channel;
use tonic::Code;

async fn channel(c: &Cluster) -> Channel {
    c.channel(0).await.expect("connect")
}

fn err<T: std::fmt::Debug>(r: Result<T, tonic::Status>) -> (Code, String) {
    let s = r.expect_err("expected an error");
    (s.code(), s.message().to_string())
}

fn nested(depth: usize) -> TxnRequest {
    let mut t = TxnRequest {
        success: vec![RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: b"deep".to_vec(),
                value: format!("{depth}").into_bytes(),
                ..Default::default()
            })),
        }],
        ..Default::default()
    };
    for _ in 1..depth {
        t = TxnRequest {
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestTxn(t)),
            }],
            ..Default::default()
        };
    }
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_errors_and_the_member_keeps_serving() {
    bounded(LIMIT, async {
        let flavor = test_flavor();
        let c = Cluster::start(flavor, 1, &[]).await.expect("start");
        let ch = channel(&c).await;
        let mut cluster = ClusterClient::new(ch.clone());
        let bad_urls = (
            Code::InvalidArgument,
            "etcdserver: given member URLs are invalid".to_string(),
        );
        // MemberAdd with no URL or a malformed one (etcd: types.NewURLs)
        for urls in [vec![], vec!["127.0.0.1:2380".to_string()]] {
            let r = cluster
                .member_add(MemberAddRequest {
                    peer_ur_ls: urls,
                    is_learner: true,
                })
                .await;
            assert_eq!(err(r), bad_urls);
        }
        let me = cluster
            .member_list(retcd_api::etcdserverpb::MemberListRequest::default())
            .await
            .expect("member list")
            .into_inner()
            .members[0]
            .clone();
        if flavor == Flavor::Retcd {
            // etcd 3.5 stores these without a check (and its peer senders
            // then fail on them); retcd refuses them as MemberAdd's
            for urls in [vec![], vec!["not a url".to_string()]] {
                let r = cluster
                    .member_update(MemberUpdateRequest {
                        id: me.id,
                        peer_ur_ls: urls,
                    })
                    .await;
                assert_eq!(err(r), bad_urls);
            }
            // an alarm may name any member ID, as in etcd (a removed
            // member's alarm can be cleared): raised, then cleared
            let mut mt = MaintenanceClient::new(ch.clone());
            for action in [AlarmAction::Activate, AlarmAction::Deactivate] {
                let r = mt
                    .alarm(AlarmRequest {
                        action: action as i32,
                        member_id: me.id ^ 1,
                        alarm: AlarmType::Nospace as i32,
                    })
                    .await
                    .expect("an alarm of a member not in the cluster")
                    .into_inner();
                assert_eq!(r.alarms.len(), 1, "{action:?}: {r:?}");
                assert_eq!(r.alarms[0].member_id, me.id ^ 1);
            }
            let left = mt.alarm(AlarmRequest::default()).await.expect("alarm list");
            assert!(left.into_inner().alarms.is_empty());
            // a txn nested deeper than retcd takes is refused before raft
            let mut kv = KvClient::new(ch.clone());
            let r = kv.txn(nested(33)).await;
            assert_eq!(
                err(r),
                (
                    Code::InvalidArgument,
                    "etcdserver: too many operations in txn request".to_string()
                )
            );
            kv.txn(nested(32)).await.expect("32 levels are taken");
            // sort options the enums lack (etcd 3.4 and 3.5 die on some;
            // 3.6 answers this), unary and in a Txn
            let bad_sort = (
                Code::InvalidArgument,
                "etcdserver: invalid sort option".to_string(),
            );
            for (order, target) in [(0, 99), (1, 99), (7, 0), (-1, 1)] {
                let range = RangeRequest {
                    key: b"k".to_vec(),
                    sort_order: order,
                    sort_target: target,
                    ..Default::default()
                };
                let r = kv.range(range.clone()).await;
                assert_eq!(err(r), bad_sort, "order {order} target {target}");
                let r = kv
                    .txn(TxnRequest {
                        success: vec![RequestOp {
                            request: Some(request_op::Request::RequestRange(range)),
                        }],
                        ..Default::default()
                    })
                    .await;
                assert_eq!(err(r), bad_sort, "in a txn: order {order} target {target}");
            }
            // a password bcrypt cannot take whole is refused, not cut
            let r = AuthClient::new(ch.clone())
                .user_add(AuthUserAddRequest {
                    name: "long".into(),
                    password: "p".repeat(73),
                    ..Default::default()
                })
                .await;
            assert_eq!(
                err(r),
                (
                    Code::Unknown,
                    "bcrypt: password length exceeds 72 bytes".to_string()
                )
            );
            AuthClient::new(ch.clone())
                .user_add(AuthUserAddRequest {
                    name: "ok".into(),
                    password: "p".repeat(72),
                    ..Default::default()
                })
                .await
                .expect("72 bytes are fine");
        }
        // the member still has one member and serves
        let members = cluster
            .member_list(retcd_api::etcdserverpb::MemberListRequest::default())
            .await
            .expect("member list")
            .into_inner()
            .members;
        assert_eq!(members.len(), 1, "nothing was added: {members:?}");
        KvClient::new(ch)
            .put(PutRequest {
                key: b"after".to_vec(),
                value: b"1".to_vec(),
                ..Default::default()
            })
            .await
            .expect("still serving");
    })
    .await
}

/// `--max-concurrent-streams 1`: a second stream on the same connection
/// waits until the first ends (the HTTP/2 SETTINGS the server sends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_concurrent_streams_caps_streams_per_connection() {
    bounded(LIMIT, async {
        let c = Cluster::start(Flavor::Retcd, 1, &["--max-concurrent-streams", "1"])
            .await
            .expect("start");
        let ch = channel(&c).await;
        // one long-lived stream: a watch
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(WatchRequest {
            request_union: Some(
                retcd_api::etcdserverpb::watch_request::RequestUnion::CreateRequest(
                    WatchCreateRequest {
                        key: b"w".to_vec(),
                        ..Default::default()
                    },
                ),
            ),
        })
        .await
        .unwrap();
        let mut watch = WatchClient::new(ch.clone())
            .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .expect("watch")
            .into_inner();
        let created = watch.message().await.expect("created").expect("a message");
        assert!(created.created);
        // a unary call on the same connection cannot get a stream now
        let mut kv = KvClient::new(ch.clone());
        let blocked = tokio::time::timeout(
            Duration::from_secs(2),
            kv.range(RangeRequest {
                key: b"w".to_vec(),
                ..Default::default()
            }),
        )
        .await;
        assert!(blocked.is_err(), "a second stream was opened: {blocked:?}");
        // once the watch ends, it can
        drop(watch);
        drop(tx);
        tokio::time::timeout(
            Duration::from_secs(10),
            kv.range(RangeRequest {
                key: b"w".to_vec(),
                ..Default::default()
            }),
        )
        .await
        .expect("served once the first stream ended")
        .expect("range");
    })
    .await
}

/// A request over the receive limit (`--max-request-bytes` + 512 KiB, as
/// etcd sizes its gRPC server) gets grpc-go's answer, as etcd's clients
/// see it: ResourceExhausted "grpc: received message larger than max (N
/// vs. M)" (tonic's own is OutOfRange), and the member keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_request_gets_grpc_gos_resource_exhausted() {
    bounded(LIMIT, async {
        let c = Cluster::start(test_flavor(), 1, &[]).await.expect("start");
        let mut kv = KvClient::new(channel(&c).await);
        let put = PutRequest {
            key: b"big".to_vec(),
            value: vec![b'x'; 2 * 1024 * 1024],
            ..Default::default()
        };
        let (code, msg) = err(kv.put(put).await);
        assert_eq!(code, Code::ResourceExhausted, "{msg}");
        let limit = (1536 + 512) * 1024;
        assert!(
            msg.starts_with("grpc: received message larger than max (")
                && msg.ends_with(&format!(" vs. {limit})")),
            "{msg}"
        );
        let small = PutRequest {
            key: b"small".to_vec(),
            value: b"v".to_vec(),
            ..Default::default()
        };
        kv.put(small).await.expect("the member still serves");
        // under the limit, in many HTTP/2 data frames: served whole
        let large = PutRequest {
            key: b"large".to_vec(),
            value: (0..1024 * 1024).map(|i| (i % 251) as u8).collect(),
            ..Default::default()
        };
        kv.put(large.clone()).await.expect("a 1 MiB put");
        let got = kv
            .range(RangeRequest {
                key: b"large".to_vec(),
                ..Default::default()
            })
            .await
            .expect("range")
            .into_inner();
        assert_eq!(got.kvs.len(), 1);
        assert!(
            got.kvs[0].value == large.value,
            "the 1 MiB value read back whole"
        );
    })
    .await;
}

/// A request marked compressed (`grpc-encoding: snappy`; etcd installs no
/// decompressor) gets grpc-go's UNIMPLEMENTED on a generated method
/// (Put), on Range and on Watch, whose routes retcd writes itself; nothing
/// is written and the member keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_requests_get_unimplemented() {
    bounded(LIMIT, async {
        let c = Cluster::start(test_flavor(), 1, &[]).await.expect("start");
        let ch = channel(&c).await;
        let snappy = |mut r: tonic::Request<()>| {
            r.metadata_mut()
                .insert("grpc-encoding", "snappy".parse().expect("value"));
            Ok(r)
        };
        let want = "grpc: Decompressor is not installed for grpc-encoding \"snappy\"";
        let mut kv = KvClient::with_interceptor(ch.clone(), snappy);
        let put = PutRequest {
            key: b"zipped".to_vec(),
            value: b"v".to_vec(),
            ..Default::default()
        };
        assert_eq!(
            err(kv.put(put).await),
            (Code::Unimplemented, want.to_string())
        );
        let range = RangeRequest {
            key: b"zipped".to_vec(),
            ..Default::default()
        };
        assert_eq!(
            err(kv.range(range.clone()).await),
            (Code::Unimplemented, want.to_string())
        );
        let mut watch = WatchClient::with_interceptor(ch.clone(), snappy);
        let create = WatchRequest {
            request_union: Some(
                retcd_api::etcdserverpb::watch_request::RequestUnion::CreateRequest(
                    WatchCreateRequest {
                        key: b"zipped".to_vec(),
                        ..Default::default()
                    },
                ),
            ),
        };
        let watched = async {
            let mut s = watch
                .watch(tokio_stream::iter(vec![create]))
                .await?
                .into_inner();
            s.message().await
        };
        let r = tokio::time::timeout(Duration::from_secs(10), watched)
            .await
            .expect("the watch answers");
        assert_eq!(err(r), (Code::Unimplemented, want.to_string()));
        // nothing was written; plain requests are served
        let mut plain = KvClient::new(ch);
        let got = plain.range(range).await.expect("range").into_inner();
        assert!(got.kvs.is_empty(), "{got:?}");
    })
    .await;
}

/// A unary request body of exactly these bytes (the gRPC prefix included),
/// then these trailers, if any.
struct RawBody(
    Option<bytes::Bytes>,
    Option<tonic::codegen::http::HeaderMap>,
);

impl http_body::Body for RawBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        let f = match self.0.take() {
            Some(b) => Some(http_body::Frame::data(b)),
            None => self.1.take().map(http_body::Frame::trailers),
        };
        std::task::Poll::Ready(f.map(Ok))
    }
}

/// `msg` as one gRPC message: the `flag` byte (0: not compressed), the
/// length (`len`, or the message's own), the bytes.
fn grpc_frame(flag: u8, msg: &[u8], len: Option<u32>) -> Vec<u8> {
    let mut b = vec![flag];
    b.extend_from_slice(&len.unwrap_or(msg.len() as u32).to_be_bytes());
    b.extend_from_slice(msg);
    b
}

/// Sends `body` as the whole request body of a gRPC call to `path`; the
/// call's status code and (percent-decoded) message, from the headers of a
/// trailers-only answer or from the trailers.
async fn raw_call(ch: &Channel, path: &str, body: Vec<u8>) -> (i32, String) {
    raw_call_with(ch, path, body, &[], &[]).await
}

/// [`raw_call`] with these extra request headers and request trailers.
async fn raw_call_with(
    ch: &Channel,
    path: &str,
    body: Vec<u8>,
    headers: &[(&'static str, &str)],
    trailers: &[(&'static str, &str)],
) -> (i32, String) {
    use http_body::Body as _;
    use tonic::codegen::{http, Service};
    let mut req = http::Request::builder()
        .method("POST")
        .uri(format!("http://retcd{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let trailers = (!trailers.is_empty()).then(|| {
        trailers
            .iter()
            .map(|(k, v)| {
                (
                    http::HeaderName::from_static(k),
                    http::HeaderValue::from_str(v).expect("value"),
                )
            })
            .collect::<http::HeaderMap>()
    });
    let req = req
        .body(tonic::body::Body::new(RawBody(Some(body.into()), trailers)))
        .expect("request");
    let mut ch = ch.clone();
    std::future::poll_fn(|cx| ch.poll_ready(cx))
        .await
        .expect("ready");
    let resp = match ch.call(req).await {
        Ok(r) => r,
        // (a reset stream: code -1)
        Err(e) => return (-1, e.to_string()),
    };
    let (parts, body) = resp.into_parts();
    let mut status = parts.headers.clone();
    let mut body = std::pin::pin!(body);
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        if let Ok(t) = frame.expect("the body").into_trailers() {
            status.extend(t);
        }
    }
    grpc_status(&status)
}

/// The gRPC status code and (percent-decoded) message in `status` (a
/// trailers-only answer's headers, or the trailers).
fn grpc_status(status: &tonic::codegen::http::HeaderMap) -> (i32, String) {
    let code = status
        .get("grpc-status")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .expect("a grpc-status");
    let msg = status.get("grpc-message").map_or(String::new(), |v| {
        percent_encoding::percent_decode(v.as_bytes())
            .decode_utf8_lossy()
            .into_owned()
    });
    (code, msg)
}

/// Bodies that are not one well-formed gRPC message, sent to unary KV
/// methods without any client library: grpc-go's codes and messages, as
/// etcd 3.4 and 3.5 answer them (Unknown "EOF" / "unexpected EOF" for a
/// missing or cut message, Internal for a compressed or unknown format and
/// for bytes that are not the request); a message after the first is not
/// looked at. Nothing bad is written and the member keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_grpc_bodies_get_grpc_gos_errors() {
    bounded(LIMIT, async {
        let c = Cluster::start(test_flavor(), 1, &[]).await.expect("start");
        let ch = channel(&c).await;
        use tonic_prost::prost::Message as _;
        let put = |k: &str| {
            PutRequest {
                key: k.as_bytes().to_vec(),
                value: b"v".to_vec(),
                ..Default::default()
            }
            .encode_to_vec()
        };
        let garbage = [0xffu8, 0xff, 0xff];
        let unmarshal = "grpc: error unmarshalling request: ";
        let cases: Vec<(&str, Vec<u8>, i32, &str)> = vec![
            (
                "compressed flag",
                grpc_frame(1, &put("bad1"), None),
                13,
                "grpc: compressed flag set with identity or empty encoding",
            ),
            (
                "unknown format",
                grpc_frame(2, &put("bad2"), None),
                13,
                "grpc: received unexpected payload format 2",
            ),
            (
                "cut message",
                grpc_frame(0, &put("bad3"), Some(100)),
                2,
                "unexpected EOF",
            ),
            ("cut prefix", vec![0, 0], 2, "unexpected EOF"),
            ("no message", Vec::new(), 2, "EOF"),
            (
                "not a request",
                grpc_frame(0, &garbage, None),
                13,
                unmarshal,
            ),
            // grpc-go's order: the size first, then the whole message,
            // then its format
            (
                "compressed and too large",
                grpc_frame(1, &put("bad4"), Some(3 << 20)),
                8,
                "grpc: received message larger than max (3145728 vs. 2097152)",
            ),
            (
                "compressed and cut",
                grpc_frame(1, &put("bad5"), Some(100)),
                2,
                "unexpected EOF",
            ),
        ];
        for path in [
            "/etcdserverpb.KV/Put",
            "/etcdserverpb.KV/Txn",
            "/etcdserverpb.KV/Range",
        ] {
            for (what, body, code, msg) in &cases {
                let (got_code, got_msg) = raw_call(&ch, path, body.clone()).await;
                assert_eq!(got_code, *code, "{path} {what}: {got_msg}");
                if *msg == unmarshal {
                    assert!(got_msg.starts_with(msg), "{path} {what}: {got_msg}");
                } else {
                    assert_eq!(got_msg, *msg, "{path} {what}");
                }
            }
        }
        // two messages in a unary call: the first is served
        let mut two = grpc_frame(0, &put("first"), None);
        two.extend(grpc_frame(0, &garbage, None));
        assert_eq!(
            raw_call(&ch, "/etcdserverpb.KV/Put", two).await,
            (0, String::new())
        );
        let mut kv = KvClient::new(ch);
        let all = kv
            .range(RangeRequest {
                key: vec![0],
                range_end: vec![0],
                ..Default::default()
            })
            .await
            .expect("range")
            .into_inner();
        let keys: Vec<_> = all
            .kvs
            .iter()
            .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
            .collect();
        assert_eq!(keys, ["first"], "only the well-formed put was applied");
    })
    .await;
}

/// Request trailers are not metadata: a token (or anything else) sent in
/// them never authenticates a call. etcd (grpc-go) resets a stream whose
/// request has trailers (PROTOCOL_ERROR); retcd drops them and serves the
/// call as sent without them. tonic would have merged a unary call's
/// request trailers into its metadata over the headers, letting a client
/// name itself after the client port's guard looked (the
/// verified-certificate header it sets).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_trailers_carry_no_credentials() {
    use retcd_api::etcdserverpb::{
        AuthEnableRequest, AuthUserGrantRoleRequest, AuthenticateRequest,
    };
    bounded(LIMIT, async {
        let c = Cluster::start(test_flavor(), 1, &[]).await.expect("start");
        let ch = channel(&c).await;
        let mut auth = AuthClient::new(ch.clone());
        auth.user_add(AuthUserAddRequest {
            name: "root".into(),
            password: "pw".into(),
            ..Default::default()
        })
        .await
        .expect("root");
        auth.user_grant_role(AuthUserGrantRoleRequest {
            user: "root".into(),
            role: "root".into(),
        })
        .await
        .expect("grant");
        auth.auth_enable(AuthEnableRequest {})
            .await
            .expect("enable");
        let token = auth
            .authenticate(AuthenticateRequest {
                name: "root".into(),
                password: "pw".into(),
            })
            .await
            .expect("authenticate")
            .into_inner()
            .token;
        use tonic_prost::prost::Message as _;
        let framed = |msg: Vec<u8>| grpc_frame(0, &msg, None);
        let put = framed(
            PutRequest {
                key: b"t".to_vec(),
                value: b"v".to_vec(),
                ..Default::default()
            }
            .encode_to_vec(),
        );
        let list = framed(Vec::new());
        let empty = "etcdserver: user name is empty";
        let mut kv = KvClient::new(ch.clone());
        for (path, body) in [
            ("/etcdserverpb.KV/Put", &put),
            ("/etcdserverpb.Auth/UserList", &list),
        ] {
            let none = raw_call_with(&ch, path, body.clone(), &[], &[]).await;
            assert_eq!(none, (3, empty.to_string()), "{path}");
            let in_trailers =
                raw_call_with(&ch, path, body.clone(), &[], &[("token", &token)]).await;
            match test_flavor() {
                Flavor::Etcd => assert_eq!(in_trailers.0, -1, "{path}: reset: {in_trailers:?}"),
                Flavor::Retcd => assert_eq!(in_trailers, none, "{path}: served as without them"),
            }
            if path.ends_with("Put") {
                let mut get = tonic::Request::new(RangeRequest {
                    key: b"t".to_vec(),
                    ..Default::default()
                });
                get.metadata_mut()
                    .insert("token", token.parse().expect("token"));
                let got = kv.range(get).await.expect("range").into_inner();
                assert!(got.kvs.is_empty(), "the put with trailers wrote: {got:?}");
            }
            let with_header =
                raw_call_with(&ch, path, body.clone(), &[("token", &token)], &[]).await;
            assert_eq!(
                with_header,
                (0, String::new()),
                "{path}: the token works in the headers"
            );
        }
    })
    .await;
}

/// A call's `grpc-timeout` bounds it on the server: a Lock that waits for a
/// held lock, sent without any client-side deadline, is ended by the
/// server when its timeout passes, with etcd's code and message; the lock
/// stays with its holder. gRPC answers carry no `date` header (grpc-go
/// sends none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_timeout_ends_a_waiting_call_on_the_server() {
    use retcd_api::etcdserverpb::{lease_client::LeaseClient, LeaseGrantRequest};
    use retcd_api::v3lockpb::{lock_client::LockClient, LockRequest};
    use tonic_prost::prost::Message as _;
    bounded(LIMIT, async {
        let c = Cluster::start(test_flavor(), 1, &[]).await.expect("start");
        let ch = channel(&c).await;
        let leases = LeaseClient::new(ch.clone());
        let grant = || {
            let mut l = leases.clone();
            async move {
                l.lease_grant(LeaseGrantRequest {
                    ttl: 60,
                    ..Default::default()
                })
                .await
                .expect("grant")
                .into_inner()
                .id
            }
        };
        let (holder, waiter) = (grant().await, grant().await);
        let held = LockClient::new(ch.clone())
            .lock(LockRequest {
                name: b"l".to_vec(),
                lease: holder,
            })
            .await
            .expect("lock")
            .into_inner()
            .key;
        let body = LockRequest {
            name: b"l".to_vec(),
            lease: waiter,
        }
        .encode_to_vec();
        let framed = grpc_frame(0, &body, None);
        let started = std::time::Instant::now();
        let (code, msg, headers) =
            h2_call(&c.endpoints()[0], "/v3lockpb.Lock/Lock", framed, "300m").await;
        let took = started.elapsed();
        eprintln!("lock with grpc-timeout 300m: {code} {msg:?} after {took:?}");
        assert_eq!((code, msg.as_str()), (2, "context deadline exceeded"));
        assert!(
            took >= Duration::from_millis(290) && took < Duration::from_secs(3),
            "ended after {took:?}"
        );
        assert!(headers.get("date").is_none(), "{headers:?}");
        // the holder still holds it: its key is the only one under the name
        let keys = KvClient::new(ch.clone())
            .range(RangeRequest {
                key: b"l/".to_vec(),
                range_end: b"l0".to_vec(),
                ..Default::default()
            })
            .await
            .expect("range")
            .into_inner();
        let names: Vec<_> = keys.kvs.iter().map(|kv| kv.key.clone()).collect();
        assert_eq!(names, vec![held], "the waiter's key is gone with its call");
    })
    .await;
}

/// One gRPC call over a bare HTTP/2 connection (the `h2` crate: no gRPC
/// library, so nothing on the client side acts on `grpc-timeout`): the
/// status code and message, and the answer's headers. A reset stream is
/// code -1 with h2's reason.
async fn h2_call(
    endpoint: &str,
    path: &str,
    body: Vec<u8>,
    grpc_timeout: &str,
) -> (i32, String, tonic::codegen::http::HeaderMap) {
    let addr = endpoint.trim_start_matches("http://");
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut client, conn) = h2::client::handshake(tcp).await.expect("handshake");
    tokio::spawn(conn);
    let req = tonic::codegen::http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", grpc_timeout)
        .body(())
        .expect("request");
    let (answer, mut send) = client.send_request(req, false).expect("send");
    send.send_data(body.into(), true).expect("body");
    let reset = |e: h2::Error| (-1, format!("{:?}", e.reason()), Default::default());
    let answer = match answer.await {
        Ok(a) => a,
        Err(e) => return reset(e),
    };
    let (parts, mut body) = answer.into_parts();
    let mut status = parts.headers.clone();
    while let Some(data) = body.data().await {
        if let Err(e) = data {
            return reset(e);
        }
    }
    match body.trailers().await {
        Ok(t) => status.extend(t.unwrap_or_default()),
        Err(e) => return reset(e),
    }
    let (code, msg) = grpc_status(&status);
    (code, msg, parts.headers)
}
