//! `check perf` and `check datascale`: etcdctl's write workloads with its
//! progress bar (cheggaaa/pb v1, format "Bom !") and its PASS/FAIL lines.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{CompactionOptions, DeleteOptions, GetOptions};
use rand::Rng as _;
use tokio::sync::mpsc;

use crate::client::{
    self, Conn, ConnConf, Exit, RpcError, EXIT_BAD_FEATURE, EXIT_ERROR, EXIT_INVALID_INPUT,
};
use crate::gofmt;
use crate::printer::{out, outln};
use crate::Ctx;

/// `s`/`small` … `xl`/`xLarge`; etcdctl exits 4 on anything else.
fn model(load: &str) -> Result<usize, Exit> {
    match load {
        "s" | "small" => Ok(0),
        "m" | "medium" => Ok(1),
        "l" | "large" => Ok(2),
        "xl" | "xLarge" => Ok(3),
        _ => Err(Exit::new(
            EXIT_BAD_FEATURE,
            format!("unknown load option {load}"),
        )),
    }
}

/// cheggaaa/pb v1 as etcdctl sets it up: counters, a "Bom !" bar when
/// stdout's terminal has a width, percent and time left; redrawn every
/// 200 ms with `\r`.
struct Bar {
    total: i64,
    current: AtomicI64,
    start: Instant,
    /// (previous value, when it last changed).
    change: Mutex<(i64, Instant)>,
    finished: AtomicBool,
    width: usize,
}

#[allow(unsafe_code)] // one ioctl, as pb does through x/sys/unix
fn terminal_width() -> usize {
    // pb reads the width of /dev/tty (0 without one: no bar, no padding).
    let Ok(f) = std::fs::File::open("/dev/tty") else {
        return 0;
    };
    use std::os::fd::AsRawFd as _;
    // SAFETY: winsize is plain old data; all-zero is a valid value.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ fills a winsize on a valid descriptor.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) };
    if r != 0 {
        0
    } else {
        ws.ws_col as usize
    }
}

/// Go's `time.Duration.String()` for whole seconds.
fn go_secs(d: Duration) -> String {
    let s = d.as_secs();
    let (h, m, s) = (s / 3600, (s / 60) % 60, s % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

/// pb's `formatDuration`: `[Nd][Nh]MMmSSs`.
fn pb_duration(d: Duration) -> String {
    let mut r = String::new();
    let mut s = d.as_secs();
    if s > 86400 {
        r.push_str(&format!("{}d", s / 86400));
        s %= 86400;
    }
    if s > 3600 {
        r.push_str(&format!("{}h", s / 3600));
        s %= 3600;
    }
    format!("{r}{:02}m{:02}s", s / 60, s % 60)
}

impl Bar {
    fn start(total: i64) -> Arc<Bar> {
        let now = Instant::now();
        let b = Arc::new(Bar {
            total,
            current: AtomicI64::new(0),
            start: now,
            change: Mutex::new((0, now)),
            finished: AtomicBool::new(false),
            width: terminal_width(),
        });
        b.update();
        let r = b.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(200));
            if r.finished.load(Ordering::SeqCst) {
                return;
            }
            r.update();
        });
        b
    }

    fn add(&self, n: i64) {
        self.current.fetch_add(n, Ordering::SeqCst);
    }

    fn update(&self) {
        let c = self.current.load(Ordering::SeqCst);
        {
            let mut ch = self.change.lock().expect("bar");
            if ch.0 != c {
                *ch = (c, Instant::now());
            }
        }
        self.write(c, false);
    }

    fn finish(&self) {
        if self.finished.swap(true, Ordering::SeqCst) {
            return;
        }
        self.write(self.current.load(Ordering::SeqCst), true);
        out("\n");
    }

    fn write(&self, current: i64, finishing: bool) {
        if !finishing && self.finished.load(Ordering::SeqCst) {
            return;
        }
        let total = self.total;
        let percent = if total > 0 {
            current as f64 / (total as f64 / 100.0)
        } else {
            current as f64 / 100.0
        };
        let percent_box = format!(" {percent:6.2}%");
        let counters = format!(" {current} / {total} ");
        let from_start = self.start.elapsed();
        let time_left = if finishing {
            format!(" {}", go_secs(from_start))
        } else {
            let last_change = self.change.lock().expect("bar").1;
            let from_change = last_change.duration_since(self.start);
            if current > 0 {
                let per = from_change.as_nanos() as i128 / current as i128;
                let mut left = (total - current) as i128 * per;
                left -= last_change.elapsed().as_nanos() as i128;
                left = left / 1_000_000_000 * 1_000_000_000;
                if left > 0 {
                    format!(" {}", pb_duration(Duration::from_nanos(left as u64)))
                } else {
                    String::new()
                }
            } else {
                String::new()
            }
        };
        let fixed = counters.chars().count() + 2 + percent_box.len() + time_left.len();
        let mut bar = String::new();
        if self.width > fixed {
            let size = self.width - fixed;
            let cur = ((current as f64 / total as f64) * size as f64).ceil() as usize;
            let cur = cur.min(size);
            let empty = size - cur;
            bar.push('B');
            if empty == 0 {
                bar.push_str(&"o".repeat(cur));
            } else if cur > 0 {
                bar.push_str(&"o".repeat(cur - 1));
                bar.push('m');
            }
            bar.push_str(&" ".repeat(empty));
            bar.push('!');
        }
        let line = format!("{counters}{bar}{percent_box}{time_left}");
        let pad = self.width.saturating_sub(line.chars().count());
        out(&format!("\r{line}{}", " ".repeat(pad)));
    }
}

