//! `retcd`: the server binary. Same flags and ETCD_* variables as `etcd`.

mod server_main;

fn main() {
    server_main::main()
}
