//! Versions: retcd's own, and the etcd release whose API and behaviour
//! retcd implements (reported in Maintenance.Status and `/version`, since
//! clients gate features on it; `--emulated-etcd-version` changes it).

/// The newest etcd release whose client-visible API and behaviour retcd
/// implements (see docs/design.md, "Which etcd").
pub const ETCD_VERSION: &str = "3.5.24";

/// retcd's own version.
pub const RETCD_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The cluster version for an etcd version: `major.minor.0`.
pub fn cluster_version(etcd_version: &str) -> String {
    let mut it = etcd_version.split('.');
    format!(
        "{}.{}.0",
        it.next().unwrap_or("3"),
        it.next().unwrap_or("5")
    )
}

/// `retcd --version`.
pub fn version_text() -> String {
    format!(
        "retcd Version: {RETCD_VERSION}\netcd Version: {ETCD_VERSION}\nGit SHA: {}\nRust Version: {}\nOS/Arch: {}/{}\n",
        option_env!("RETCD_GIT_SHA").unwrap_or("unknown"),
        option_env!("RETCD_RUSTC_VERSION").unwrap_or("unknown"),
        std::env::consts::OS,
        match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            a => a,
        }
    )
}
