//! `retcd`: the server binary. Same flags and ETCD_* variables as `etcd`.

use clap::Parser;
use retcd_server::config::Config;

fn main() {
    let cfg = Config::parse();
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