/// One request's outcome, as etcd's `report.Result`.
#[derive(Default)]
struct Results {
    lats: Vec<f64>,
    errors: BTreeMap<String, usize>,
}

struct Stats {
    rps: f64,
    slowest: f64,
    stddev: f64,
    errors: BTreeMap<String, usize>,
}

fn stats(r: Results, total: Duration) -> Stats {
    let n = r.lats.len() as f64;
    let avg = r.lats.iter().sum::<f64>() / n;
    let var = r.lats.iter().map(|l| (l - avg) * (l - avg)).sum::<f64>() / n;
    Stats {
        rps: n / total.as_secs_f64(),
        slowest: r.lats.iter().cloned().fold(0.0, f64::max),
        stddev: var.sqrt(),
        errors: r.errors,
    }
}

/// `binary.PutVarint(k, rand.Int63n(MaxInt64))` into a zeroed `size`-byte key.
fn random_key(size: usize) -> Vec<u8> {
    let mut k = vec![0u8; size];
    let x: i64 = rand::rng().random_range(0..i64::MAX);
    let mut ux = (x as u64) << 1; // zigzag of a non-negative value
    let mut i = 0;
    while ux >= 0x80 {
        k[i] = (ux as u8) | 0x80;
        ux >>= 7;
        i += 1;
    }
    k[i] = ux as u8;
    k
}

/// `cfg.clients` connections, as etcdctl makes one client per worker.
async fn clients(ctx: &mut Ctx, n: usize, deadline: Option<Instant>) -> Result<Vec<Conn>, Exit> {
    let conf = ctx.conn_conf(true)?;
    ctx.printer()?;
    let mut cs = Vec::with_capacity(n);
    for _ in 0..n {
        cs.push(client::connect(&conf, deadline).await?);
    }
    Ok(cs)
}

