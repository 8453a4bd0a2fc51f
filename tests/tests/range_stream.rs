//! etcd 3.7's `KV.RangeStream` and retcd's bound on a unary Range response,
//! over the wire with the raw tonic clients of `retcd_api`.
//!
//! RangeStream is checked against the unary Range of the same server: the
//! chunks merged (kvs concatenated, the final chunk's header, more and
//! count) must equal Range's answer for every supported request form, as
//! etcd's own integration tests assert. Then its shape (a first chunk of
//! 10 keys, header/more/count only on the last), the pinned revision
//! (writes during the stream are not seen), etcd's Unimplemented answers
//! for sort orders and revision filters, future and compacted revisions,
//! and a compaction in the middle of a stream.
//!
//! etcd 3.4 and 3.5 have no RangeStream: with `RETCD_TEST_FLAVOR=etcd` the
//! test asserts the Unimplemented answer a client (kube-apiserver 1.37)
//! falls back on, which is what they give.

use std::time::Duration;

use retcd_api::etcdserverpb as pb;
use retcd_api::etcdserverpb::range_request::{SortOrder, SortTarget};
use retcd_tests::limit::QUICK as LIMIT;
use retcd_tests::{bounded, test_flavor, Cluster, Flavor};
use tonic::transport::Channel;
use tonic::Code;

type Kv = pb::kv_client::KvClient<Channel>;

async fn kv(c: &Cluster) -> Kv {
    kv_with_window(c, None).await
}

/// A client on its own connection; `stream_window` sets its HTTP/2 stream
/// window (by default hyper's 2 MiB, enough for a server to read a whole
/// 1.6 MB list before the client reads its first chunk; 64 KiB keeps it
/// a few chunks ahead; the connection's window stays large, so other
/// calls are not held behind an unread stream).
async fn kv_with_window(c: &Cluster, stream_window: Option<u32>) -> Kv {
    let ch = Channel::from_shared(c.members[0].endpoint())
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(2))
        .initial_stream_window_size(stream_window)
        .connect()
        .await
        .expect("connect");
    Kv::new(ch).max_decoding_message_size(usize::MAX)
}

fn key(i: usize) -> Vec<u8> {
    format!("/registry/pods/p{i:05}").into_bytes()
}

/// `n` keys under `/registry/pods/` with `size`-byte values.
async fn fill(kv: &mut Kv, n: usize, size: usize) {
    for i in 0..n {
        kv.put(pb::PutRequest {
            key: key(i),
            value: vec![b'a' + (i % 26) as u8; size],
            ..Default::default()
        })
        .await
        .expect("put");
    }
}

fn prefix() -> pb::RangeRequest {
    pb::RangeRequest {
        key: b"/registry/pods/".to_vec(),
        range_end: b"/registry/pods0".to_vec(),
        ..Default::default()
    }
}

/// Every chunk of a stream, or the status it ended with (and the chunks
/// received before it).
async fn chunks(
    kv: &mut Kv,
    req: pb::RangeRequest,
) -> Result<Vec<pb::RangeResponse>, tonic::Status> {
    let mut s = kv.range_stream(req).await?.into_inner();
    let mut out = Vec::new();
    while let Some(m) = s.message().await? {
        out.push(m.range_response.expect("range_response set"));
    }
    Ok(out)
}

/// The chunks merged as `proto.Merge` would: kvs concatenated, the final
/// chunk's header, more and count.
fn merged(chunks: &[pb::RangeResponse]) -> pb::RangeResponse {
    let last = chunks.last().expect("at least one chunk");
    pb::RangeResponse {
        header: last.header,
        kvs: chunks.iter().flat_map(|c| c.kvs.clone()).collect(),
        more: last.more,
        count: last.count,
    }
}

/// etcd's answer to a read below the compaction revision.
fn assert_compacted(e: &tonic::Status) {
    assert_eq!(
        (e.code(), e.message()),
        (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted"
        ),
        "{e:?}"
    );
}

