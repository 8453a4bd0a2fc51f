//! etcd's v3 wire API, generated from our own copies of etcd's .proto files.
//!
//! Package, service, method, message and field names and numbers are etcd's
//! wire contract; `retcdpb` holds retcd's internal messages (raft proposals,
//! peer transport).
#![allow(clippy::all, missing_docs)]

pub mod codec;

pub mod mvccpb {
    include!(concat!(env!("OUT_DIR"), "/mvccpb.rs"));
    include!(concat!(env!("OUT_DIR"), "/mvccpb.serde.rs"));
}
pub mod authpb {
    include!(concat!(env!("OUT_DIR"), "/authpb.rs"));
    include!(concat!(env!("OUT_DIR"), "/authpb.serde.rs"));
}
pub mod etcdserverpb {
    include!(concat!(env!("OUT_DIR"), "/etcdserverpb.rs"));
    include!(concat!(env!("OUT_DIR"), "/etcdserverpb.serde.rs"));
}
pub mod v3lockpb {
    include!(concat!(env!("OUT_DIR"), "/v3lockpb.rs"));
    include!(concat!(env!("OUT_DIR"), "/v3lockpb.serde.rs"));
}
pub mod v3electionpb {
    include!(concat!(env!("OUT_DIR"), "/v3electionpb.rs"));
    include!(concat!(env!("OUT_DIR"), "/v3electionpb.serde.rs"));
}
pub mod retcdpb {
    include!(concat!(env!("OUT_DIR"), "/retcdpb.rs"));
}
