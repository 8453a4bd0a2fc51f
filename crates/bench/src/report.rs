//! Latency recording and the report etcd's `benchmark` prints:
//! `Summary` (total, slowest, fastest, average, stddev, requests/sec), a
//! `Response time histogram` and a `Latency distribution` (p10 … p99.9).
//!
//! Latencies are recorded in nanoseconds in an [`hdrhistogram::Histogram`]
//! with 3 significant digits (≤ 0.1 % error), one per client task, merged
//! at the end, so recording never contends on a lock.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// The percentiles etcd's benchmark prints.
pub const PERCENTILES: [f64; 8] = [10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9];

/// A latency recorder (nanoseconds, 1 ns … 1 h, 3 significant digits).
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid histogram bounds")
}

/// What one run of a workload measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// e.g. "put", "range", "watch events".
    pub name: String,
    /// Wall-clock seconds from the first request to the last response.
    pub total_secs: f64,
    /// Successful requests (each with a latency).
    pub requests: u64,
    pub errors: u64,
    /// The first error seen, as text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    /// Successful requests per second of wall-clock time.
    pub ops_per_sec: f64,
    pub slowest_ms: f64,
    pub fastest_ms: f64,
    pub average_ms: f64,
    pub stddev_ms: f64,
    /// `[percentile, latency ms]` for [`PERCENTILES`].
    pub percentiles_ms: Vec<(f64, f64)>,
    /// `[bucket upper bound ms, count]`, 10 linear buckets, fastest → slowest.
    pub histogram_ms: Vec<(f64, u64)>,
    /// CPU seconds this benchmark process used during the run (user + system).
    pub client_cpu_secs: f64,
    /// Workload-specific numbers (events delivered, conflicts, …).
    #[serde(skip_serializing_if = "serde_json::Map::is_empty")]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Report {
    pub fn from_histogram(
        name: &str,
        h: &Histogram<u64>,
        elapsed: Duration,
        errors: u64,
        first_error: Option<String>,
        client_cpu_secs: f64,
    ) -> Report {
        let ms = |ns: f64| ns / 1e6;
        let secs = elapsed.as_secs_f64().max(1e-9);
        let n = h.len();
        let (slowest, fastest) = if n == 0 { (0, 0) } else { (h.max(), h.min()) };
        let percentiles_ms = PERCENTILES
            .iter()
            .map(|p| {
                (
                    *p,
                    if n == 0 {
                        0.0
                    } else {
                        ms(h.value_at_percentile(*p) as f64)
                    },
                )
            })
            .collect();
        Report {
            name: name.to_string(),
            total_secs: secs,
            requests: n,
            errors,
            first_error,
            ops_per_sec: n as f64 / secs,
            slowest_ms: ms(slowest as f64),
            fastest_ms: ms(fastest as f64),
            average_ms: if n == 0 { 0.0 } else { ms(h.mean()) },
            stddev_ms: if n == 0 { 0.0 } else { ms(h.stdev()) },
            percentiles_ms,
            histogram_ms: buckets(h, fastest, slowest),
            client_cpu_secs,
            extra: serde_json::Map::new(),
        }
    }

    /// The latency at percentile `p` (one of [`PERCENTILES`]), ms.
    pub fn pct(&self, p: f64) -> f64 {
        self.percentiles_ms
            .iter()
            .find(|(q, _)| (*q - p).abs() < 1e-9)
            .map(|(_, v)| *v)
            .unwrap_or(0.0)
    }

    /// etcd `benchmark`'s text report (seconds, 4 decimals).
    pub fn print_text(&self) {
        let s = |ms: f64| ms / 1000.0;
        println!();
        println!("Summary ({}):", self.name);
        println!("  Total:\t{:.4} secs.", self.total_secs);
        println!("  Slowest:\t{:.4} secs.", s(self.slowest_ms));
        println!("  Fastest:\t{:.4} secs.", s(self.fastest_ms));
        println!("  Average:\t{:.4} secs.", s(self.average_ms));
        println!("  Stddev:\t{:.4} secs.", s(self.stddev_ms));
        println!("  Requests/sec:\t{:.4}", self.ops_per_sec);
        for (k, v) in &self.extra {
            println!("  {k}:\t{v}");
        }
        if self.requests > 0 {
            println!();
            println!("Response time histogram:");
            let max = self
                .histogram_ms
                .iter()
                .map(|b| b.1)
                .max()
                .unwrap_or(1)
                .max(1);
            for (ub, c) in &self.histogram_ms {
                let bar = (*c as f64 * 40.0 / max as f64).round() as usize;
                println!("  {:.4} [{}]\t|{}", s(*ub), c, "∎".repeat(bar));
            }
            println!();
            println!("Latency distribution:");
            for (p, v) in &self.percentiles_ms {
                println!("  {p}% in {:.4} secs.", s(*v));
            }
        }
        if self.errors > 0 {
            println!();
            println!(
                "Error distribution:\n  [{}]\t{}",
                self.errors,
                self.first_error.as_deref().unwrap_or("")
            );
        }
        println!(
            "\n  (client CPU: {:.2} s, {:.1} µs per request)",
            self.client_cpu_secs,
            if self.requests > 0 {
                self.client_cpu_secs * 1e6 / self.requests as f64
            } else {
                0.0
            }
        );
    }
}

