//! Interleaved, ratio-based comparisons (shared/BENCHMARKS.md): every system
//! runs once per round, in the same order (A B C A B C ...), and the report
//! gives each system's median and the median of its per-round ratio to
//! Ringmail, so a slow or noisy VM moves both sides of every ratio together.

use serde::Serialize;

/// Resident memory of this process, in KiB (`VmRSS`).
///
/// # Panics
///
/// When `/proc/self/status` cannot be read or has no `VmRSS` line: a
/// measurement that cannot be made must not read as 0 KiB (every memory
/// figure and growth check would then pass).
pub fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_else(|e| panic!("rss_kib: cannot read /proc/self/status: {e}"));
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or_else(|| panic!("rss_kib: no VmRSS figure in /proc/self/status"))
}

/// CPU time so far of every thread of process `pid`, in ns (the first
/// field of each `/proc/<pid>/task/*/schedstat`: time on a CPU). Threads
/// that ended are not counted, so measure around work done by threads that
/// live through it.
pub fn process_cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Open fds of this process (entries of `/proc/self/fd`).
///
/// # Panics
///
/// When `/proc/self/fd` cannot be read: a count that cannot be made must
/// not read as 0 (every fd-baseline check would then pass).
pub fn open_fds() -> usize {
    // The transport keeps one fd for the whole process (`/dev/null`, opened
    // with the first ring): opened before counting, so baselines include it.
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| drop(ringmail::transport::Ring::<u8>::new().expect("a ring")));
    std::fs::read_dir("/proc/self/fd")
        .unwrap_or_else(|e| panic!("open_fds: cannot read /proc/self/fd: {e}"))
        .count()
}

/// Whether a bigger figure is better (throughput) or worse (latency).
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub enum Better {
    /// Throughput-like.
    Higher,
    /// Latency-like.
    Lower,
}

/// One system under comparison. The first one of a comparison is Ringmail,
/// the reference of every ratio.
pub struct System<'a> {
    /// Short name printed in the tables.
    pub name: &'static str,
    /// Runs one round and returns its figure.
    pub run: Box<dyn FnMut() -> f64 + 'a>,
}

/// A row of a comparison's result.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The system.
    pub system: &'static str,
    /// The figure of each round, in round order.
    pub rounds: Vec<f64>,
    /// Median over rounds.
    pub median: f64,
    /// Median over rounds of (this system / Ringmail) in the same round.
    pub ratio_to_ringmail: f64,
}

/// The result of one comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// What was compared, e.g. "throughput 1->1".
    pub name: String,
    /// Unit of the figures.
    pub unit: &'static str,
    /// Direction of "better".
    pub better: Better,
    /// One row per system, Ringmail first.
    pub rows: Vec<Row>,
    /// The figure's name in the JSON records (e.g. `receiver_p50_ns`).
    #[serde(skip)]
    pub metric: String,
    /// What the figure depends on (e.g. `{"rate": 33000}`).
    #[serde(skip)]
    pub params: serde_json::Value,
}

/// Median of `v` (the mean of the two middle values for an even count).
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Runs `systems` interleaved for `rounds` rounds, after one warm-up run of
/// each system that is not counted.
pub fn compare(
    name: impl Into<String>,
    unit: &'static str,
    better: Better,
    rounds: usize,
    mut systems: Vec<System<'_>>,
) -> Comparison {
    let name = name.into();
    // A profiling aid: `RINGMAIL_BENCH_ONLY=ringmail,actix` runs only the
    // named systems (ratios are then to the first one kept).
    if let Ok(only) = std::env::var("RINGMAIL_BENCH_ONLY") {
        systems.retain(|s| only.split(',').any(|n| n == s.name));
    }
    for s in systems.iter_mut() {
        let f = (s.run)();
        eprintln!("  [{name}] warm-up    {:<18} {f:>14.1} {unit}", s.name);
    }
    let mut figures = vec![Vec::with_capacity(rounds); systems.len()];
    for round in 0..rounds {
        for (i, s) in systems.iter_mut().enumerate() {
            let f = (s.run)();
            eprintln!("  [{name}] round {}/{rounds} {:<18} {f:>14.1} {unit}", round + 1, s.name);
            figures[i].push(f);
        }
    }
    let names: Vec<&'static str> = systems.iter().map(|s| s.name).collect();
    from_figures(name, unit, better, &names, figures)
}

