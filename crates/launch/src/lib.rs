//! Server processes on loopback, for the integration tests (`retcd-tests`)
//! and `retcd-bench compare`: both start retcd or the real etcd the same
//! way, through this crate.
//!
//! * [`free_port`] — a loopback port for a server to listen on;
//! * [`MemberFlags`] and [`initial_cluster`] — etcd's flags for one member
//!   of a cluster (retcd takes the same flags);
//! * [`Process`] — a spawned server whose stdout and stderr go to a log
//!   file, waited for until it serves ([`Process::wait_ready`]), signalled
//!   and stopped by its own PID (never by name); dropping it SIGKILLs and
//!   reaps it, so a failing caller leaves no orphan.
//!
//! ```no_run
//! # async fn f() {
//! use retcd_launch::{free_port, initial_cluster, MemberFlags, Process};
//! use std::{path::Path, process::Command, time::Duration};
//!
//! let (c, p) = (free_port(), free_port());
//! let (curl, purl) = (format!("http://127.0.0.1:{c}"), format!("http://127.0.0.1:{p}"));
//! let flags = MemberFlags {
//!     name: "m0",
//!     data_dir: Path::new("/tmp/x/m0.etcd"),
//!     client_url: &curl,
//!     peer_url: &purl,
//!     advertise_peer_url: &purl,
//!     initial_cluster: &initial_cluster([("m0", &purl)]),
//!     token: "tok",
//!     state: "new",
//! };
//! let mut cmd = Command::new("/usr/bin/etcd");
//! cmd.args(flags.args());
//! let mut server = Process::spawn(&mut cmd, Path::new("/tmp/x/m0.log")).unwrap();
//! server.wait_ready(&curl, Duration::from_secs(60), Duration::from_secs(5)).await.unwrap();
//! server.stop_within(Duration::from_secs(10));
//! # }
//! ```

mod flags;
mod ports;
mod process;

pub use flags::{initial_cluster, MemberFlags};
pub use ports::free_port;
pub use process::{log_tail, read_log, signal, NotReady, Process};
