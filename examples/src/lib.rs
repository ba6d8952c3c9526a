//! Shared helpers of the Ringmail examples.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod account;
pub mod cluster;
pub mod echo;
pub mod kv;
pub mod relay;
pub mod server;

/// A loopback TCP port nothing is bound to now, for a child process to
/// listen on (the multi-process tests, benches and the cluster demo).
///
/// Chosen below the kernel's ephemeral range (`ip_local_port_range`), so
/// that between this call and the child's `bind` no port-0 bind and no
/// outgoing connection's source port can take it. A port from the range
/// itself (what binding port 0 hands out) can be taken meanwhile; worse, a
/// node that dials it before the child listens can be given that very
/// port as its source port and connect to itself, and the child then
/// fails to start with "address in use".
pub fn unused_port() -> u16 {
    use std::net::TcpListener;
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (from, to) = ((low / 2).max(1024), low);
    // A different start per process and call, so that test binaries running
    // side by side do not probe the same ports in the same order.
    let mut x = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ (u64::from(std::process::id()) << 32)
        | 1;
    if to > from {
        for _ in 0..4096 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let port = from + (x % u64::from(to - from)) as u16;
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    // No free port below the range (or no range below 1024): take one from it.
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// The percentiles Ringmail reports latency at (the seeds' format).
pub const PERCENTILES: [f64; 17] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95,
    99.99,
];

/// Formats latency samples (nanoseconds) as percentile lines, one per
/// percentile, like the kernel mailing-list measurements Ringmail's design
/// comes from. Sorts `samples` in place.
pub fn percentile_report(title: &str, samples: &mut [u64]) -> String {
    use std::fmt::Write;
    samples.sort_unstable();
    let mut s = format!("{title} percentiles (nsec), {} samples:\n", samples.len());
    if samples.is_empty() {
        return s;
    }
    for p in PERCENTILES {
        let idx = ((p / 100.0) * (samples.len() - 1) as f64).round() as usize;
        let _ = writeln!(s, "  p{p:<6} {:>10}", samples[idx]);
    }
    s
}

/// Parses `--name value` from `args`, or returns `default`.
pub fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().unwrap_or_else(|_| panic!("bad value for {name}: {v}")))
        .unwrap_or(default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_picks_nearest_rank() {
        let mut v: Vec<u64> = (1..=100).rev().collect();
        let r = percentile_report("x", &mut v);
        assert!(r.contains("100 samples"));
        let value = |name: &str| -> u64 {
            let line = r.lines().find(|l| l.trim_start().starts_with(&format!("{name} "))).unwrap();
            line.split_whitespace().last().unwrap().parse().unwrap()
        };
        // Nearest rank over 1..=100: p50 -> index round(49.5) = 50 -> 51.
        assert_eq!(value("p50"), 51);
        assert_eq!(value("p1"), 2);
        assert_eq!(value("p99.99"), 100);
        assert_eq!(r.lines().count(), 18);
    }

    #[test]
    fn arg_parses_or_defaults() {
        let a: Vec<String> = ["--n", "5"].iter().map(|s| s.to_string()).collect();
        assert_eq!(arg(&a, "--n", 1u32), 5);
        assert_eq!(arg(&a, "--m", 1u32), 1);
    }
}
