//! retcdctl: etcdctl 3.5's v3 command line, shipped with retcd.
//!
//! It takes etcdctl's command lines (commands, flags, `ETCDCTL_*`
//! variables), prints what etcdctl prints in every `-w` format and exits
//! with etcdctl's codes, so scripts written against etcdctl run
//! unchanged. The client underneath is the `etcd-client` crate.

mod client;
mod cmd;
mod cobra;
mod gofmt;
mod json;
mod printer;
mod tree;

use std::time::{Duration, Instant};

use retcd_gostd::raw;

use client::{ConnConf, Exit, EXIT_BAD_ARGS, EXIT_BAD_FEATURE, EXIT_ERROR};
use cobra::{Outcome, Parsed};
use printer::{Format, Printer};

/// The etcdctl version retcdctl answers to (`version`, usage pages).
pub const VERSION: &str = "3.5.1";
pub const API_VERSION: &str = "3.5";

/// Everything a command needs.
pub struct Ctx {
    pub p: Parsed,
    env_done: bool,
}

impl Ctx {
    /// etcdctl's `commandCtx`: now + `--command-timeout`.
    pub fn deadline(&self) -> Option<Instant> {
        Some(Instant::now() + self.p.dur("command-timeout"))
    }

    /// Applies `ETCDCTL_*` to the global flags (once), as
    /// `clientConfigFromCmd` does before it builds a client.
    pub fn apply_env(&mut self) -> Result<(), Exit> {
        if self.env_done {
            return Ok(());
        }
        self.env_done = true;
        let watch = self.p.path.first() == Some(&"watch");
        let mut used = std::collections::HashSet::new();
        let mut already = std::collections::HashSet::new();
        let names: Vec<&'static str> = self.p.inherited.iter().map(|f| f.name).collect();
        for name in &names {
            let key = env_key(name);
            if self.p.is_changed(name) {
                already.insert(key);
                continue;
            }
            if let Ok(v) = std::env::var(&key) {
                if !v.is_empty() {
                    used.insert(key);
                    let _ = self.p.set(name, &v);
                }
            }
        }
        if watch {
            used.insert("ETCDCTL_WATCH_KEY".to_string());
            used.insert("ETCDCTL_WATCH_RANGE_END".to_string());
        }
        let mut vars: Vec<(String, String)> = std::env::vars().collect();
        vars.sort();
        for (k, v) in vars {
            if used.contains(&k) || k == "ETCDCTL_API" {
                continue;
            }
            if already.contains(&k) {
                client::log_fatal(
                    "flags/flag.go:85",
                    "conflicting environment variable is shadowed by corresponding command-line flag (either unset environment variable or disable flag))",
                    &[("environment-variable", &k)],
                );
                return Err(Exit::silent(EXIT_ERROR));
            }
            if k.starts_with("ETCDCTL_") {
                client::log_warn(
                    "flags/flag.go:93",
                    "unrecognized environment variable",
                    &[("environment-variable", &format!("{k}={v}"))],
                );
            }
        }
        if self.p.bool("debug") {
            let mut fs = self.p.inherited.clone();
            fs.sort_by_key(|f| f.name);
            for f in fs {
                let v = self.p.get(f.name).to_string();
                eprintln!("{}={}", env_key(f.name), v);
            }
        }
        Ok(())
    }

    /// The output printer (`-w`, `--hex`); exit 4 on an unknown format.
    pub fn printer(&mut self) -> Result<Printer, Exit> {
        self.apply_env()?;
        let fmt = Format::parse(self.p.get("write-out"))
            .ok_or_else(|| Exit::new(EXIT_BAD_FEATURE, "unsupported output format"))?;
        Ok(Printer {
            fmt,
            hex: self.p.bool("hex"),
            value_only: false,
        })
    }