/// Workers putting `prefix + key` → value from a channel; each result is
/// recorded (and the bar advanced when `bar` is given).
fn spawn_workers(
    cs: &[Conn],
    rx: mpsc::Receiver<(Vec<u8>, Vec<u8>)>,
    results: Arc<Mutex<Results>>,
    bar: Option<Arc<Bar>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    cs.iter()
        .map(|c| {
            let (rx, results, bar) = (rx.clone(), results.clone(), bar.clone());
            let mut kv = c.client.kv_client();
            tokio::spawn(async move {
                loop {
                    let Some((k, v)) = rx.lock().await.recv().await else {
                        return;
                    };
                    let st = Instant::now();
                    let r = kv.put(k, v, None).await;
                    let d = st.elapsed();
                    {
                        let mut res = results.lock().expect("results");
                        match r {
                            Ok(_) => res.lats.push(d.as_secs_f64()),
                            Err(e) => {
                                *res.errors.entry(RpcError::from(e).message()).or_default() += 1
                            }
                        }
                    }
                    if let Some(b) = &bar {
                        b.add(1);
                    }
                }
            })
        })
        .collect()
}

/// Is anything under `prefix`? (exit 3 if so, with etcdctl's hint.)
async fn check_empty(
    c: &Conn,
    prefix: &str,
    deadline: Option<Instant>,
    hint: String,
) -> Result<(), Exit> {
    let mut kv = c.client.kv_client();
    let r = c
        .unary(
            deadline,
            kv.get(prefix, Some(GetOptions::new().with_prefix().with_limit(1))),
        )
        .await
        .map_err(|e| Exit::new(EXIT_ERROR, e.message()))?;
    if !r.0.kvs.is_empty() {
        return Err(Exit::new(EXIT_INVALID_INPUT, hint));
    }
    Ok(())
}

/// `compact`: physical compaction at `rev`, announced before and after.
async fn compact(c: &Conn, rev: i64) -> Result<(), Exit> {
    outln(&format!("Compacting with revision {rev}"));
    let mut kv = c.client.kv_client();
    let d = Some(Instant::now() + Duration::from_secs(30));
    c.unary(
        d,
        kv.compact(rev, Some(CompactionOptions::new().with_physical())),
    )
    .await
    .map_err(|e| Exit::new(EXIT_ERROR, e.message()))?;
    outln(&format!("Compacted with revision {rev}"));
    Ok(())
}

/// `defrag` of each `--endpoints` member.
async fn defrag_all(conf: &ConnConf) -> Result<(), Exit> {
    for ep in &conf.endpoints {
        outln(&format!("Defragmenting {}", gofmt::quote(ep)));
        let mut one = conf.clone();
        one.endpoints = vec![ep.clone()];
        let d = Some(Instant::now() + Duration::from_secs(30));
        let c = client::connect(&one, d).await?;
        let mut m = c.client.maintenance_client();
        c.unary(d, m.defragment())
            .await
            .map_err(|e| Exit::new(EXIT_ERROR, e.message()))?;
        outln(&format!("Defragmented {}", gofmt::quote(ep)));
    }
    Ok(())
}

const PERF: [(u32, usize); 4] = [(150, 50), (1000, 200), (8000, 500), (15000, 1000)];
const PERF_SECS: u64 = 60;

/// `attemptCleanup`: delete the prefix (and compact after it).
async fn cleanup(c: &Conn, prefix: &str, auto_compact: bool) -> Result<(), Exit> {
    let mut kv = c.client.kv_client();
    let d = Some(Instant::now() + Duration::from_secs(30));
    match c
        .unary(
            d,
            kv.delete(prefix, Some(DeleteOptions::new().with_prefix())),
        )
        .await
    {
        Err(e) => {
            outln(&format!(
                "FAIL: Cleanup failed during key deletion: ERROR({})",
                e.message()
            ));
            Ok(())
        }
        Ok(r) if auto_compact => compact(c, r.0.header.map(|h| h.revision).unwrap_or(0)).await,
        Ok(_) => Ok(()),
    }
}

