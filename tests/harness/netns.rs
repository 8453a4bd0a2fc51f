//! Namespaced hosts: each member in its own network namespace, with its own
//! address on a bridge the test makes, so faults are made the way a network
//! makes them — packets dropped by nftables inside the receiving host — and
//! not by a proxy in front of one port.
//!
//! Layout of a [`NetLab`] with id `X` (unique per process and lab):
//!
//! * bridge `rbX` in the test's own namespace, address `10.A.B.254/24`: the
//!   test's clients reach every member through it;
//! * host `i`: namespace `rtX-i`, veth `vrX-i` (bridge side) / `vnX-i`
//!   (host side) with address `10.A.B.(i+1)/24`, and an nftables table
//!   `inet rtfault` whose `input` chain holds the faults: one rule per cut
//!   or lossy link, each with a counter, so a test can prove its fault
//!   dropped packets ([`NetLab::dropped`]).
//!
//! A fault is expressed per receiving host: [`NetLab::cut`] drops what
//! `from` sends to `to` (one way), [`NetLab::cut_both`] both ways,
//! [`NetLab::set_loss`] drops a share at random. [`NetLab::heal`] lifts all.
//! Only member-to-member traffic is cut: the test's address (`.254`) is
//! never dropped, so clients keep reaching every side (as a client on the
//! same rack would).
//!
//! Delay, duplication and reordering need `tc netem`, which this kernel
//! lacks (`tc qdisc add … netem` answers "Specified qdisc kind is
//! unknown"); the peer proxy ([`retcd_robustness::proxy`]) keeps those.
//!
//! Needs root (`ip`, `nft`); everything is removed when the lab is dropped,
//! also when the test fails. Labs left by a killed test run (their process
//! id no longer alive) are removed when the next lab is made.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{bail, Context, Result};

/// Labs made by this process so far (part of the id).
static LABS: AtomicU32 = AtomicU32::new(0);

/// One namespaced host.
#[derive(Debug)]
pub struct Host {
    pub ns: String,
    pub ip: Ipv4Addr,
}

/// The faults on one receiving host (what its `input` chain drops).
#[derive(Clone, Debug, Default, PartialEq)]
struct Faults {
    /// Hosts whose packets are all dropped.
    cut_from: BTreeSet<usize>,
    /// Hosts whose packets are dropped with this probability (percent).
    loss_from: BTreeMap<usize, u8>,
}

/// A bridge and N namespaced hosts on it; see the module documentation.
pub struct NetLab {
    id: String,
    bridge: String,
    pub hosts: Vec<Host>,
    faults: Vec<Faults>,
}

fn run(args: &[&str]) -> Result<String> {
    run_stdin(args, None)
}

