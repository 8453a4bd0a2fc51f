//! Process lifecycle: bind listeners, start the server, serve until
//! SIGTERM/SIGINT, then stop in order (clients, raft thread, backend).

use crate::api::client_port::ClientPort;
use crate::api::defer_writes::DeferWrites;
use crate::api::h2_authority::AuthorityFix;
use crate::config::{split_urls, url_host_port, Config};
use crate::server::EtcdServer;
use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::StreamExt;

pub async fn run(mut cfg: Config) -> anyhow::Result<()> {
    // etcd lists the data dir (identifyDataDirOrDie) before its
    // bootstrap checks.
    let dir = cfg.data_dir();
    if dir.exists() && !dir.is_dir() {
        anyhow::bail!("readdirent {}: not a directory", dir.display());
    }
    cfg.validate().map_err(anyhow::Error::msg)?;
    crate::metrics::set_extensive(cfg.metrics == "extensive");
    if !(4..=31).contains(&cfg.bcrypt_cost) {
        // As etcd: warn and use the default.
        tracing::warn!(
            "use default bcrypt-cost 10 instead of the invalid value {}",
            cfg.bcrypt_cost
        );
        cfg.bcrypt_cost = 10;
    }
    tracing::info!(
        etcd_version = %cfg.etcd_version,
        retcd_version = crate::config::version::RETCD_VERSION,
        name = %cfg.name,
        data_dir = %cfg.data_dir().display(),
        wal_dir = %cfg.wal_dir().display(),
        member_dir = %cfg.member_dir().display(),
        force_new_cluster = cfg.force_new_cluster,
        heartbeat_interval = %crate::log::GoDuration(std::time::Duration::from_millis(cfg.heartbeat_interval)),
        election_timeout = %crate::log::GoDuration(std::time::Duration::from_millis(cfg.election_timeout)),
        snapshot_count = cfg.snapshot_count,
        snapshot_catchup_entries = cfg.experimental_snapshot_catchup_entries,
        initial_advertise_peer_urls = %cfg.initial_advertise_peer_urls,
        listen_peer_urls = %cfg.listen_peer_urls,
        advertise_client_urls = %cfg.advertise_client_urls,
        listen_client_urls = %cfg.listen_client_urls,
        listen_metrics_urls = %cfg.listen_metrics_urls,
        initial_cluster = %cfg.initial_cluster.clone().unwrap_or_default(),
        initial_cluster_state = %cfg.initial_cluster_state,
        initial_cluster_token = %cfg.initial_cluster_token,
        quota_backend_bytes = cfg.quota_bytes(),
        pre_vote = cfg.pre_vote,
        initial_corrupt_check = cfg.experimental_initial_corrupt_check,
        corrupt_check_time_interval = %crate::log::GoDuration(cfg.experimental_corrupt_check_time),
        compact_check_time_enabled = cfg.experimental_compact_hash_check_enabled,
        compact_check_time_interval = %crate::log::GoDuration(cfg.experimental_compact_hash_check_time),
        auto_compaction_mode = %cfg.auto_compaction_mode,
        auto_compaction_retention = %cfg.auto_compaction_retention,
        max_learners = cfg.max_learners,
        "starting an etcd server"
    );
    if cfg.enable_pprof {
        tracing::info!(path = "/debug/pprof", "pprof is enabled");
    }
    let mut tls = crate::tls::Tls::from_config(&cfg)?;
    // Client TLS files that could not be loaded are an error only where
    // etcd loads them: an `https://` metrics listener (opened once the
    // server has started) or an `https://`/`unixs://` client listener
    // (once the server is ready); with `http://` URLs only, never.
    let mut client_tls_error = tls.client_error.take();
    let secure = |u: &String| u.starts_with("https://") || u.starts_with("unixs://");
    crate::api::gateway::set_access(
        &cfg.cors,
        &cfg.host_whitelist,
        split_urls(&cfg.listen_client_urls)
            .iter()
            .chain(split_urls(&cfg.listen_client_http_urls).iter())
            .all(secure),
    );
    // Clients are stopped first; peers (and raft) keep running while they
    // drain and while a leader hands leadership over, as etcd does.
    let (stop_tx, stop_rx) = watch::channel(false);
    let (peer_stop_tx, peer_stop_rx) = watch::channel(false);

    // Peer listeners first: peers may dial us as soon as raft starts (the
    // kernel queues their connections until the peer service is served,
    // right after the server starts).
    let mut peer_listeners = Vec::new();
    for url in split_urls(&cfg.listen_peer_urls) {
        let addr = url_host_port(&url).map_err(anyhow::Error::msg)?;
        let l = TcpListener::bind(&addr)
            .await
            .map_err(|e| go_listen_error(&addr, &e))?;
        let acceptor = https_acceptor(&url, &tls.peer_acceptor, &cfg, true)?;
        peer_listeners.push((l, acceptor));
    }

    // Then the client listeners, and only then the checks of
    // --initial-cluster: etcd binds both kinds of listener before its
    // server looks at the cluster (embed.StartEtcd), so a port in use is
    // what it reports first.
    let mut client_listeners = Vec::new();
    // Secure client listeners bound but never served: their TLS files
    // could not be loaded (`client_tls_error`).
    let mut unserved = Vec::new();
    let grpc_urls = split_urls(&cfg.listen_client_urls);
    let http_urls = split_urls(&cfg.listen_client_http_urls);
    for (url, grpc) in grpc_urls
        .into_iter()
        .map(|u| (u, true))
        .chain(http_urls.into_iter().map(|u| (u, false)))
    {
        if client_tls_error.is_some() && secure(&url) {
            unserved.push(bind_client(&url).await?);
            continue;
        }
        // etcd refuses an https or unixs client URL without a certificate
        // before it binds anything.
        if url.starts_with("unixs://") {
            https_acceptor(
                &url.replacen("unixs://", "https://", 1),
                &tls.client_acceptor,
                &cfg,
                false,
            )
            .map_err(|e| anyhow::anyhow!(e.to_string().replace("https://", "unixs://")))?;
        }
        let (addr, l) = bind_client(&url).await?;
        let acceptor = https_acceptor(&url, &tls.client_acceptor, &cfg, false)?;
        client_listeners.push((grpc, addr, l, acceptor));
    }
    // embed.StartEtcd parses the compaction retention before NewServer
    // looks at --initial-cluster (flags seed 38).
    crate::server::compactor::parse(&cfg.auto_compaction_mode, &cfg.auto_compaction_retention)
        .map_err(anyhow::Error::msg)?;
    // It may resolve peer URLs' host names (up to 30 s): a blocking thread.
    {
        let cfg = cfg.clone();
        tokio::task::spawn_blocking(move || cfg.verify_bootstrap())
            .await?
            .map_err(anyhow::Error::msg)?;
    }

    // Opening the data dir replays the WAL (and joining asks a peer): a
    // blocking thread, not a runtime worker.
    let server = {
        let (cfg, dialer) = (cfg.clone(), tls.dialer.clone());
        tokio::task::spawn_blocking(move || {
            let started = EtcdServer::start(cfg, dialer);
            crate::release_freed_memory();
            started
        })
        .await
        .context("the bootstrap task failed")??
    };

    let mut tasks = Vec::new();
    let mut peer_tasks = Vec::new();
    let peer_san_check = tls.peer_san_check;
    for (l, acceptor) in peer_listeners {
        let svc = crate::api::peer::service(server.clone());
        let mut rx = peer_stop_rx.clone();
        // served on the peer runtime, the listener registered with it
        let l = l.into_std().context("peer listener")?;
        peer_tasks.push(crate::raft::transport::peer_runtime().spawn(async move {
            let l = match TcpListener::from_std(l) {
                Ok(l) => l,
                Err(e) => {
                    tracing::error!(error = %e, "peer server failed");
                    return;
                }
            };
            let builder = tonic::transport::Server::builder()
                .tcp_nodelay(true)
                .add_service(svc);
            let stop = async move {
                let _ = rx.wait_for(|s| *s).await;
            };
            let r = match acceptor {
                Some(a) => {
                    let incoming = crate::tls::incoming(l, a, peer_san_check);
                    builder.serve_with_incoming_shutdown(incoming, stop).await
                }
                None => builder.serve_with_incoming_shutdown(nodelay(l), stop).await,
            };
            if let Err(e) = r {
                tracing::error!(error = %e, "peer server failed");
            }
        }));
    }

    // a large unary Range's freed values go back to the system while its
    // encoding grows (retcd_api::codec)
    let _ = retcd_api::codec::RELEASE_MEMORY.set(crate::release_freed_memory);
    let (health_reporter, _) = tonic_health::server::health_reporter();
    let health_service = tonic_health::pb::health_server::HealthServer::new(
        tonic_health::server::HealthService::from_health_reporter(health_reporter.clone()),
    );
    health_reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    // the client port's gRPC metrics (after `metrics::set_extensive`)
    crate::api::grpc_metrics::init();
    let services = crate::api::grpc::client_services(&server);

    // --listen-metrics-urls: served at once, so probes see the member
    // before it is ready (etcd serves them from start-up too).
    for url in split_urls(&cfg.listen_metrics_urls) {
        let addr = url_host_port(&url).map_err(anyhow::Error::msg)?;
        let l = TcpListener::bind(&addr)
            .await
            .map_err(|e| go_listen_error(&addr, &e))?;
        if url.starts_with("https://") {
            if let Some(e) = client_tls_error.take() {
                anyhow::bail!(e);
            }
        }
        let acceptor = https_acceptor(&url, &tls.client_acceptor, &cfg, false)?;
        let router = crate::api::http::metrics_router(server.clone());
        tracing::info!(address = %addr, "serving metrics");
        tasks.push(tokio::spawn(serve_http(
            l,
            acceptor,
            router,
            stop_rx.clone(),
        )));
    }

    // With --listen-client-http-urls, the client URLs serve gRPC only and
    // these serve the HTTP endpoints (etcd 3.5.8+).
    let http_apart = !cfg.listen_client_http_urls.is_empty();
    for (grpc, addr, l, acceptor) in client_listeners {
        let mut router = axum::Router::new();
        if !grpc || !http_apart {
            router = router.merge(crate::api::http::router(server.clone()));
            if cfg.enable_grpc_gateway {
                router = router.merge(crate::api::gateway::router(&server, &services));
            }
        }
        let router = router.fallback(crate::api::gateway::client_fallback);
        let port = if grpc {
            ClientPort::new(
                server.clone(),
                services.servers.clone(),
                health_service.clone(),
                router,
            )
        } else {
            ClientPort::http_only(router)
        };
        let mut rx = stop_rx.clone();
        let mut published = server.published();
        let secure = acceptor.is_some();
        let nonzero = |d: std::time::Duration| (!d.is_zero()).then_some(d);
        let settings = crate::api::serve::Settings {
            keepalive_interval: nonzero(cfg.grpc_keepalive_interval),
            keepalive_timeout: nonzero(cfg.grpc_keepalive_timeout),
            max_concurrent_streams: cfg.max_concurrent_streams,
            connect_info: cfg.client_cert_auth,
        };
        tasks.push(tokio::spawn(async move {
            // As etcd: the port is bound now, clients are served once this
            // member's publish is applied (until then connections wait).
            tokio::select! {
                _ = published.wait_for(|p| *p) => {}
                _ = rx.wait_for(|s| *s) => return,
            }
            tracing::info!("ready to serve client requests");
            if secure {
                tracing::info!(address = %addr, "serving client traffic securely");
            } else {
                tracing::info!(
                    address = %addr,
                    "serving client traffic insecurely; this is strongly discouraged!"
                );
            }
            let stop = async move {
                let _ = rx.wait_for(|s| *s).await;
            };
            use crate::api::serve::serve;
            match (l, acceptor) {
                (ClientListener::Tcp(l), Some(a)) => {
                    let incoming = crate::tls::incoming(l, a, false)
                        .map(|s| s.map(|s| DeferWrites::new(AuthorityFix::new(s))));
                    serve(incoming, port, settings, stop).await
                }
                (ClientListener::Tcp(l), None) => {
                    let incoming =
                        nodelay(l).map(|s| s.map(|s| DeferWrites::new(AuthorityFix::new(s))));
                    serve(incoming, port, settings, stop).await
                }
                (ClientListener::Unix(l), _) => {
                    let incoming = tokio_stream::wrappers::UnixListenerStream::new(l)
                        .map(|s| s.map(|s| DeferWrites::new(AuthorityFix::new(s))));
                    serve(incoming, port, settings, stop).await
                }
            }
        }));
    }

    // Type=notify units: tell systemd once clients are served.
    if let Ok(sock) = std::env::var("NOTIFY_SOCKET") {
        let mut published = server.published();
        tasks.push(tokio::spawn(async move {
            if published.wait_for(|p| *p).await.is_ok() {
                tracing::info!("notifying init daemon");
                match sd_notify(&sock, "READY=1") {
                    Ok(()) => tracing::info!("successfully notified init daemon"),
                    Err(e) => tracing::error!(error = %e, "failed to notify systemd for readiness"),
                }
            }
        }));
    }

    // etcd's secure client listener fails once the server is ready, and
    // etcd exits ("listener failed").
    let listener_failed = async {
        match client_tls_error {
            Some(e) if !unserved.is_empty() => {
                let mut published = server.published();
                if published.wait_for(|p| *p).await.is_ok() {
                    return e;
                }
                std::future::pending().await
            }
            _ => std::future::pending().await,
        }
    };
    let (signal, signo) = tokio::select! {
        s = shutdown_signal() => s,
        e = listener_failed => {
            tracing::error!(error = %e, "listener failed");
            anyhow::bail!(e);
        }
    };
    drop(unserved);
    RECEIVED.store(signo, std::sync::atomic::Ordering::SeqCst);
    tracing::info!(signal, "received signal; shutting down");
    tracing::info!(
        name = %cfg.name,
        data_dir = %cfg.data_dir().display(),
        advertise_peer_urls = %cfg.initial_advertise_peer_urls,
        advertise_client_urls = %cfg.advertise_client_urls,
        "closing etcd server"
    );
    let _ = stop_tx.send(true);
    // Bounded: streams that never end (watches) are cut after the grace.
    let grace = tokio::time::sleep(std::time::Duration::from_secs(2));
    tokio::pin!(grace);
    for t in tasks {
        tokio::select! {
            _ = t => {}
            _ = &mut grace => break,
        }
    }
    server.transfer_leadership_on_stop().await;
    tracing::info!("stopping serving peer traffic");
    let _ = peer_stop_tx.send(true);
    for t in peer_tasks {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), t).await;
    }
    tracing::info!("stopped serving peer traffic");
    server.stop().await;
    tracing::info!(
        name = %cfg.name,
        data_dir = %cfg.data_dir().display(),
        advertise_peer_urls = %cfg.initial_advertise_peer_urls,
        advertise_client_urls = %cfg.advertise_client_urls,
        "closed etcd server"
    );
    Ok(())
}