pub async fn check_perf(ctx: &mut Ctx) -> Result<(), Exit> {
    let (limit, nclients) = PERF[model(ctx.p.get("load"))?];
    let prefix = ctx.p.get("prefix").to_string();
    let (auto_compact, auto_defrag) = (ctx.p.bool("auto-compact"), ctx.p.bool("auto-defrag"));
    let deadline = Instant::now() + Duration::from_secs(PERF_SECS);
    let cs = clients(ctx, nclients, Some(deadline)).await?;
    let conf = ctx.conn_conf(true)?;

    // SIGINT: stop the load and clean up (interruptableContext).
    let stop = Arc::new(AtomicBool::new(false));
    {
        let (stop, c0, prefix) = (stop.clone(), cs[0].clone(), prefix.clone());
        let mut sig = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
            .map_err(|e| Exit::new(EXIT_ERROR, e.to_string()))?;
        tokio::spawn(async move {
            sig.recv().await;
            stop.store(true, Ordering::SeqCst);
            let _ = cleanup(&c0, &prefix, false).await;
        });
    }

    check_empty(
        &cs[0],
        &prefix,
        Some(deadline),
        format!(
            "prefix {} has keys. Delete with 'etcdctl del --prefix {}' first",
            gofmt::quote(&prefix),
            prefix
        ),
    )
    .await?;

    let bar = Bar::start(PERF_SECS as i64);
    let results = Arc::new(Mutex::new(Results::default()));
    let (tx, rx) = mpsc::channel(nclients);
    let workers = spawn_workers(&cs, rx, results.clone(), None);
    let st = Instant::now();

    // rate.NewLimiter(limit, 1): one request per 1/limit s, never past the deadline.
    let gen_stop = stop.clone();
    let pfx = prefix.clone().into_bytes();
    let generator = tokio::spawn(async move {
        let every = Duration::from_secs_f64(1.0 / limit as f64);
        let mut next = Instant::now();
        loop {
            let now = Instant::now();
            if next < now {
                next = now;
            }
            if next > deadline || gen_stop.load(Ordering::SeqCst) {
                return;
            }
            tokio::time::sleep_until(next.into()).await;
            if gen_stop.load(Ordering::SeqCst) {
                return;
            }
            next += every;
            let k = [pfx.as_slice(), &random_key(256)].concat();
            if tx.send((k, vec![0u8; 1024])).await.is_err() {
                return;
            }
        }
    });
    let b = bar.clone();
    std::thread::spawn(move || {
        for _ in 0..PERF_SECS {
            std::thread::sleep(Duration::from_secs(1));
            b.add(1);
        }
        b.finish();
    });

    let _ = generator.await;
    for w in workers {
        let _ = w.await;
    }
    let res = std::mem::take(&mut *results.lock().expect("results"));
    let s = stats(res, st.elapsed());

    cleanup(&cs[0], &prefix, auto_compact).await?;
    if auto_defrag {
        defrag_all(&conf).await?;
    }

    let mut ok = true;
    if !s.errors.is_empty() {
        outln("FAIL: too many errors");
        for (k, v) in &s.errors {
            outln(&format!("FAIL: ERROR({k}) -> {v}"));
        }
        ok = false;
    }
    if s.rps / limit as f64 <= 0.9 {
        outln(&format!(
            "FAIL: Throughput too low: {} writes/s",
            s.rps as i64 + 1
        ));
        ok = false;
    } else {
        outln(&format!(
            "PASS: Throughput is {} writes/s",
            s.rps as i64 + 1
        ));
    }
    if s.slowest > 0.5 {
        outln(&format!(
            "Slowest request took too long: {}s",
            go_f(s.slowest)
        ));
        ok = false;
    } else {
        outln(&format!("PASS: Slowest request took {}s", go_f(s.slowest)));
    }
    if s.stddev > 0.1 {
        outln(&format!("Stddev too high: {}s", go_f(s.stddev)));
        ok = false;
    } else {
        outln(&format!("PASS: Stddev is {}s", go_f(s.stddev)));
    }
    if ok {
        outln("PASS");
        Ok(())
    } else {
        outln("FAIL");
        Err(Exit::silent(EXIT_ERROR))
    }
}

