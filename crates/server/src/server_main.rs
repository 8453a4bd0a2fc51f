//! The server's entry, shared by the `retcd` binary (main.rs) and the
//! `retcd-failpoints` binary (bin/retcd-failpoints.rs): same flags and
//! ETCD_* variables as `etcd`.

use retcd_server::config::{flags, Config, Exit};

/// mimalloc: glibc malloc was 20-30% of CPU under load (docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub(crate) fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let env: Vec<(String, String)> = std::env::vars().collect();
    let cfg = match Config::load(&args, &env) {
        Ok(cfg) => cfg,
        Err(e) => exit_on(e),
    };
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
    if let Err(e) = retcd_server::log::init(&cfg) {
        eprintln!("retcd: {e}");
        std::process::exit(1);
    }
    let argv: Vec<String> = std::env::args().collect();
    tracing::info!(args = ?argv, "Running: ");
    for n in &cfg.notices {
        retcd_server::log::notice(n);
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = client_workers() {
        builder.worker_threads(n);
    }
    let rt = match builder.enable_all().thread_name("retcd-worker").build() {
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
    drop(rt);
    retcd_server::run::reraise_signal();
}

/// The client runtime's worker threads: one fewer than the CPUs this
/// process may run on, and at least one (`TOKIO_WORKER_THREADS`, when
/// set, decides instead). The raft thread (the WAL's fdatasync, the
/// apply) keeps a CPU busy of its own; a worker for every CPU beside it
/// only adds wake-ups: a worker woken from outside the runtime (the raft
/// thread answering) wakes a sibling to keep one searching, which finds
/// nothing and parks again. On two CPUs one worker took 8–27 % less CPU
/// per request on every standard row at the same throughput
/// (docs/benchmarks.md, twenty-eighth session).
fn client_workers() -> Option<usize> {
    if std::env::var_os("TOKIO_WORKER_THREADS").is_some() {
        return None;
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    Some(cpus.saturating_sub(1).max(1))
}

/// etcd's answers to what stops it before it starts: help and version on
/// stdout (exit 0), flag errors with the usage block (exit 2), the rest
/// logged as etcd logs them (exit 1).
fn exit_on(e: Exit) -> ! {
    match e {
        Exit::Help => {
            eprintln!("{}", flags::USAGE);
            println!("{}", flags::help_text());
            std::process::exit(0)
        }
        Exit::Version => {
            print!("{}", retcd_server::config::version::version_text());
            std::process::exit(0)
        }
        Exit::Usage(msg) => {
            eprintln!("{msg}");
            eprintln!("{}", flags::USAGE);
            std::process::exit(2)
        }
        Exit::Verify(msg) => {
            let unset = msg == retcd_server::config::ERR_UNSET_ADVERTISE;
            retcd_server::log::early("warn", "failed to verify flags", &[("error", msg.clone())]);
            if unset {
                retcd_server::log::early(
                    "warn",
                    "advertise client URLs are not set",
                    &[("error", msg)],
                );
            }
            std::process::exit(1)
        }
        Exit::Quiet(_) => std::process::exit(1),
        Exit::Panic(msg) => {
            eprintln!("panic: {msg}");
            std::process::exit(2)
        }
        Exit::Fatal(msg, fields) => {
            retcd_server::log::early("fatal", &msg, &fields);
            std::process::exit(1)
        }
        Exit::Plain(msg) => {
            eprintln!("{msg}");
            std::process::exit(1)
        }
    }
}
