//! etcd's command-line flags for one member of a cluster.

use std::fmt::Display;
use std::path::Path;

/// The flags that place one member: its name, data dir, URLs and the
/// cluster it belongs to. [`MemberFlags::args`] gives them in etcd's
/// spelling; retcd takes the same.
#[derive(Debug, Clone, Copy)]
pub struct MemberFlags<'a> {
    /// `--name`.
    pub name: &'a str,
    /// `--data-dir`.
    pub data_dir: &'a Path,
    /// `--listen-client-urls` and `--advertise-client-urls`.
    pub client_url: &'a str,
    /// `--listen-peer-urls`.
    pub peer_url: &'a str,
    /// `--initial-advertise-peer-urls`: `peer_url` unless peers reach the
    /// member through something in between (a fault proxy).
    pub advertise_peer_url: &'a str,
    /// `--initial-cluster` (see [`initial_cluster`]).
    pub initial_cluster: &'a str,
    /// `--initial-cluster-token`.
    pub token: &'a str,
    /// `--initial-cluster-state`: `new` or `existing`.
    pub state: &'a str,
}

impl MemberFlags<'_> {
    /// `--name N --data-dir D --listen-client-urls C --advertise-client-urls C
    /// --listen-peer-urls P --initial-advertise-peer-urls A --initial-cluster I
    /// --initial-cluster-token T --initial-cluster-state S`.
    pub fn args(&self) -> Vec<String> {
        [
            ("--name", self.name.to_string()),
            ("--data-dir", self.data_dir.display().to_string()),
            ("--listen-client-urls", self.client_url.to_string()),
            ("--advertise-client-urls", self.client_url.to_string()),
            ("--listen-peer-urls", self.peer_url.to_string()),
            (
                "--initial-advertise-peer-urls",
                self.advertise_peer_url.to_string(),
            ),
            ("--initial-cluster", self.initial_cluster.to_string()),
            ("--initial-cluster-token", self.token.to_string()),
            ("--initial-cluster-state", self.state.to_string()),
        ]
        .into_iter()
        .flat_map(|(flag, value)| [flag.to_string(), value])
        .collect()
    }
}

/// `--initial-cluster`'s value: `name=peerURL` pairs joined by commas.
pub fn initial_cluster<N: Display, U: Display>(
    members: impl IntoIterator<Item = (N, U)>,
) -> String {
    members
        .into_iter()
        .map(|(n, u)| format!("{n}={u}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_in_etcd_spelling() {
        let ic = initial_cluster([("m0", "http://127.0.0.1:2"), ("m1", "http://127.0.0.1:4")]);
        assert_eq!(ic, "m0=http://127.0.0.1:2,m1=http://127.0.0.1:4");
        let f = MemberFlags {
            name: "m0",
            data_dir: Path::new("/d/m0.etcd"),
            client_url: "http://127.0.0.1:1",
            peer_url: "http://127.0.0.1:2",
            advertise_peer_url: "http://127.0.0.1:3",
            initial_cluster: &ic,
            token: "tok",
            state: "existing",
        };
        assert_eq!(
            f.args().join(" "),
            "--name m0 --data-dir /d/m0.etcd \
             --listen-client-urls http://127.0.0.1:1 --advertise-client-urls http://127.0.0.1:1 \
             --listen-peer-urls http://127.0.0.1:2 --initial-advertise-peer-urls http://127.0.0.1:3 \
             --initial-cluster m0=http://127.0.0.1:2,m1=http://127.0.0.1:4 \
             --initial-cluster-token tok --initial-cluster-state existing"
        );
    }
}
