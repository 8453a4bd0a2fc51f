//! `retcd`: the server binary. Same flags and ETCD_* variables as `etcd`.

use clap::Parser;
use retcd_server::config::Config;

/// mimalloc: glibc malloc was 20-30% of CPU under load (docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let cfg = Config::parse();
    // A panic on the raft thread or the watch-sync thread stops the whole
    // process (fail-stop): a member whose raft loop died must not keep
    // serving. In the failpoints build every panic does (crash points).
    // A panic in a request task only fails that request (tokio catches it).
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        let critical = matches!(std::thread::current().name(), Some("raft" | "watch-sync"));
        if critical || cfg!(feature = "failpoints") {
            std::process::abort()
        }
    }));
    // Failpoints build only: FAILPOINTS configures them.
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    retcd_server::log::init(&cfg.log_level);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("retcd-worker")
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("retcd: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(retcd_server::run::run(cfg)) {
        tracing::error!("{e:#}");
        eprintln!("retcd: {e:#}");
        std::process::exit(1);
    }
}