/// Checks the stream's shape: only the last chunk has a header (and only
/// it may have more/count set).
fn assert_shape(what: &str, chunks: &[pb::RangeResponse]) {
    let (last, rest) = chunks.split_last().expect("at least one chunk");
    assert!(last.header.is_some(), "{what}: final chunk without header");
    for (i, c) in rest.iter().enumerate() {
        assert!(
            c.header.is_none() && !c.more && c.count == 0,
            "{what}: chunk {i} of {} is not a bare kvs chunk: header {:?} more {} count {}",
            chunks.len(),
            c.header,
            c.more,
            c.count
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_stream_merges_to_range() {
    bounded(LIMIT, async {
        // A 64 KiB chunk target (--max-request-bytes) makes a few hundred
        // 2 KiB values many chunks.
        let c = Cluster::start(test_flavor(), 1, &["--max-request-bytes=65536"])
            .await
            .expect("start");
        let mut kv = kv(&c).await;
        fill(&mut kv, 300, 2048).await;
        if test_flavor() == Flavor::Etcd {
            let e = chunks(&mut kv, prefix())
                .await
                .expect_err("etcd 3.4 has no RangeStream");
            assert_eq!(e.code(), Code::Unimplemented, "{e:?}");
            return;
        }
        let rev = kv
            .range(prefix())
            .await
            .unwrap()
            .into_inner()
            .header
            .unwrap()
            .revision;
        let forms: Vec<(&str, pb::RangeRequest)> = vec![
            ("whole prefix", prefix()),
            (
                "limit 120",
                pb::RangeRequest {
                    limit: 120,
                    ..prefix()
                },
            ),
            (
                "limit 5",
                pb::RangeRequest {
                    limit: 5,
                    ..prefix()
                },
            ),
            (
                "limit 300 (= all)",
                pb::RangeRequest {
                    limit: 300,
                    ..prefix()
                },
            ),
            (
                "keys_only",
                pb::RangeRequest {
                    keys_only: true,
                    ..prefix()
                },
            ),
            (
                "serializable",
                pb::RangeRequest {
                    serializable: true,
                    ..prefix()
                },
            ),
            (
                "at an old revision",
                pb::RangeRequest {
                    revision: rev - 100,
                    ..prefix()
                },
            ),
            (
                "sort key ascending",
                pb::RangeRequest {
                    sort_order: SortOrder::Ascend as i32,
                    sort_target: SortTarget::Key as i32,
                    ..prefix()
                },
            ),
            (
                "one key",
                pb::RangeRequest {
                    key: key(7),
                    ..Default::default()
                },
            ),
            (
                "no key there",
                pb::RangeRequest {
                    key: b"/nothing".to_vec(),
                    ..Default::default()
                },
            ),
            (
                "every key",
                pb::RangeRequest {
                    key: vec![0],
                    range_end: vec![0],
                    ..Default::default()
                },
            ),
            (
                "from a key on",
                pb::RangeRequest {
                    key: key(250),
                    range_end: vec![0],
                    ..Default::default()
                },
            ),
            (
                "count_only",
                pb::RangeRequest {
                    count_only: true,
                    ..prefix()
                },
            ),
        ];
        for (what, req) in forms {
            let unary = kv.range(req.clone()).await.expect("range").into_inner();
            let got = chunks(&mut kv, req.clone())
                .await
                .unwrap_or_else(|e| panic!("{what}: {e:?}"));
            assert_shape(what, &got);
            let m = merged(&got);
            assert_eq!(m.kvs, unary.kvs, "{what}: kvs");
            assert_eq!(
                (m.more, m.count),
                (unary.more, unary.count),
                "{what}: more, count"
            );
            let (h, uh) = (m.header.unwrap(), unary.header.unwrap());
            assert_eq!(
                (h.revision, h.cluster_id, h.member_id),
                (uh.revision, uh.cluster_id, uh.member_id),
                "{what}: header"
            );
            if what == "whole prefix" {
                // 10 keys first, then more per chunk while under the target
                assert_eq!(got[0].kvs.len(), 10, "first chunk");
                assert!(
                    got.len() >= 5,
                    "300 × 2 KiB in 64 KiB chunks: {} chunks",
                    got.len()
                );
                assert!(
                    got[1].kvs.len() > 10,
                    "second chunk grew: {}",
                    got[1].kvs.len()
                );
            }
            if what == "count_only" {
                assert_eq!(got.len(), 1, "count_only is one message");
            }
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_stream_refuses_what_etcd_refuses() {
    if test_flavor() == Flavor::Etcd {
        return; // etcd 3.4/3.5 answer Unimplemented to every form (above)
    }
    bounded(LIMIT, async {
        let c = Cluster::start(Flavor::Retcd, 1, &[]).await.expect("start");
        let mut kv = kv(&c).await;
        fill(&mut kv, 20, 10).await;
        let cases: Vec<(pb::RangeRequest, Code, &str)> = vec![
            (
                pb::RangeRequest {
                    sort_order: SortOrder::Descend as i32,
                    ..prefix()
                },
                Code::Unimplemented,
                "RangeStream does not support custom sort orders",
            ),
            (
                pb::RangeRequest {
                    sort_order: SortOrder::Ascend as i32,
                    sort_target: SortTarget::Mod as i32,
                    ..prefix()
                },
                Code::Unimplemented,
                "RangeStream does not support custom sort orders",
            ),
            (
                pb::RangeRequest {
                    min_mod_revision: 3,
                    ..prefix()
                },
                Code::Unimplemented,
                "RangeStream does not support revision filters",
            ),
            (
                pb::RangeRequest {
                    max_create_revision: 3,
                    ..prefix()
                },
                Code::Unimplemented,
                "RangeStream does not support revision filters",
            ),
            (
                pb::RangeRequest {
                    revision: 1000,
                    ..prefix()
                },
                Code::OutOfRange,
                "etcdserver: mvcc: required revision is a future revision",
            ),
            (
                pb::RangeRequest::default(),
                Code::InvalidArgument,
                "etcdserver: key is not provided",
            ),
        ];
        for (req, code, msg) in cases {
            let e = chunks(&mut kv, req.clone()).await.expect_err("refused");
            assert_eq!((e.code(), e.message()), (code, msg), "{req:?}");
        }
        // compacted: below the compaction revision
        let rev = kv
            .range(prefix())
            .await
            .unwrap()
            .into_inner()
            .header
            .unwrap()
            .revision;
        kv.compact(pb::CompactionRequest {
            revision: rev - 5,
            physical: true,
        })
        .await
        .expect("compact");
        let e = chunks(
            &mut kv,
            pb::RangeRequest {
                revision: rev - 10,
                ..prefix()
            },
        )
        .await
        .expect_err("compacted");
        assert_compacted(&e);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_stream_is_pinned_and_fails_when_compacted_mid_stream() {
    if test_flavor() == Flavor::Etcd {
        return;
    }
    bounded(LIMIT, async {
        let c = Cluster::start(Flavor::Retcd, 1, &["--max-request-bytes=65536"])
            .await
            .expect("start");
        let mut kv = kv_with_window(&c, Some(65_535)).await;
        fill(&mut kv, 400, 4096).await;
        let before = kv.range(prefix()).await.unwrap().into_inner();
        let rev = before.header.unwrap().revision;

        // Writes after the first chunk are not seen: every key of the
        // stream is at the pinned revision, new keys do not appear.
        let mut s = kv.range_stream(prefix()).await.unwrap().into_inner();
        let first = s.message().await.unwrap().unwrap().range_response.unwrap();
        let mut w = kv.clone();
        for i in 0..400 {
            w.put(pb::PutRequest {
                key: key(i),
                value: b"changed".to_vec(),
                ..Default::default()
            })
            .await
            .unwrap();
        }
        w.put(pb::PutRequest {
            key: key(9999),
            value: b"new".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
        let mut all = vec![first];
        while let Some(m) = s.message().await.unwrap() {
            all.push(m.range_response.unwrap());
        }
        let m = merged(&all);
        assert_eq!(m.kvs, before.kvs, "the stream reads at its first revision");
        assert_eq!((m.count, m.header.unwrap().revision), (400, rev));

        // A compaction past the pinned revision while the stream is
        // open: the next chunk read fails with Compacted.
        let now = kv
            .range(prefix())
            .await
            .unwrap()
            .into_inner()
            .header
            .unwrap()
            .revision;
        let mut s = kv
            .range_stream(pb::RangeRequest {
                revision: rev,
                ..prefix()
            })
            .await
            .unwrap()
            .into_inner();
        let first = s.message().await.unwrap().unwrap().range_response.unwrap();
        assert!(first.header.is_none(), "more chunks follow the first");
        kv.compact(pb::CompactionRequest {
            revision: now,
            physical: true,
        })
        .await
        .expect("compact");
        let mut got = first.kvs.len();
        let err = loop {
            match s.message().await {
                Ok(Some(m)) => got += m.range_response.unwrap().kvs.len(),
                Ok(None) => {
                    panic!("the stream ended normally after a compaction past its revision")
                }
                Err(e) => break e,
            }
        };
        // The server is paced by the 64 KiB window: ~60 keys arrive
        // before the error here, whatever the machine's load.
        assert!(got < 200, "keys before the error: {got}");
        assert_compacted(&err);
    })
    .await;
}

/// `--max-range-response-bytes` (retcd's; etcd has only gRPC's 2 GiB send
/// limit): a Range or read-only Txn whose kvs would pass it fails with
/// ResourceExhausted in grpc-go's words, before the response is built;
/// a limited Range and RangeStream of the same keys still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_range_response_is_bounded() {
    if test_flavor() == Flavor::Etcd {
        return; // the flag is retcd's
    }
    bounded(LIMIT, async {
        let c = Cluster::start(Flavor::Retcd, 1, &["--max-range-response-bytes=100000"])
            .await
            .expect("start");
        let mut kv = kv(&c).await;
        fill(&mut kv, 60, 4000).await;
        let e = kv.range(prefix()).await.expect_err("over the bound");
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        let size: usize = e
            .message()
            .strip_prefix("grpc: trying to send message larger than max (")
            .and_then(|m| m.strip_suffix(" vs. 100000)"))
            .unwrap_or_else(|| panic!("message: {:?}", e.message()))
            .parse()
            .expect("size");
        assert!(size > 60 * 4000 && size < 60 * 4100, "reported size {size}");

        let txn = pb::TxnRequest {
            success: vec![pb::RequestOp {
                request: Some(pb::request_op::Request::RequestRange(prefix())),
            }],
            ..Default::default()
        };
        let e = kv.txn(txn).await.expect_err("txn over the bound");
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");

        // a small limit is read on the runtime and written whole: the
        // same bound
        let e = (kv.range(pb::RangeRequest {
            limit: 40,
            ..prefix()
        }))
        .await
        .expect_err("40 of them over the bound");
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(e.message().ends_with(" vs. 100000)"), "{e:?}");
        let r = kv
            .range(pb::RangeRequest {
                limit: 20,
                ..prefix()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!((r.kvs.len(), r.more, r.count), (20, true, 60));
        let r = kv
            .range(pb::RangeRequest {
                keys_only: true,
                ..prefix()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.kvs.len(), 60, "keys only fit");
        let all = merged(&chunks(&mut kv, prefix()).await.expect("stream"));
        assert_eq!((all.kvs.len(), all.count), (60, 60));
    })
    .await;
}

/// A Range of one key or a small limit is answered from the stored rows
/// (each a kv's encoding), sized from the index, or by reading the row
/// when it was read at an older revision than its key's newest: every
/// field as written, at the revision asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_ranges_answer_each_kv_as_written() {
    bounded(LIMIT, async {
        let c = Cluster::start(test_flavor(), 1, &[]).await.expect("start");
        let mut kv = kv(&c).await;
        fill(&mut kv, 10, 100).await;
        let before = kv.range(prefix()).await.unwrap().into_inner();
        let rev = before.header.as_ref().unwrap().revision;
        // keys 0, 2, 4, 6, 8 get a second version; key 9 is deleted
        for i in (0..10).step_by(2) {
            kv.put(pb::PutRequest {
                key: key(i),
                value: format!("second {i}").into_bytes(),
                ..Default::default()
            })
            .await
            .expect("put");
        }
        kv.delete_range(pb::DeleteRangeRequest {
            key: key(9),
            ..Default::default()
        })
        .await
        .expect("delete");
        let at = |revision: i64, limit: i64| pb::RangeRequest {
            revision,
            limit,
            ..prefix()
        };
        // at the old revision: the first versions, though 5 keys moved on
        let old = kv.range(at(rev, 8)).await.unwrap().into_inner();
        assert_eq!(old.kvs, before.kvs[..8].to_vec());
        assert_eq!((old.more, old.count), (true, 10));
        assert_eq!(
            old.header.unwrap().revision,
            rev + 6,
            "the store's revision"
        );
        // now: the second versions where there are, 9 keys
        let now = kv.range(at(0, 8)).await.unwrap().into_inner();
        assert_eq!((now.kvs.len(), now.more, now.count), (8, true, 9));
        for (i, got) in now.kvs.iter().enumerate() {
            let first = &before.kvs[i];
            assert_eq!(got.key, key(i));
            assert_eq!(got.create_revision, first.create_revision);
            if i % 2 == 0 {
                assert_eq!(got.value, format!("second {i}").into_bytes());
                assert_eq!(got.version, 2);
                assert!(got.mod_revision > rev);
            } else {
                assert_eq!(got, first);
            }
        }
        // one key, at each revision
        let one = |revision: i64| pb::RangeRequest {
            key: key(4),
            revision,
            ..Default::default()
        };
        let r = kv.range(one(rev)).await.unwrap().into_inner();
        assert_eq!(r.kvs, vec![before.kvs[4].clone()]);
        let r = kv.range(one(0)).await.unwrap().into_inner();
        assert_eq!(r.kvs[0].value, b"second 4".to_vec());
        // the deleted key: nothing now, its value then
        let gone = pb::RangeRequest {
            key: key(9),
            ..Default::default()
        };
        let r = kv.range(gone.clone()).await.unwrap().into_inner();
        assert!(r.kvs.is_empty() && r.count == 0, "{r:?}");
        let r = (kv.range(pb::RangeRequest {
            revision: rev,
            ..gone
        }))
        .await
        .unwrap()
        .into_inner();
        assert_eq!(r.kvs, vec![before.kvs[9].clone()]);
    })
    .await;
}

/// The server's resident memory, from /proc (KiB).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// A long unary Range is written as it is read: the client gets the one
/// ordinary `RangeResponse` (every key, in order, with its value, count and
/// header), while the server's memory grows by a small part of the
/// response (it was the whole response and more when tonic encoded it in
/// one buffer). etcd builds the whole response, so this is retcd's alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_range_is_sent_as_it_is_read() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    if test_flavor() == Flavor::Etcd {
        return; // etcd holds the whole response: its growth is its size
    }
    const N: usize = 12_288;
    const SIZE: usize = 4096;
    const PER_TXN: usize = 96;
    bounded(LIMIT, async {
        let c = Cluster::start(Flavor::Retcd, 1, &[]).await.expect("start");
        let mut kv = kv(&c).await;
        for t in 0..N / PER_TXN {
            let success = (t * PER_TXN..(t + 1) * PER_TXN)
                .map(|i| pb::RequestOp {
                    request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
                        key: key(i),
                        value: vec![b'a' + (i % 26) as u8; SIZE],
                        ..Default::default()
                    })),
                })
                .collect();
            kv.txn(pb::TxnRequest {
                success,
                ..Default::default()
            })
            .await
            .expect("txn of puts");
        }
        let pid = c.members[0].pid().expect("running");
        let before = rss_kib(pid);
        let (stop, peak) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let sampler = {
            let (stop, peak) = (stop.clone(), peak.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    peak.fetch_max(rss_kib(pid), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(2));
                }
            })
        };
        let r = kv.range(prefix()).await.expect("range").into_inner();
        stop.store(true, Ordering::Relaxed);
        sampler.join().expect("sampler");

        assert_eq!((r.kvs.len(), r.count, r.more), (N, N as i64, false));
        let h = r.header.expect("header");
        assert!(
            h.revision > (N / PER_TXN) as i64 && h.member_id != 0,
            "{h:?}"
        );
        for (i, got) in r.kvs.iter().enumerate() {
            assert_eq!(got.key.as_ref(), key(i).as_slice(), "kv {i}");
            assert_eq!(got.value.len(), SIZE, "kv {i}");
            assert_eq!(got.value[0], b'a' + (i % 26) as u8, "kv {i}");
            assert_eq!((got.version, got.lease), (1, 0), "kv {i}");
        }
        let response = r
            .kvs
            .iter()
            .map(|kv| kv.key.len() + kv.value.len())
            .sum::<usize>() as u64
            >> 10;
        let growth = peak.load(Ordering::Relaxed).saturating_sub(before);
        eprintln!("unary range: server RSS grew {growth} KiB sending a {response} KiB response");
        assert!(
            growth < response / 4,
            "server RSS grew {growth} KiB (from {before} KiB) sending a {response} KiB response"
        );
        // and a limit over the inline bound takes the same path
        let r = kv
            .range(pb::RangeRequest {
                limit: 5000,
                ..prefix()
            })
            .await
            .expect("range with limit")
            .into_inner();
        assert_eq!((r.kvs.len(), r.count, r.more), (5000, N as i64, true));
        assert_eq!(r.kvs[4999].key.as_ref(), key(4999).as_slice());
    })
    .await;
}

/// Many Ranges that find nothing, over one connection: each is answered,
/// and the connection stays up. A reply ending in an empty DATA frame
/// (the streamed path's last piece of an empty range) made h2 clients —
/// tonic's, and so the etcd-client crate's — send GOAWAY
/// `ENHANCE_YOUR_CALM` after 100 of them, failing every call open on the
/// connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_ranges_keep_the_connection() {
    bounded(LIMIT, async {
        let flavor = test_flavor();
        let c = Cluster::start(flavor, 1, &[]).await.expect("start");
        let mut kv = kv(&c).await;
        kv.put(pb::PutRequest {
            key: b"elsewhere".to_vec(),
            value: b"v".to_vec(),
            ..Default::default()
        })
        .await
        .expect("put");
        for i in 0..250 {
            let r = kv
                .range(prefix())
                .await
                .unwrap_or_else(|e| panic!("{} range {i} of an empty prefix: {e}", flavor.name()))
                .into_inner();
            assert_eq!((r.kvs.len(), r.count, r.more), (0, 0, false), "range {i}");
        }
        let r = kv
            .range(pb::RangeRequest {
                key: b"elsewhere".to_vec(),
                ..Default::default()
            })
            .await
            .expect("a range after them")
            .into_inner();
        assert_eq!(r.kvs.len(), 1);
    })
    .await;
}