/// Go's `%f` (NaN as `NaN`).
fn go_f(x: f64) -> String {
    if x.is_nan() {
        "NaN".into()
    } else {
        format!("{x:.6}")
    }
}

const DATASCALE: [(usize, usize); 4] = [
    (10_000, 50),
    (100_000, 200),
    (1_000_000, 500),
    (3_000_000, 1000),
];
const KV_SIZE: usize = 1024;

pub async fn check_datascale(ctx: &mut Ctx) -> Result<(), Exit> {
    let (limit, nclients) = DATASCALE[model(ctx.p.get("load"))?];
    let prefix = ctx.p.get("prefix").to_string();
    let (auto_compact, auto_defrag) = (ctx.p.bool("auto-compact"), ctx.p.bool("auto-defrag"));
    let cs = clients(ctx, nclients, None).await?;
    let conf = ctx.conn_conf(true)?;
    let ep = conf.endpoints.first().cloned().unwrap_or_default();

    check_empty(
        &cs[0],
        &prefix,
        None,
        format!(
            "prefix {} has keys. Delete with etcdctl del --prefix {} first",
            gofmt::quote(&prefix),
            prefix
        ),
    )
    .await?;

    let before = memory_metric(&ep, &conf).await;
    if before == 0.0 {
        outln("FAIL: Could not read process_resident_memory_bytes before the put operations.");
        return Err(Exit::silent(EXIT_ERROR));
    }
    outln(&format!(
        "Start data scale check for work load [{limit} key-value pairs, {KV_SIZE} bytes per key-value, {nclients} concurrent clients]."
    ));
    let bar = Bar::start(limit as i64);
    let results = Arc::new(Mutex::new(Results::default()));
    let (tx, rx) = mpsc::channel(nclients);
    let workers = spawn_workers(&cs, rx, results.clone(), Some(bar.clone()));
    let st = Instant::now();
    let pfx = prefix.clone().into_bytes();
    tokio::spawn(async move {
        for _ in 0..limit {
            let k = [pfx.as_slice(), &random_key(512)].concat();
            if tx.send((k, vec![0u8; 512])).await.is_err() {
                return;
            }
        }
    });
    for w in workers {
        let _ = w.await;
    }
    bar.finish();
    let res = std::mem::take(&mut *results.lock().expect("results"));
    let s = stats(res, st.elapsed());

    let after = memory_metric(&ep, &conf).await;
    if after == 0.0 {
        outln("FAIL: Could not read process_resident_memory_bytes after the put operations.");
        return Err(Exit::silent(EXIT_ERROR));
    }
    let mut kv = cs[0].client.kv_client();
    let r = cs[0]
        .unary(
            None,
            kv.delete(prefix.as_str(), Some(DeleteOptions::new().with_prefix())),
        )
        .await
        .map_err(|e| Exit::new(EXIT_ERROR, e.message()))?;
    if auto_compact {
        compact(&cs[0], r.0.header.map(|h| h.revision).unwrap_or(0)).await?;
    }
    if auto_defrag {
        defrag_all(&conf).await?;
    }
    let mb = (after - before) / (1024.0 * 1024.0);
    if !s.errors.is_empty() {
        outln("FAIL: too many errors");
        for (k, v) in &s.errors {
            outln(&format!("FAIL: ERROR({k}) -> {v}"));
        }
        return Err(Exit::silent(EXIT_ERROR));
    }
    outln(&format!(
        "PASS: Approximate system memory used : {mb:.2} MB."
    ));
    Ok(())
}

