//! Process lifecycle: bind listeners, start the server, serve until
//! SIGTERM/SIGINT, then stop in order (clients, raft thread, backend).

use crate::api::h2_authority::AuthorityFix;
use crate::config::{split_urls, url_host_port, Config};
use crate::ids::Hex;
use crate::server::EtcdServer;
use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::StreamExt;

pub async fn run(mut cfg: Config) -> anyhow::Result<()> {
    cfg.validate().map_err(anyhow::Error::msg)?;
    if !(4..=31).contains(&cfg.bcrypt_cost) {
        // As etcd: warn and use the default.
        tracing::warn!(
            "use default bcrypt-cost 10 instead of the invalid value {}",
            cfg.bcrypt_cost
        );
        cfg.bcrypt_cost = 10;
    }
    let tls = crate::tls::Tls::from_config(&cfg)?;
    let (stop_tx, stop_rx) = watch::channel(false);

    // Peer listeners first: peers may dial us as soon as raft starts (the
    // kernel queues their connections until the peer service is served,
    // right after the server starts).
    let mut peer_listeners = Vec::new();
    for url in split_urls(&cfg.listen_peer_urls) {
        let addr = url_host_port(&url).map_err(anyhow::Error::msg)?;
        let l = TcpListener::bind(&addr)
            .await
            .with_context(|| format!("cannot listen for peers on {addr}"))?;
        let acceptor = https_acceptor(&url, &tls.peer_acceptor, "--peer-cert-file")?;
        peer_listeners.push((l, acceptor));
    }

    // Opening the data dir replays the WAL (and joining asks a peer): a
    // blocking thread, not a runtime worker.
    let server = {
        let (cfg, dialer) = (cfg.clone(), tls.dialer.clone());
        tokio::task::spawn_blocking(move || EtcdServer::start(cfg, dialer))
            .await
            .context("the bootstrap task failed")??
    };

    let mut tasks = Vec::new();
    let peer_san_check = tls.peer_san_check;
    for (l, acceptor) in peer_listeners {
        let svc = crate::api::peer::service(server.clone());
        let mut rx = stop_rx.clone();
        tasks.push(tokio::spawn(async move {
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

    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    // the client port's gRPC metrics (after `metrics::set_extensive`)
    crate::api::grpc_metrics::init();
    let services = crate::api::grpc::client_services(&server);
    let max_streams = cfg.max_concurrent_streams;
    for url in split_urls(&cfg.listen_client_urls) {
        let addr = url_host_port(&url).map_err(anyhow::Error::msg)?;
        let l = TcpListener::bind(&addr)
            .await
            .with_context(|| format!("cannot listen for clients on {addr}"))?;
        let routes = services.routes.clone().add_service(health_service.clone());
        let axum_router = routes
            .into_axum_router()
            .layer(axum::middleware::from_fn_with_state(
                server.clone(),
                crate::api::client_guard,
            ))
            // outermost: counts what the guard refuses too
            .layer(axum::middleware::from_fn(crate::api::grpc_metrics::layer))
            .merge(crate::api::http::router(server.clone()))
            .merge(crate::api::gateway::router(&server, &services));
        let mut rx = stop_rx.clone();
        let mut published = server.published();
        let acceptor = https_acceptor(&url, &tls.client_acceptor, "--cert-file")?;
        tasks.push(tokio::spawn(async move {
            // As etcd: the port is bound now, clients are served once this
            // member's publish is applied (until then connections wait).
            tokio::select! {
                _ = published.wait_for(|p| *p) => {}
                _ = rx.wait_for(|s| *s) => return,
            }
            tracing::info!(address = %addr, "serving client traffic");
            let builder = tonic::transport::Server::builder()
                .accept_http1(true)
                .tcp_nodelay(true)
                .max_concurrent_streams(max_streams)
                .add_routes(axum_router.into());
            let stop = async move {
                let _ = rx.wait_for(|s| *s).await;
            };
            let r = match acceptor {
                Some(a) => {
                    let incoming =
                        crate::tls::incoming(l, a, false).map(|s| s.map(AuthorityFix::new));
                    builder.serve_with_incoming_shutdown(incoming, stop).await
                }
                None => {
                    let incoming = nodelay(l).map(|s| s.map(AuthorityFix::new));
                    builder.serve_with_incoming_shutdown(incoming, stop).await
                }
            };
            if let Err(e) = r {
                tracing::error!(error = %e, "client server failed");
            }
        }));
    }
    tracing::info!(
        name = %cfg.name,
        member = %Hex(server.member_id),
        cluster = %Hex(server.cluster_id),
        "ready to serve"
    );

    shutdown_signal().await;
    tracing::info!("received shutdown signal, stopping");
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), t).await;
    }
    server.stop().await;
    Ok(())
}

/// The acceptor for `url`: Some for `https://` (an error if the
/// certificate flag `flag` was not given), None for `http://`.
fn https_acceptor(
    url: &str,
    acceptor: &Option<tokio_rustls::TlsAcceptor>,
    flag: &str,
) -> anyhow::Result<Option<tokio_rustls::TlsAcceptor>> {
    if !url.starts_with("https://") {
        return Ok(None);
    }
    match acceptor {
        Some(a) => Ok(Some(a.clone())),
        None => anyhow::bail!("{url} is https: {flag} and its key file are required"),
    }
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

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
