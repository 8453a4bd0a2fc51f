//! `watch` and `watch-latency`: `streams × watch_per_stream` watchers over
//! `watched_key_total` keys, then `put_total` puts to those keys (round
//! robin). Every put's value starts with the 8-byte send time, so each
//! delivered event gives one put→event latency. The event report's
//! requests/sec is **events delivered per second**, from the first put to
//! the last event.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use etcd_client::Client;
use retcd_api::etcdserverpb::watch_request::RequestUnion;
use retcd_api::etcdserverpb::{WatchCreateRequest, WatchRequest};
use tonic::transport::Channel;

use crate::report::{new_histogram, process_cpu_secs, Report};
use crate::runner::{progress, run, Drive};
use crate::watch_decode::LiteWatchResponse;
use crate::workloads::encode_key;

#[derive(Debug, Clone)]
pub struct WatchOpts {
    pub streams: usize,
    pub watch_per_stream: usize,
    pub watched_key_total: usize,
    pub put_total: u64,
    pub put_rate: f64,
    pub put_clients: usize,
    pub key_size: usize,
    pub val_size: usize,
    /// Give up waiting for events this long after the last put.
    pub drain_timeout: Duration,
    /// Watchers in all, spread as evenly as can be over the streams
    /// (`None`: `streams × watch_per_stream`). The scale workload asks for
    /// N watchers over S streams where S need not divide N.
    pub watchers_total: Option<usize>,
}

impl WatchOpts {
    /// The number of watchers over all streams.
    pub fn total_watchers(&self) -> usize {
        self.watchers_total
            .unwrap_or(self.streams.max(1) * self.watch_per_stream.max(1))
    }

    /// How many of them stream `s` carries (the first `total % streams`
    /// streams one more than the others).
    pub fn watchers_on_stream(&self, s: usize) -> usize {
        let streams = self.streams.max(1);
        match self.watchers_total {
            None => self.watch_per_stream.max(1),
            Some(n) => n / streams + usize::from(s < n % streams),
        }
    }
}

/// Returns (events report, puts report).
pub async fn watch(
    clients: &[Client],
    channels: &[Channel],
    o: &WatchOpts,
    show_progress: bool,
) -> Result<(Report, Report)> {
    create_watchers(channels, o, show_progress)
        .await?
        .put_and_drain(clients, o)
        .await
}

/// The watchers of a run, created and reading their streams, before any
/// put: [`create_watchers`] then [`Watchers::put_and_drain`], so a caller
/// can measure the server in between (its memory with the watchers
/// registered, as the scale workload does).
pub struct Watchers {
    keys: Arc<Vec<Vec<u8>>>,
    /// The put times in values and the receive times are nanoseconds since this.
    base: Instant,
    received: Arc<AtomicU64>,
    pb: indicatif::ProgressBar,
    tasks: Vec<tokio::task::JoinHandle<(hdrhistogram::Histogram<u64>, u64, Instant)>>,
    expected_total: u64,
    total_watchers: usize,
    create_secs: f64,
}

/// Opens the streams and creates every watcher (each stream's creates
/// acknowledged before the next stream), then leaves one task per stream
/// reading its events.
pub async fn create_watchers(
    channels: &[Channel],
    o: &WatchOpts,
    show_progress: bool,
) -> Result<Watchers> {
    let nkeys = o.watched_key_total.max(1);
    // A prefix of 0xff keeps the watched keys apart from put/range keys.
    let keys: Arc<Vec<Vec<u8>>> = Arc::new(
        (0..nkeys)
            .map(|k| {
                let mut key = vec![0xffu8, b'w'];
                key.extend(encode_key(k as u64, o.key_size.saturating_sub(2).max(1)));
                key
            })
            .collect(),
    );
    let puts_on = |k: usize| -> u64 {
        let base = o.put_total / nkeys as u64;
        base + u64::from((k as u64) < o.put_total % nkeys as u64)
    };
    let streams = o.streams.max(1);
    let total_watchers = o.total_watchers();
    let expected_total: u64 = (0..total_watchers).map(|w| puts_on(w % nkeys)).sum();

    let base = Instant::now();
    let received = Arc::new(AtomicU64::new(0));
    let pb = progress(expected_total, show_progress, "watch events");
    let mut tasks = Vec::new();
    let create_start = Instant::now();
    let mut first = 0;
    for s in 0..streams {
        let here = o.watchers_on_stream(s);
        if here == 0 {
            continue;
        }
        // Straight over the channel, decoding only the send times
        // (`watch_decode`), so the client's cost per event stays well below
        // the servers'.
        let (req_tx, req_rx) = tokio::sync::mpsc::channel(here + 1);
        for j in 0..here {
            let create = WatchCreateRequest {
                key: keys[(first + j) % nkeys].clone(),
                ..Default::default()
            };
            req_tx
                .send(WatchRequest {
                    request_union: Some(RequestUnion::CreateRequest(create)),
                })
                .await
                .context("queue watch create")?;
        }
        let mut stream = open_watch_stream(&channels[s % channels.len()], req_rx)
            .await
            .context("create watch stream")?;
        let mut created = 0;
        while created < here {
            match stream.message().await? {
                Some(r) if r.canceled => bail!("watch canceled: {}", r.cancel_reason),
                Some(r) if r.created => created += 1,
                Some(_) => {}
                None => bail!("watch stream closed while creating watchers"),
            }
        }
        let expected: u64 = (0..here).map(|j| puts_on((first + j) % nkeys)).sum();
        first += here;
        let received = received.clone();
        let pb = pb.clone();
        tasks.push(tokio::spawn(async move {
            // the request side stays open while events are read
            let _keep = req_tx;
            let mut h = new_histogram();
            let mut got = 0u64;
            let mut last = Instant::now();
            while got < expected {
                let Ok(Some(r)) = stream.message().await else {
                    break;
                };
                let at = Instant::now();
                let now = at.saturating_duration_since(base).as_nanos() as u64;
                let n = r.sent.len() as u64;
                for sent in r.sent.iter().flatten() {
                    h.saturating_record(now.saturating_sub(*sent).max(1));
                }
                got += n;
                last = at;
                received.fetch_add(n, Ordering::Relaxed);
                pb.inc(n);
            }
            (h, got, last)
        }));
    }
    Ok(Watchers {
        keys,
        base,
        received,
        pb,
        tasks,
        expected_total,
        total_watchers,
        create_secs: create_start.elapsed().as_secs_f64(),
    })
}

