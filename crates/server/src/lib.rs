//! retcd's server: the raft node, the apply path, the gRPC services and the
//! HTTP endpoints, configured with etcd's flags.
//!
//! The modules are layered (a module imports only from its own layer or
//! below; `docs/design.md` draws it, and `tests/layers.rs` checks it):
//!
//! ```text
//! run                                  process lifecycle
//! api        grpc/ gateway http peer   what clients and peers talk to
//! server     EtcdServer                the typed API, bootstrap, background jobs
//! raft       node storage transport    consensus, the WAL, the Ready loop
//! apply      applier chain, members    committed entry -> state machine
//! auth       store, tokens, perms      users, roles, permissions
//! config error ids log metrics tls failpoints   leaves
//! ```

pub mod api;
pub mod apply;
pub mod auth;
pub mod config;
pub mod error;
pub mod failpoints;
pub mod ids;
pub mod log;
pub mod metrics;
pub mod raft;
pub mod run;
pub mod server;
pub mod tls;

/// Returns to the system the memory this thread freed. mimalloc (the
/// binaries' allocator) keeps a thread's freed pages for its next
/// allocations; a thread that freed much and allocates little afterwards
/// (the bootstrap, after replaying the WAL and rebuilding the index) would
/// keep them in the RSS. Harmless under another allocator.
#[allow(unsafe_code)]
pub fn release_freed_memory() {
    // SAFETY: mi_collect only walks mimalloc's own heap of this thread
    // and its arenas; it takes no pointer.
    unsafe { libmimalloc_sys::mi_collect(true) }
}