fn run_stdin(args: &[&str], stdin: Option<&str>) -> Result<String> {
    use std::io::Write;
    let mut cmd = Command::new(args[0]);
    cmd.args(&args[1..])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot run {} (needs iproute2 and nftables)", args[0]))?;
    if let Some(s) = stdin {
        child.stdin.take().expect("stdin").write_all(s.as_bytes())?;
    } else {
        drop(child.stdin.take());
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Removes namespaces and bridges of labs whose process is gone.
fn remove_stale() {
    let Ok(list) = run(&["ip", "netns", "list"]) else {
        return;
    };
    for line in list.lines() {
        let ns = line.split_whitespace().next().unwrap_or("");
        // `rt<id>-<i>`, `<id>` = `<pid>x<n>`
        let Some((id, _)) = ns.strip_prefix("rt").and_then(|r| r.split_once('-')) else {
            continue;
        };
        if let Some(pid) = lab_pid(id) {
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                let _ = run(&["ip", "netns", "del", ns]);
                let _ = run(&["ip", "link", "del", &format!("rb{id}")]);
            }
        }
    }
}

/// The process id encoded in a lab id (`<pid>x<n>`).
fn lab_pid(id: &str) -> Option<u32> {
    id.split('x').next()?.parse().ok()
}

impl NetLab {
    /// Makes the bridge and `n` hosts (n ≤ 250).
    pub fn new(n: usize) -> Result<NetLab> {
        assert!(n > 0 && n <= 250);
        remove_stale();
        let seq = LABS.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        // Interface names are at most 15 bytes: "vr" + id + "-" + i.
        let id = format!("{pid}x{seq}");
        // A /24 per lab, from the pid and the sequence number, not one a
        // route of this machine (or another lab) already uses.
        let routes = run(&["ip", "-4", "route"]).unwrap_or_default();
        let a = 100 + (pid % 100) as u8;
        let b = (0u8..=255)
            .map(|k| {
                ((pid / 100) as u8)
                    .wrapping_add((seq as u8).wrapping_mul(37))
                    .wrapping_add(k)
            })
            .find(|b| !routes.contains(&format!("10.{a}.{b}.")))
            .context("no free 10.x.y.0/24 for the lab")?;
        let bridge = format!("rb{id}");
        let mut lab = NetLab {
            id: id.clone(),
            bridge: bridge.clone(),
            hosts: Vec::new(),
            faults: vec![Faults::default(); n],
        };
        run(&["ip", "link", "add", &bridge, "type", "bridge"])?;
        run(&[
            "ip",
            "addr",
            "add",
            &format!("10.{a}.{b}.254/24"),
            "dev",
            &bridge,
        ])?;
        run(&["ip", "link", "set", &bridge, "up"])?;
        for i in 0..n {
            let ns = format!("rt{id}-{i}");
            let (vr, vn) = (format!("vr{id}-{i}"), format!("vn{id}-{i}"));
            let ip = Ipv4Addr::new(10, a, b, i as u8 + 1);
            run(&["ip", "netns", "add", &ns])?;
            lab.hosts.push(Host { ns: ns.clone(), ip });
            run(&[
                "ip", "link", "add", &vr, "type", "veth", "peer", "name", &vn,
            ])?;
            run(&["ip", "link", "set", &vn, "netns", &ns])?;
            run(&["ip", "link", "set", &vr, "master", &bridge, "up"])?;
            run(&[
                "ip",
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{ip}/24"),
                "dev",
                &vn,
            ])?;
            run(&["ip", "-n", &ns, "link", "set", &vn, "up"])?;
            run(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
            run_stdin(
                &["ip", "netns", "exec", &ns, "nft", "-f", "-"],
                Some(
                    "table inet rtfault {\n  chain input { type filter hook input priority 0; policy accept; }\n}\n",
                ),
            )?;
        }
        Ok(lab)
    }

    /// The lab's id (part of every name it made).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The command line that runs `bin args…` inside host `i`'s namespace
    /// (`ip netns exec` execs it: the PID is the program's own).
    pub fn wrap(
        &self,
        i: usize,
        bin: &std::path::Path,
        args: Vec<String>,
    ) -> (std::path::PathBuf, Vec<String>) {
        let mut a = vec![
            "netns".to_string(),
            "exec".to_string(),
            self.hosts[i].ns.clone(),
            bin.display().to_string(),
        ];
        a.extend(args);
        ("ip".into(), a)
    }

    /// Drops everything `from` sends to `to`.
    pub fn cut(&mut self, from: usize, to: usize) -> Result<()> {
        self.faults[to].cut_from.insert(from);
        self.apply(to)
    }

    /// Cuts `a` and `b` from each other, both ways.
    pub fn cut_both(&mut self, a: usize, b: usize) -> Result<()> {
        self.cut(a, b)?;
        self.cut(b, a)
    }

    /// Splits the hosts into `side` and the rest (both ways).
    pub fn partition(&mut self, side: &[usize]) -> Result<()> {
        let n = self.hosts.len();
        for &a in side {
            for b in (0..n).filter(|b| !side.contains(b)) {
                self.cut_both(a, b)?;
            }
        }
        Ok(())
    }

    /// Drops `percent` % of what `from` sends to `to`, at random.
    pub fn set_loss(&mut self, from: usize, to: usize, percent: u8) -> Result<()> {
        self.faults[to].loss_from.insert(from, percent.min(100));
        self.apply(to)
    }

    /// Lifts every fault.
    pub fn heal(&mut self) -> Result<()> {
        for i in 0..self.hosts.len() {
            if self.faults[i] != Faults::default() {
                self.faults[i] = Faults::default();
                self.apply(i)?;
            }
        }
        Ok(())
    }

    /// Whether any fault is set.
    pub fn faulty(&self) -> bool {
        self.faults.iter().any(|f| *f != Faults::default())
    }

    /// Rewrites host `i`'s input chain from its faults, atomically (one
    /// `nft -f` transaction). Counters of the old rules are lost: read
    /// [`NetLab::dropped`] before changing a host's faults.
    fn apply(&self, i: usize) -> Result<()> {
        let f = &self.faults[i];
        let mut script = String::from("flush chain inet rtfault input\n");
        for &from in &f.cut_from {
            script.push_str(&format!(
                "add rule inet rtfault input ip saddr {} counter drop\n",
                self.hosts[from].ip
            ));
        }
        for (&from, &p) in &f.loss_from {
            if !f.cut_from.contains(&from) {
                script.push_str(&format!(
                    "add rule inet rtfault input ip saddr {} numgen random mod 100 < {p} counter drop\n",
                    self.hosts[from].ip
                ));
            }
        }
        run_stdin(
            &["ip", "netns", "exec", &self.hosts[i].ns, "nft", "-f", "-"],
            Some(&script),
        )?;
        Ok(())
    }

    /// Packets host `i`'s fault rules have dropped since they were last
    /// rewritten.
    pub fn dropped(&self, i: usize) -> Result<u64> {
        let out = run(&[
            "ip",
            "netns",
            "exec",
            &self.hosts[i].ns,
            "nft",
            "-j",
            "list",
            "chain",
            "inet",
            "rtfault",
            "input",
        ])?;
        let v: serde_json::Value = serde_json::from_str(&out).context("nft -j output")?;
        let mut n = 0;
        for item in v["nftables"].as_array().into_iter().flatten() {
            for e in item["rule"]["expr"].as_array().into_iter().flatten() {
                n += e["counter"]["packets"].as_u64().unwrap_or(0);
            }
        }
        Ok(n)
    }

    /// Packets dropped on every host (see [`NetLab::dropped`]).
    pub fn dropped_total(&self) -> Result<u64> {
        (0..self.hosts.len()).map(|i| self.dropped(i)).sum()
    }
}

impl Drop for NetLab {
    fn drop(&mut self) {
        // Deleting a namespace deletes its veth end, and with it the peer.
        for h in &self.hosts {
            let _ = run(&["ip", "netns", "del", &h.ns]);
        }
        let _ = run(&["ip", "link", "del", &self.bridge]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lab_pid_parses_ids() {
        assert_eq!(lab_pid("1234x0"), Some(1234));
        assert_eq!(lab_pid("1234x0-2"), Some(1234));
        assert_eq!(lab_pid("fault"), None);
    }
}