/// A client listener: TCP, or a unix socket for `unix://` URLs.
enum ClientListener {
    Tcp(TcpListener),
    Unix(tokio::net::UnixListener),
}

/// Binds a client URL. `unix://name:port` listens on the socket file
/// `name:port` (relative to the working directory, as etcd does; a stale
/// file is replaced); `unixs://` (TLS over a unix socket) is refused.
async fn bind_client(url: &str) -> anyhow::Result<(String, ClientListener)> {
    if let Some(path) = url.strip_prefix("unix://") {
        let _ = std::fs::remove_file(path);
        let l = tokio::net::UnixListener::bind(path)
            .with_context(|| format!("cannot listen for clients on unix socket {path}"))?;
        return Ok((path.to_string(), ClientListener::Unix(l)));
    }
    if url.starts_with("unixs://") {
        anyhow::bail!("{url}: TLS over unix sockets (unixs://) is not supported by retcd");
    }
    let addr = url_host_port(url).map_err(anyhow::Error::msg)?;
    let l = TcpListener::bind(&addr)
        .await
        .map_err(|e| go_listen_error(&addr, &e))?;
    Ok((addr, ClientListener::Tcp(l)))
}

/// A failed bind as Go's `net.Listen` words it
/// (`listen tcp 127.0.0.1:2379: bind: address already in use`).
fn go_listen_error(addr: &str, e: &std::io::Error) -> anyhow::Error {
    let text = match e.raw_os_error() {
        Some(n) => {
            let t = std::io::Error::from_raw_os_error(n).to_string();
            let t = t.split(" (os error").next().unwrap_or(&t).to_string();
            let mut c = t.chars();
            match c.next() {
                Some(f) => f.to_lowercase().chain(c).collect(),
                None => t,
            }
        }
        None => e.to_string(),
    };
    anyhow::anyhow!("listen tcp {addr}: bind: {text}")
}