/// `endpointMemoryMetrics`: `process_resident_memory_bytes` from the
/// endpoint's `/metrics` (0 after printing why, as etcdctl does).
async fn memory_metric(host: &str, conf: &ConnConf) -> f64 {
    let url = if host.starts_with("http://") || host.starts_with("https://") {
        format!("{host}/metrics")
    } else {
        format!("http://{host}/metrics")
    };
    let body = match fetch(&url, conf).await {
        Ok(b) => b,
        Err(e) => {
            outln(&format!("fetch error: {e}"));
            return 0.0;
        }
    };
    const KEY: &str = "process_resident_memory_bytes";
    let Some(v) = body
        .lines()
        .find(|l| l.starts_with(KEY))
        .map(|l| l[KEY.len()..].trim().to_string())
        .filter(|v| !v.is_empty())
    else {
        outln(&format!("could not find: {KEY}"));
        return 0.0;
    };
    match v.parse::<f64>() {
        Ok(x) => x,
        Err(_) => {
            outln(&format!(
                "parse error: strconv.ParseFloat: parsing {}: invalid syntax",
                gofmt::quote(&v)
            ));
            0.0
        }
    }
}

/// A plain HTTP/1.1 GET (over TLS for https, with the client's TLS
/// settings); the body, de-chunked.
async fn fetch(url: &str, conf: &ConnConf) -> Result<String, String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let get_err = |e: String| format!("Get {}: {e}", gofmt::quote(url));
    let (tls, rest) = match url.strip_prefix("https://") {
        Some(r) => (true, r),
        None => (false, url.trim_start_matches("http://")),
    };
    let (hostport, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr = if hostport.contains(':') {
        hostport.to_string()
    } else {
        format!("{hostport}:{}", if tls { 443 } else { 80 })
    };
    let tcp = tokio::net::TcpStream::connect(&addr).await.map_err(|e| {
        get_err(format!(
            "dial tcp {addr}: connect: {}",
            client::errno_text(&e)
        ))
    })?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {hostport}\r\nUser-Agent: Go-http-client/1.1\r\nConnection: close\r\n\r\n");
    let mut raw = Vec::new();
    if tls {
        let mut c = conf.clone();
        c.insecure_transport = false;
        let cfg = client::tls_config(&c)
            .map_err(get_err)?
            .ok_or_else(|| get_err("no TLS configuration".into()))?;
        let host = hostport.rsplit_once(':').map(|h| h.0).unwrap_or(hostport);
        let name = rustls_pki_types::ServerName::try_from(host.to_string())
            .map_err(|e| get_err(e.to_string()))?;
        let mut s = tokio_rustls::TlsConnector::from(cfg)
            .connect(name, tcp)
            .await
            .map_err(|e| get_err(e.to_string()))?;
        s.write_all(req.as_bytes())
            .await
            .map_err(|e| get_err(e.to_string()))?;
        let _ = s.read_to_end(&mut raw).await;
    } else {
        let mut s = tcp;
        s.write_all(req.as_bytes())
            .await
            .map_err(|e| get_err(e.to_string()))?;
        s.read_to_end(&mut raw)
            .await
            .map_err(|e| get_err(e.to_string()))?;
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return Err(get_err("malformed HTTP response".into()));
    };
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        Ok(dechunk(body))
    } else {
        Ok(body.to_string())
    }
}

fn dechunk(mut b: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = b.split_once("\r\n") {
        let n = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        b = rest[n..].trim_start_matches("\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_as_go_and_pb_do() {
        assert_eq!(go_secs(Duration::from_secs(60)), "1m0s");
        assert_eq!(go_secs(Duration::from_secs(7)), "7s");
        assert_eq!(pb_duration(Duration::from_secs(59)), "00m59s");
        assert_eq!(pb_duration(Duration::from_secs(61)), "01m01s");
    }

    #[test]
    fn keys_are_zigzag_varints_in_zeros() {
        let k = random_key(256);
        assert_eq!(k.len(), 256);
        assert_eq!(k[0] & 1, 0);
        assert_eq!(dechunk("3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"), "abcde");
    }
}