    /// The connection settings (`clientConfigFromCmd` + `newClientCfg`'s checks).
    pub fn conn_conf(&mut self, with_auth: bool) -> Result<ConnConf, Exit> {
        self.apply_env()?;
        let p = &self.p;
        for f in ["cert", "key", "cacert"] {
            if p.is_changed(f) && p.get(f).is_empty() {
                return Err(Exit::new(
                    EXIT_BAD_ARGS,
                    format!("empty string is passed to --{f} option"),
                ));
            }
        }
        let user = if with_auth && !p.get("user").is_empty() {
            let u = p.get("user");
            let pw = p.get("password");
            Some(if pw.is_empty() {
                match u.split_once(':') {
                    Some((a, b)) => (a.to_string(), b.to_string()),
                    None => (u.to_string(), read_password("Password: ")?),
                }
            } else {
                (u.to_string(), pw.to_string())
            })
        } else {
            None
        };
        let server_name = if p.bool("insecure-discovery") {
            String::new()
        } else {
            p.get("discovery-srv").to_string()
        };
        Ok(ConnConf {
            endpoints: p
                .strings("endpoints")
                .into_iter()
                .map(|s| s.trim().to_string())
                .collect(),
            dial_timeout: p.dur("dial-timeout"),
            keepalive_time: p.dur("keepalive-time"),
            keepalive_timeout: p.dur("keepalive-timeout"),
            insecure_transport: p.bool("insecure-transport"),
            insecure_skip_verify: p.bool("insecure-skip-tls-verify"),
            cert: p.get("cert").to_string(),
            key: p.get("key").to_string(),
            cacert: p.get("cacert").to_string(),
            server_name,
            user,
        })
    }

    /// `mustClientFromCmd`: the printer is checked, then a client made.
    pub async fn client(&mut self) -> Result<(client::Conn, Printer), Exit> {
        let conf = self.conn_conf(true)?;
        let pr = self.printer()?;
        let c = client::connect(&conf, self.deadline()).await?;
        Ok((c, pr))
    }

    /// Like [`Ctx::client`] with no deadline on connecting (commands that
    /// run on `context.Background()`).
    pub async fn client_no_deadline(&mut self) -> Result<(client::Conn, Printer), Exit> {
        let conf = self.conn_conf(true)?;
        let pr = self.printer()?;
        let c = client::connect(&conf, None).await?;
        Ok((c, pr))
    }
}

fn env_key(name: &str) -> String {
    format!("ETCDCTL_{}", name.replace('-', "_").to_uppercase())
}

fn read_password(prompt: &str) -> Result<String, Exit> {
    eprint!("{prompt}");
    let mut s = String::new();
    std::io::stdin()
        .read_line(&mut s)
        .map_err(|e| Exit::new(EXIT_ERROR, e.to_string()))?;
    eprintln!();
    Ok(s.trim_end_matches(['\n', '\r']).to_string())
}

fn main() {
    let code = real_main();
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    std::process::exit(code);
}

fn real_main() -> i32 {
    let api = std::env::var("ETCDCTL_API").unwrap_or_default();
    // SAFETY-free: we run single-threaded here, before the runtime starts.
    if !api.is_empty() && api != "3" {
        if api == "2" {
            eprintln!("retcdctl: the v2 API (ETCDCTL_API=2) is not supported");
        } else {
            eprintln!("unsupported API version: {api}");
        }
        return 1;
    }
    // any bytes, as etcdctl takes them (carried in the text, see `raw`)
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| raw::text(std::os::unix::ffi::OsStrExt::as_bytes(a.as_os_str())))
        .collect();
    let root = tree::root();
    let usage = |path: &[&str]| cobra::usage(&root, path, VERSION, API_VERSION);
    let p = match cobra::execute(&root, &args) {
        // cobra's `help [command]`
        Outcome::Run(p) if p.path == ["help"] => {
            let (path, _, err) = cobra::find(&root, &p.args);
            if err.is_some() {
                eprintln!("Unknown help topic {}", cobra::go_backquote_list(&p.args));
                printer::out(&cobra::usage_with(&root, &[], VERSION, API_VERSION, false));
            } else {
                printer::out(&usage(&path));
            }
            return 0;
        }
        Outcome::Run(p) => p,
        Outcome::Help(path) => {
            printer::out(&usage(&path));
            return 0;
        }
        Outcome::FindError { msg, .. } => {
            eprintln!("Error: {msg}");
            eprintln!("Run 'etcdctl --help' for usage.");
            eprintln!("Error: {msg}");
            return EXIT_ERROR;
        }
        Outcome::FlagError { path, msg } => {
            eprintln!("Error: {msg}");
            printer::out(&usage(&path));
            eprintln!();
            eprintln!("Error: {msg}");
            return EXIT_ERROR;
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("Error: {e}");
            return EXIT_ERROR;
        }
    };
    let mut ctx = Ctx { p, env_done: false };
    let r = rt.block_on(cmd::run(&mut ctx));
    let code = match r {
        Ok(()) => 0,
        Err(e) => {
            if !e.msg.is_empty() {
                raw::eprint(&format!("Error: {}\n", e.msg));
            }
            e.code
        }
    };
    rt.shutdown_timeout(Duration::from_millis(100));
    code
}