/// Serves an HTTP-only router (the metrics URLs) until stopped.
async fn serve_http(
    l: TcpListener,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    router: axum::Router,
    mut rx: watch::Receiver<bool>,
) {
    let builder = tonic::transport::Server::builder()
        .accept_http1(true)
        .add_routes(router.into());
    let stop = async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let r = match acceptor {
        Some(a) => {
            builder
                .serve_with_incoming_shutdown(crate::tls::incoming(l, a, false), stop)
                .await
        }
        None => builder.serve_with_incoming_shutdown(nodelay(l), stop).await,
    };
    if let Err(e) = r {
        tracing::error!(error = %e, "metrics server failed");
    }
}

/// The acceptor for `url`: Some for `https://` (an error, with etcd's
/// words, if the certificate and key were not both given), None for
/// `http://`.
fn https_acceptor(
    url: &str,
    acceptor: &Option<tokio_rustls::TlsAcceptor>,
    cfg: &Config,
    peer: bool,
) -> anyhow::Result<Option<tokio_rustls::TlsAcceptor>> {
    if !url.starts_with("https://") {
        return Ok(None);
    }
    if let Some(a) = acceptor {
        return Ok(Some(a.clone()));
    }
    let (cert, key) = if peer {
        (&cfg.peer_cert_file, &cfg.peer_key_file)
    } else {
        (&cfg.cert_file, &cfg.key_file)
    };
    let show = |p: &Option<std::path::PathBuf>| {
        p.as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    };
    if cert.is_some() || key.is_some() {
        anyhow::bail!(
            "KeyFile and CertFile must both be present[key: {}, cert: {}]",
            show(key),
            show(cert)
        );
    }
    if peer {
        let addr = url_host_port(url).unwrap_or_default();
        anyhow::bail!("cannot listen on TLS for {addr}: KeyFile and CertFile are not presented");
    }
    anyhow::bail!(
        "TLS key/cert (--cert-file, --key-file) must be provided for client url {url} with HTTPS scheme"
    )
}