impl Watchers {
    /// `put_total` puts to the watched keys, then waits for the events
    /// (giving up when none arrive for `drain_timeout`). Returns (events
    /// report, puts report).
    pub async fn put_and_drain(
        self,
        clients: &[Client],
        o: &WatchOpts,
    ) -> Result<(Report, Report)> {
        let Watchers {
            keys,
            base,
            received,
            pb,
            tasks,
            expected_total,
            total_watchers,
            create_secs,
        } = self;
        let cpu0 = process_cpu_secs();
        let put_start = Instant::now();
        let val_size = o.val_size.max(8);
        let d = Drive {
            clients: o.put_clients.max(1),
            total: o.put_total,
            rate: o.put_rate,
            progress: false,
        };
        let puts = run("watch puts", &d, |c| {
            let kv = clients[c % clients.len()].kv_client();
            let keys = keys.clone();
            move |i| {
                let mut kv = kv.clone();
                let key = keys[(i % keys.len() as u64) as usize].clone();
                let mut val = vec![b'x'; val_size];
                val[..8].copy_from_slice(&(base.elapsed().as_nanos() as u64).to_le_bytes());
                async move {
                    kv.put(key, val, None).await?;
                    Ok(())
                }
            }
        })
        .await;

        // Wait for the events, giving up when none arrive for drain_timeout.
        let mut h = new_histogram();
        let mut got = 0;
        let mut last_event = put_start;
        let mut errors = 0;
        let mut first_error = None;
        for t in tasks {
            let mut t = t;
            loop {
                let before = received.load(Ordering::Relaxed);
                match tokio::time::timeout(o.drain_timeout, &mut t).await {
                    Ok(Ok((th, tg, tl))) => {
                        h.add(&th).expect("same bounds");
                        got += tg;
                        last_event = last_event.max(tl);
                        break;
                    }
                    Ok(Err(e)) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| format!("watch task: {e}"));
                        break;
                    }
                    Err(_) if received.load(Ordering::Relaxed) > before => continue,
                    Err(_) => {
                        t.abort();
                        first_error.get_or_insert_with(|| {
                            format!("no watch event for {:?}: events lost", o.drain_timeout)
                        });
                        break;
                    }
                }
            }
        }
        pb.finish_and_clear();
        if got < expected_total {
            errors += expected_total - got;
        }
        let elapsed = last_event.saturating_duration_since(put_start);
        let mut ev = Report::from_histogram(
            "watch events",
            &h,
            elapsed,
            errors,
            first_error,
            process_cpu_secs() - cpu0,
        );
        ev.extra.insert("watchers".into(), total_watchers.into());
        ev.extra
            .insert("events_expected".into(), expected_total.into());
        ev.extra.insert("events_delivered".into(), got.into());
        ev.extra.insert(
            "watcher_creation_secs".into(),
            serde_json::json!((create_secs * 1e4).round() / 1e4),
        );
        Ok((ev, puts))
    }
}

/// Opens a Watch stream on `channel` whose requests come from `requests`
/// and whose responses are decoded as [`LiteWatchResponse`]s.
async fn open_watch_stream(
    channel: &Channel,
    requests: tokio::sync::mpsc::Receiver<WatchRequest>,
) -> Result<tonic::Streaming<LiteWatchResponse>> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.context("watch channel not ready")?;
    let codec = tonic_prost::ProstCodec::<WatchRequest, LiteWatchResponse>::default();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/etcdserverpb.Watch/Watch");
    let req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(requests));
    Ok(grpc.streaming(req, path, codec).await?.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(streams: usize, per: usize, total: Option<usize>) -> WatchOpts {
        WatchOpts {
            streams,
            watch_per_stream: per,
            watched_key_total: 1,
            put_total: 1,
            put_rate: 0.0,
            put_clients: 1,
            key_size: 8,
            val_size: 8,
            drain_timeout: Duration::from_secs(1),
            watchers_total: total,
        }
    }

    /// N watchers over S streams: every watcher on some stream, the
    /// streams' counts within one of each other.
    #[test]
    fn watchers_spread_over_streams() {
        let o = opts(3, 5, None);
        assert_eq!(o.total_watchers(), 15);
        assert_eq!((0..3).map(|s| o.watchers_on_stream(s)).sum::<usize>(), 15);
        let o = opts(4, 0, Some(10));
        assert_eq!(o.total_watchers(), 10);
        let per: Vec<usize> = (0..4).map(|s| o.watchers_on_stream(s)).collect();
        assert_eq!(per, vec![3, 3, 2, 2]);
    }
}
