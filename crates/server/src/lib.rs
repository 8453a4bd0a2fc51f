//! retcd's server: the raft node, the apply path, the gRPC services and the
//! HTTP endpoints, configured with etcd's flags.

pub mod alarm;
pub mod apply;
pub mod auth;
pub mod authority_fix;
pub mod compactor;
pub mod config;
pub mod corrupt;
pub mod error;
pub mod fp;
pub mod gateway;
pub mod grpc;
pub mod http;
pub mod ids;
pub mod log;
pub mod membership;
pub mod metrics;
pub mod quota;
pub mod raft_node;
pub mod raft_storage;
pub mod run;
pub mod server;
pub mod spin;
pub mod tls;
pub mod transport;
