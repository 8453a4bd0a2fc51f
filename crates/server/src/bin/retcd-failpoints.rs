//! `retcd-failpoints`: the `retcd` server compiled with the `failpoints`
//! feature (`fail::fail_point!` in the durable path, set by `FAILPOINTS`;
//! docs/robustness.md). Built only with `--features failpoints`, so the
//! test command builds it next to `retcd` in the same target dir, sharing
//! every dependency, instead of a second full build.

#[path = "../server_main.rs"]
mod server_main;

fn main() {
    server_main::main()
}
