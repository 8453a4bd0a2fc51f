//! placeholder
pub mod backend;
pub mod wal;
