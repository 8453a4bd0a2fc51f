//! What etcd's users see of the Go standard library, for retcd's command
//! lines (the server's flags and config file, `retcdctl`, `retcdutl`):
//! `strconv`'s quoting and number parsing with their error texts, `time`'s
//! durations, and Go's byte strings carried in Rust text ([`raw`]).
//!
//! Each function follows Go 1.16's source (etcd 3.5.1 is built with it),
//! error texts included: scripts and operators match on them.

pub mod raw;
pub mod strconv;
pub mod time;