fn buckets(h: &Histogram<u64>, fastest: u64, slowest: u64) -> Vec<(f64, u64)> {
    if h.is_empty() {
        return Vec::new();
    }
    const N: usize = 10;
    let width = ((slowest - fastest) as f64 / N as f64).max(1.0);
    let mut counts = [0u64; N + 1];
    for v in h.iter_recorded() {
        let x = v.value_iterated_to();
        let i = (((x.saturating_sub(fastest)) as f64 / width) as usize).min(N);
        counts[i] += v.count_at_value();
    }
    // etcd prints N+1 marks from fastest to slowest.
    (0..=N)
        .map(|i| ((fastest as f64 + width * i as f64) / 1e6, counts[i]))
        .collect()
}

/// CPU seconds (user + system) this process has used so far.
pub fn process_cpu_secs() -> f64 {
    // getrusage would need `unsafe` (forbidden in this workspace): read /proc.
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    cpu_secs_from_stat(&stat)
}

/// `utime + stime` of a `/proc/<pid>/stat` line, in seconds.
pub fn cpu_secs_from_stat(stat: &str) -> f64 {
    let c = cpu_from_stat(stat);
    c.user + c.system
}

/// CPU time of a process, user and kernel (system) apart, in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuSplit {
    pub user: f64,
    pub system: f64,
}

impl std::ops::Add for CpuSplit {
    type Output = CpuSplit;
    fn add(self, o: CpuSplit) -> CpuSplit {
        CpuSplit {
            user: self.user + o.user,
            system: self.system + o.system,
        }
    }
}

impl std::ops::Sub for CpuSplit {
    type Output = CpuSplit;
    fn sub(self, o: CpuSplit) -> CpuSplit {
        CpuSplit {
            user: self.user - o.user,
            system: self.system - o.system,
        }
    }
}

impl std::iter::Sum for CpuSplit {
    fn sum<I: Iterator<Item = CpuSplit>>(iter: I) -> CpuSplit {
        iter.fold(CpuSplit::default(), |a, b| a + b)
    }
}

/// `utime` and `stime` of a `/proc/<pid>/stat` line, in seconds (zero
/// when the line cannot be read).
pub fn cpu_from_stat(stat: &str) -> CpuSplit {
    // Fields after the `(comm)`: state is field 3; utime 14, stime 15.
    let Some(rest) = stat.rsplit_once(')').map(|x| x.1) else {
        return CpuSplit::default();
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
    // rest[0] is state (field 3) → utime (14) is rest[11], stime (15) rest[12].
    CpuSplit {
        user: ticks(11) / clk_tck(),
        system: ticks(12) / clk_tck(),
    }
}

fn clk_tck() -> f64 {
    // sysconf(_SC_CLK_TCK) needs `unsafe`; USER_HZ is 100 on every Linux ABI we run on.
    100.0
}

/// `VmRSS` (and `VmHWM`) of a process from `/proc/<pid>/status`, in bytes.
pub fn rss_bytes(pid: u32) -> Option<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:").unwrap_or(0)))
}

/// CPU seconds used so far by process `pid`.
pub fn pid_cpu_secs(pid: u32) -> f64 {
    let c = pid_cpu_split(pid);
    c.user + c.system
}

/// CPU time of process `pid` so far, user and kernel apart.
pub fn pid_cpu_split(pid: u32) -> CpuSplit {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| cpu_from_stat(&s))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_cpu_from_stat_reads_user_and_kernel_ticks() {
        // a command name with a space and a parenthesis, as /proc shows it
        let line =
            "4242 (retcd (x) w) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 75 0 0 20 0 9 0 100 0 0";
        let c = cpu_from_stat(line);
        assert_eq!(
            c,
            CpuSplit {
                user: 2.5,
                system: 0.75
            }
        );
        assert_eq!(cpu_secs_from_stat(line), 3.25);
        let both = [c, c].into_iter().sum::<CpuSplit>() - c;
        assert_eq!(both, c);
        assert_eq!(cpu_from_stat("garbage"), CpuSplit::default());
    }
}