/// Builds a comparison from per-system, per-round figures (Ringmail first).
pub fn from_figures(
    name: impl Into<String>,
    unit: &'static str,
    better: Better,
    names: &[&'static str],
    figures: Vec<Vec<f64>>,
) -> Comparison {
    let rows = names
        .iter()
        .zip(&figures)
        .map(|(n, f)| {
            let ratios: Vec<f64> = f.iter().zip(&figures[0]).map(|(x, r)| x / r).collect();
            Row {
                system: n,
                rounds: f.clone(),
                median: median(f),
                ratio_to_ringmail: median(&ratios),
            }
        })
        .collect();
    let name: String = name.into();
    let metric = name.to_lowercase().replace(|c: char| !c.is_ascii_alphanumeric(), "_");
    Comparison { name, unit, better, rows, metric, params: serde_json::json!({}) }
}

/// One figure in the JSON output: `{"case", "system", "metric", "value",
/// "unit", "params"}`, so ratios can be computed by any script.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// The bench case (`msg-lat`, `throughput`, ...).
    pub case: String,
    /// The system measured.
    pub system: String,
    /// Which figure.
    pub metric: String,
    /// The figure (the median over rounds, unless the metric says otherwise).
    pub value: f64,
    /// Its unit.
    pub unit: String,
    /// What it depends on.
    pub params: serde_json::Value,
}

static EXTRA: std::sync::Mutex<Vec<Record>> = std::sync::Mutex::new(Vec::new());

/// Adds a figure that is not a comparison's median (e.g. a percentile).
pub fn record(r: Record) {
    EXTRA.lock().unwrap_or_else(|p| p.into_inner()).push(r);
}

/// Takes the figures added with [`record`].
pub fn take_records() -> Vec<Record> {
    std::mem::take(&mut *EXTRA.lock().unwrap_or_else(|p| p.into_inner()))
}

impl Comparison {
    /// Names the figure for the JSON records.
    pub fn tagged(mut self, metric: &str, params: serde_json::Value) -> Self {
        self.metric = metric.to_string();
        self.params = params;
        self
    }

    /// One record per system (its median), for the JSON output.
    pub fn records(&self, case: &str) -> Vec<Record> {
        self.rows
            .iter()
            .map(|r| Record {
                case: case.to_string(),
                system: r.system.to_string(),
                metric: self.metric.clone(),
                value: r.median,
                unit: self.unit.to_string(),
                params: self.params.clone(),
            })
            .collect()
    }

    /// The table printed on stdout.
    pub fn print(&self) {
        let hint = match self.better {
            Better::Higher => "higher is better",
            Better::Lower => "lower is better",
        };
        println!(
            "\n{} ({}, {hint}; ratio = system / ringmail, median of per-round ratios)",
            self.name, self.unit
        );
        let w = self.rows.iter().map(|r| r.system.len()).max().unwrap_or(0).max(18);
        println!("  {:<w$} {:>16} {:>10}", "system", "median", "ratio");
        for r in &self.rows {
            println!("  {:<w$} {:>16.1} {:>10.3}", r.system, r.median, r.ratio_to_ringmail);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn ratios_are_per_round_medians() {
        // The first figure of each is the uncounted warm-up.
        let mut a = [99.0, 10.0, 20.0, 30.0].into_iter();
        let mut b = [1.0, 20.0, 20.0, 90.0].into_iter();
        let c = compare(
            "t",
            "x",
            Better::Higher,
            3,
            vec![
                System { name: "ringmail", run: Box::new(move || a.next().unwrap()) },
                System { name: "peer", run: Box::new(move || b.next().unwrap()) },
            ],
        );
        assert_eq!(c.rows[0].ratio_to_ringmail, 1.0);
        // per-round ratios 2, 1, 3 -> median 2
        assert_eq!(c.rows[1].ratio_to_ringmail, 2.0);
        assert_eq!(c.rows[1].median, 20.0);
    }

    #[test]
    fn the_process_measurements_measure() {
        // Tests run in parallel threads of this process, so fds may come
        // and go meanwhile: only lower bounds are checked.
        assert!(open_fds() >= 3, "at least stdin, stdout, stderr");
        let files: Vec<_> =
            (0..64).map(|_| std::fs::File::open("/proc/self/status").unwrap()).collect();
        assert!(open_fds() >= 64, "64 files open");
        drop(files);
        assert!(rss_kib() > 0, "a running process has resident memory");
    }
}