/// Accepted connections with TCP_NODELAY (small gRPC frames must not wait
/// for Nagle's algorithm).
fn nodelay(
    l: TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    TcpListenerStream::new(l).map(|s| {
        let s = s?;
        s.set_nodelay(true)?;
        Ok(s)
    })
}

/// systemd's notify protocol: one datagram to `$NOTIFY_SOCKET` (a path,
/// or `@name` for the abstract namespace).
fn sd_notify(socket: &str, state: &str) -> std::io::Result<()> {
    use std::os::unix::net::UnixDatagram;
    let s = UnixDatagram::unbound()?;
    if let Some(name) = socket.strip_prefix('@') {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
        s.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        s.send_to(state.as_bytes(), socket)?;
    }
    Ok(())
}

/// The signal that stopped the server (0: none yet).
static RECEIVED: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// As etcd: after a clean shutdown on a signal, the process dies of that
/// signal (a shell sees 143 for SIGTERM). Returns only if none stopped it.
pub fn reraise_signal() {
    let signo = RECEIVED.load(std::sync::atomic::Ordering::SeqCst);
    if signo != 0 {
        if let Err(e) = signal_hook::low_level::emulate_default_handler(signo) {
            tracing::warn!(error = %e, "cannot re-raise the signal; exiting 0");
        }
    }
}

/// Waits for SIGTERM or SIGINT; the name Go gives the signal, and its number.
async fn shutdown_signal() -> (&'static str, i32) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
    tokio::select! {
        _ = term.recv() => ("terminated", libc::SIGTERM),
        _ = int.recv() => ("interrupt", libc::SIGINT),
    }
}
