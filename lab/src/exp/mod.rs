//! `baton exp NAME`: runs `experiments/NAME.toml` and writes `experiments/results/NAME/`.
//!
//! ```text
//! spec.rs      the TOML: backends, fleet size, TTL sweep, fencing, load, fault schedule (spans in s/ms/ttl)
//! faults.rs    the schedule (seeded jitter) and the faults: kill -9, SIGSTOP pause, step-down, partition
//! nemesis.rs   `[nemesis]`: a seeded random schedule of every fault kind, each verified in effect
//! run.rs       one run: fresh fleet, load, faults, checker, everything measured; fleet always stopped
//! analysis.rs  transitions + failover (ledger), elections (actor traces), stale-leader evidence
//! ```
//!
//! Per run `LABEL` (backend, plus `-ttlX`, `-fencing-on|off`, `-jobsN` where swept) the results
//! directory gets `LABEL.json` (everything, with the command, commit and machine),
//! `LABEL-timeline.csv` (leaders acting by effect), `LABEL-client.csv` (client outcomes per
//! second), `LABEL-seq.csv` (downsampled), `LABEL-acting.svg` and `LABEL-seq.svg`. Then, from every
//! `LABEL.json` present (so separate invocations accumulate): `summary.md`, `runs.csv`,
//! `failover-vs-ttl.svg`, `election-cdf.svg`, `campaign-cdf.svg`, `vacant-to-won-cdf.svg`, `dark-cdf.svg`.
//!
//! The exit code is non-zero when a run errs or its verdict is not the expected one (fencing on:
//! PASS; fencing off: FAIL, unless the spec says otherwise).

pub use crate::report::git_commit;

pub mod analysis;
pub mod faults;
pub mod nemesis;
use crate::plots;
pub mod run;
pub mod spec;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde_json::Value;

use baton::backends::BackendKind;
use baton::config::parse_duration_ms;
use run::{RunOpts, RunResult};
use spec::{ExpSpec, RunPlan, Span};

/// `baton exp`.
#[derive(clap::Args, Debug, Clone)]
pub struct ExpArgs {
    /// Experiment name (`experiments/NAME.toml`) or a path to a `.toml`.
    pub name: String,
    /// Only these backends (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub backends: Option<Vec<BackendKind>>,
    /// The spec's `[quick]` variant: short durations, for tests.
    #[arg(long)]
    pub quick: bool,
    /// TTL sweep points instead of the spec's, e.g. `1s,3s`.
    #[arg(long, value_delimiter = ',', value_parser = parse_duration_ms)]
    pub ttl: Option<Vec<u64>>,
    /// Load duration instead of the spec's (a span: `60s`, `600s`, `3ttl+10s`).
    #[arg(long)]
    pub duration: Option<String>,
    /// Seed instead of the spec's.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Fencing values instead of the spec's (`on`, `off` or `off,on`): e.g. the nemesis's
    /// schedule, unchanged, with the resource's fence switched off.
    #[arg(long, value_delimiter = ',')]
    pub fencing: Option<Vec<baton::config::Fencing>>,
    /// Nemesis: draw this many faults instead of the spec's (a prefix of the same schedule:
    /// the steps are drawn one after another from the same seed).
    #[arg(long)]
    pub faults: Option<usize>,
    /// Results directory (default `experiments/results/NAME`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Scratch root for the fleets (each run uses and removes `<dir>/<NAME>/<LABEL>`).
    #[arg(long, default_value = "state/exp")]
    pub state_dir: PathBuf,
    /// Keep each run's fleet directory (logs, actor traces) instead of removing it.
    #[arg(long)]
    pub keep: bool,
    /// Run nothing: regenerate `summary.md`, `runs.csv` and the cross-run plots from the
    /// `LABEL.json` files already in the results directory.
    #[arg(long)]
    pub report_only: bool,
    /// Only the runs whose label contains one of these (comma-separated), e.g. `faketime` or
    /// `drift-0.20`; the summary still covers every `LABEL.json` in the results directory.
    #[arg(long, value_delimiter = ',')]
    pub only: Option<Vec<String>>,
}

/// Runs the experiment; returns the process exit code.
pub async fn cli_main(a: ExpArgs) -> anyhow::Result<i32> {
    let (mut spec, spec_path) = ExpSpec::load(&a.name)?;
    if a.quick {
        spec = spec.quick();
    }
    if let Some(d) = &a.duration {
        spec.duration = Span::parse(d).context("--duration")?;
    }
    if let Some(s) = a.seed {
        spec.seed = s;
    }
    if let Some(f) = &a.fencing {
        spec.fencing = f.clone();
    }
    if let (Some(k), Some(n)) = (a.faults, spec.nemesis.as_mut()) {
        n.faults = k;
    }
    let mut plans = spec.plan(a.backends.as_deref(), a.ttl.as_deref())?;
    if let Some(only) = &a.only {
        plans.retain(|p| only.iter().any(|o| p.label.contains(o.as_str())));
        if plans.is_empty() {
            bail!("--only {only:?} matches no run of {}", spec.name);
        }
    }
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("experiments/results").join(&spec.name));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    if a.report_only {
        println!("{}", write_experiment(&out, &spec)?);
        return Ok(0);
    }
    let opts = RunOpts {
        state_root: a.state_dir.join(&spec.name),
        keep: a.keep,
    };
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let commit = git_commit();
    let machine = crate::report::machine_info();
    println!(
        "exp {}: {} run(s) [{}]{} -> {}",
        spec.name,
        plans.len(),
        plans
            .iter()
            .map(|p| p.label.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        if a.quick { " (quick)" } else { "" },
        out.display()
    );
    let mut code = 0;
    for plan in &plans {
        println!("== {} ({}) ...", plan.label, spec.name);
        let meta = serde_json::json!({
            "command": command,
            "spec_file": spec_path.display().to_string(),
            "commit": commit,
            "machine": machine,
        });
        match run::run_one(&spec, plan, a.quick, &opts).await {
            Ok(r) => {
                write_run(&out, &r, &meta)?;
                print!("{}", brief(&r));
                // A nemesis run's fault errors (a fault that found the fleet in flux, e.g. a
                // step-down answered 503 mid-election) are reported and count against its
                // took-effect fraction, which `expectation_met` already judges.
                if !r.expectation_met || (r.error.is_some() && r.nemesis.is_none()) {
                    code = 1;
                }
            }
            Err(e) => {
                code = 1;
                println!("   ERROR: {e:#}");
                let v = serde_json::json!({
                    "experiment": spec.name,
                    "label": plan.label,
                    "backend": plan.backend,
                    "seed": plan.seed,
                    "quick": a.quick,
                    "error": format!("{e:#}"),
                    "meta": meta,
                });
                std::fs::write(
                    out.join(format!("{}.json", plan.label)),
                    serde_json::to_vec_pretty(&v)?,
                )?;
            }
        }
    }
    let summary = write_experiment(&out, &spec)?;
    println!("{summary}");
    println!("results: {}", out.display());
    Ok(code)
}

/// The lines printed after each run.
fn brief(r: &RunResult) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "   {} [expected {:?}: {}]",
        r.verdict.line,
        r.expect,
        if r.expectation_met {
            "ok"
        } else {
            "UNEXPECTED"
        }
    );
    let _ = writeln!(
        s,
        "   load: {} sent, {} ok, {} rejected, {} unknown; {} faults, {} leaderships, {} rejections; false failovers {}",
        r.load.sent,
        r.load.ok,
        r.load.rejected,
        r.load.unknown,
        r.faults.len(),
        r.timeline.len(),
        r.rejections_total,
        r.false_failovers
    );
    if let Some(f) = &r.failover_ms {
        let _ = writeln!(
            s,
            "   failover (kill -9, resource clock): n={} median={:.1} ms p99={:.1} ms max={:.1} ms",
            f.n, f.median, f.p99, f.max
        );
    }
    if let Some(f) = &r.stepdown_dark_ms {
        let _ = writeln!(
            s,
            "   step-down dark time: n={} median={:.1} ms p99={:.1} ms min={:.1} ms",
            f.n, f.median, f.p99, f.min
        );
    }
    for st in r.stale.iter().take(12) {
        let kind = r
            .faults
            .get(st.fault)
            .map(|f| f.record.kind.as_str())
            .unwrap_or("?");
        let _ = writeln!(
            s,
            "   {} ({kind}, token {}): {}{}",
            st.node,
            st.token.map(|t| t.to_string()).unwrap_or_default(),
            st.outcome,
            st.belief_overlap_ms
                .map(|b| format!("; believed-leader overlap with the successor {b:+.0} ms"))
                .unwrap_or_default()
        );
    }
    if let Some(e) = &r.error {
        let _ = writeln!(s, "   fault errors: {e}");
    }
    s
}

/// Downsampled `next` rows: every k-th row, plus the rows around each change of token.
fn downsample(seq: &[(f64, i64, i64)], target: usize) -> Vec<(f64, i64, i64)> {
    if seq.len() <= target {
        return seq.to_vec();
    }
    let k = seq.len().div_ceil(target).max(1);
    let mut keep = vec![false; seq.len()];
    for (i, k2) in keep.iter_mut().enumerate() {
        if i % k == 0 {
            *k2 = true;
        }
    }
    for i in 1..seq.len() {
        if seq[i].2 != seq[i - 1].2 {
            let lo = i.saturating_sub(3);
            for k in keep.iter_mut().take(i + 3).skip(lo) {
                *k = true;
            }
        }
    }
    keep[seq.len() - 1] = true;
    seq.iter()
        .zip(keep)
        .filter(|(_, k)| *k)
        .map(|(p, _)| *p)
        .collect()
}

fn write_run(out: &Path, r: &RunResult, meta: &Value) -> anyhow::Result<()> {
    let mut v = serde_json::to_value(r)?;
    v["meta"] = meta.clone();
    std::fs::write(
        out.join(format!("{}.json", r.label)),
        serde_json::to_vec_pretty(&v)?,
    )?;
    let mut csv = String::from("token,holder,first_s,last_s,writes,rejected,dark_after_ms\n");
    for iv in &r.timeline {
        let _ = writeln!(
            csv,
            "{},{},{:.6},{:.6},{},{},{}",
            iv.token,
            iv.holder,
            iv.first_s,
            iv.last_s,
            iv.writes,
            iv.rejected,
            iv.dark_after_ms
                .map(|d| format!("{d:.3}"))
                .unwrap_or_default()
        );
    }
    std::fs::write(out.join(format!("{}-timeline.csv", r.label)), csv)?;
    let mut csv = String::from("second,ok,rejected,unknown\n");
    for (s, a, b, c) in &r.series.client {
        let _ = writeln!(csv, "{s},{a},{b},{c}");
    }
    std::fs::write(out.join(format!("{}-client.csv", r.label)), csv)?;
    let seq = downsample(&r.series.seq, 600);
    let mut csv = String::from("t_s,seq,token\n");
    for (t, s, tok) in &seq {
        let _ = writeln!(csv, "{t:.6},{s},{tok}");
    }
    std::fs::write(out.join(format!("{}-seq.csv", r.label)), csv)?;

    draw_run(out, &v)
}

fn read_csv(path: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .skip(1)
        .map(|l| l.split(',').map(str::to_owned).collect())
        .collect()
}

/// Draws a run's `LABEL-acting.svg` and `LABEL-seq.svg` from its JSON and its CSVs (so
/// `--report-only` redraws them exactly as a run does).
fn draw_run(out: &Path, v: &Value) -> anyhow::Result<()> {
    let Some(label) = v["label"].as_str() else {
        return Ok(());
    };
    if v["verdict"].is_null() {
        return Ok(());
    }
    let experiment = v["experiment"].as_str().unwrap_or("?");
    let spans: Vec<plots::FaultSpan> = v["faults"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|fi| {
            let from = f(&fi["applied_s"]).unwrap_or(0.0);
            plots::FaultSpan {
                from,
                to: f(&fi["healed_s"]).unwrap_or(from),
                label: format!(
                    "{} {}",
                    fi["kind"].as_str().unwrap_or("?"),
                    fi["node"].as_str().unwrap_or("?")
                ),
            }
        })
        .collect();
    let seq: Vec<(f64, i64, i64)> = read_csv(&out.join(format!("{label}-seq.csv")))
        .iter()
        .filter_map(|r| {
            Some((
                r.first()?.parse().ok()?,
                r.get(1)?.parse().ok()?,
                r.get(2)?.parse().ok()?,
            ))
        })
        .collect();
    // Leaders acting by effect from the timeline's intervals: +1 at a first write, -1 after a last.
    let mut ev: Vec<(f64, i32)> = Vec::new();
    for r in read_csv(&out.join(format!("{label}-timeline.csv"))) {
        if let (Some(a), Some(b)) = (
            r.get(2).and_then(|x| x.parse::<f64>().ok()),
            r.get(3).and_then(|x| x.parse::<f64>().ok()),
        ) {
            ev.push((a, 1));
            ev.push((b, -1));
        }
    }
    ev.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
    let mut steps = Vec::new();
    let mut n = 0;
    let mut initial = 0;
    for (t, d) in ev {
        n += d;
        if t < 0.0 {
            initial = n;
        } else {
            steps.push((t, n));
        }
    }
    let x_max = seq
        .iter()
        .map(|p| p.0)
        .chain(steps.iter().map(|p| p.0))
        .fold(f(&v["duration_s"]).unwrap_or(1.0), f64::max)
        + 0.5;
    let pass = v["verdict"]["pass"].as_bool().unwrap_or(false);
    plots::acting(
        &out.join(format!("{label}-acting.svg")),
        &format!(
            "{experiment} / {label}: leaders acting by effect (fence_log) — {}",
            if pass { "PASS" } else { "FAIL" }
        ),
        initial,
        &steps,
        &spans,
        x_max,
    )?;
    if !v["nemesis"].is_null() {
        draw_nemesis_timeline(out, v, label, initial, &steps, &seq, x_max)?;
    }
    let seq: Vec<(f64, i64, i64)> = seq.into_iter().filter(|p| p.0 >= 0.0).collect();
    plots::seq(
        &out.join(format!("{label}-seq.svg")),
        &format!("{experiment} / {label}: seq vs time, colored by token"),
        &seq,
        &spans,
        x_max,
    )?;
    Ok(())
}

/// `LABEL-nemesis.svg`: the faults in one lane per kind over the leaders acting and the
/// accepted tokens.
fn draw_nemesis_timeline(
    out: &Path,
    v: &Value,
    label: &str,
    initial: i32,
    steps: &[(f64, i32)],
    seq: &[(f64, i64, i64)],
    x_max: f64,
) -> anyhow::Result<()> {
    let faults = v["faults"].as_array().cloned().unwrap_or_default();
    let lanes: Vec<String> = spec::FaultKind::ALL
        .iter()
        .map(|k| k.as_str().to_owned())
        .filter(|k| faults.iter().any(|fi| fi["kind"] == k.as_str()))
        .collect();
    let bands: Vec<plots::LaneFault> = faults
        .iter()
        .filter_map(|fi| {
            let kind = fi["kind"].as_str()?;
            let from = f(&fi["applied_s"])?;
            Some(plots::LaneFault {
                lane: lanes.iter().position(|l| l == kind)?,
                span: plots::FaultSpan {
                    from,
                    to: f(&fi["healed_s"]).unwrap_or(from),
                    label: kind.to_owned(),
                },
                took_effect: fi["verified"].as_bool().unwrap_or(false),
            })
        })
        .collect();
    let tokens: Vec<(f64, i64)> = seq
        .iter()
        .filter(|p| p.0 >= 0.0)
        .map(|p| (p.0, p.2))
        .collect();
    let n = &v["nemesis"];
    plots::nemesis_timeline(
        &out.join(format!("{label}-nemesis.svg")),
        &format!(
            "nemesis / {label}: {} faults took effect of {} injected; {} — seed {}",
            n["took_effect"],
            n["injected"],
            if v["verdict"]["pass"].as_bool().unwrap_or(false) {
                "PASS"
            } else {
                "FAIL"
            },
            v["seed"]
        ),
        &lanes,
        &bands,
        initial,
        steps,
        &tokens,
        x_max,
    )
}

fn f(v: &Value) -> Option<f64> {
    v.as_f64()
}

/// Kill / step-down → the next `won`, ms, recomputed from a run's JSON (the rule of
/// [`analysis::elections`]).
fn fault_to_won_of(v: &Value) -> Vec<f64> {
    let els: Vec<f64> = v["elections"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|e| f(&e["won_s"]))
        .collect();
    let mut used = vec![false; els.len()];
    let mut out = Vec::new();
    for fi in v["faults"].as_array().cloned().unwrap_or_default() {
        if !matches!(fi["kind"].as_str(), Some("kill-leader") | Some("stepdown")) {
            continue;
        }
        let at = f(&fi["applied_s"]).unwrap_or(0.0);
        if let Some(k) = (0..els.len()).find(|&k| !used[k] && els[k] > at) {
            used[k] = true;
            out.push((els[k] - at) * 1000.0);
        }
    }
    out
}

/// False failovers recomputed from a run's JSON (the same rule as [`analysis::false_failovers`],
/// so results written by an older binary are counted alike).
fn false_failovers_of(v: &Value) -> u64 {
    let ttl_s = v["lease_ttl_ms"].as_f64().unwrap_or(0.0) / 1000.0;
    let faults = v["faults"].as_array().cloned().unwrap_or_default();
    v["transitions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter(|t| {
            let Some(fi) = t["cause"].as_u64().and_then(|i| faults.get(i as usize)) else {
                return true;
            };
            match fi["kind"].as_str() {
                Some("kill-leader") | Some("stepdown") => false,
                _ => {
                    let len =
                        f(&fi["healed_s"]).unwrap_or(0.0) - f(&fi["applied_s"]).unwrap_or(0.0);
                    len < ttl_s
                }
            }
        })
        .count() as u64
}

fn ms_value(s: Value) -> String {
    ms_cell(&s)
}

fn ms_cell(s: &Value) -> String {
    if s.is_null() {
        return "–".into();
    }
    format!(
        "{:.0} / {:.0} / {:.0} (n={})",
        f(&s["median"]).unwrap_or(f64::NAN),
        f(&s["p99"]).unwrap_or(f64::NAN),
        f(&s["max"]).unwrap_or(f64::NAN),
        s["n"]
    )
}

/// Kill → first new write gaps (ms) of a run's leader kills, from its JSON.
fn kill_gaps_of(v: &Value) -> Vec<f64> {
    v["transitions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter(|t| t["cause_kind"] == "kill-leader")
        .filter_map(|t| f(&t["gap_ms"]))
        .collect()
}

/// Per pause of the leader in a run's JSON: `(length ms rounded to 50 ms, whether a leadership
/// change followed it)`.
fn pauses_of(v: &Value) -> Vec<(f64, bool)> {
    let causes: Vec<u64> = v["transitions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|t| t["cause"].as_u64())
        .collect();
    v["faults"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .enumerate()
        .filter(|(_, fi)| fi["kind"] == "pause-leader")
        .filter_map(|(i, fi)| {
            let len_ms = (f(&fi["healed_s"])? - f(&fi["applied_s"])?) * 1000.0;
            Some(((len_ms / 50.0).round() * 50.0, causes.contains(&(i as u64))))
        })
        .collect()
}

/// The failure-detector runs (those with a `detectors` sweep), when there are any: per run the
/// detection latency, failover, false positives and what they cost, backend requests and the
/// detector's datagrams per second; `failover-by-detector.svg` (failover CDFs) and, when the
/// runs paused the leader, `false-positives-vs-pause.svg`. Returns the plots made.
fn write_detector_section(
    md: &mut String,
    out: &Path,
    spec: &ExpSpec,
    runs: &[Value],
) -> anyhow::Result<Vec<&'static str>> {
    let runs: Vec<&Value> = runs.iter().filter(|v| !v["verdict"].is_null()).collect();
    if runs.is_empty() || spec.detectors.is_empty() {
        return Ok(Vec::new());
    }
    let _ = writeln!(md, "## Failure detector\n");
    let _ = writeln!(
        md,
        "Detection: `kill -9` of the leader → the first survivor's `peer-dead` (actor traces, one host clock). Failover: the old leader's last fenced `next` → the new leader's first (`fence_log.committed_at`). *Declared dead*: live node processes that learned the others had declared them dead (`baton_detector_declared_self_dead_total`, false positives they survived); *confirmations*: every observer's confirmations (`baton_detector_confirmed_dead_total`, about 8 per killed node at 9 nodes). False failovers: leadership changes after no fault, or after a pause / partition shorter than the TTL. Datagrams: UDP in each node's namespace during the load (only the detector speaks UDP there), per node and second. p99 of n ≤ 100 samples is close to the largest.\n"
    );
    let _ = writeln!(
        md,
        "| run | neighbour | detection ms (p50 / p99 / max, n) | failover ms (p50 / p99 / max, n) | kill → won ms (p50 / p99 / max) | declared dead | confirmations | false failovers | fence refusals | backend req/s | detector datagrams/s per node: sent / received (busiest sent) | checker |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut failovers: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut pauses: BTreeMap<String, Vec<(f64, f64, Option<f64>)>> = BTreeMap::new();
    for v in &runs {
        let label = v["label"].as_str().unwrap_or("?").to_owned();
        let counts = &v["detector_counts"];
        let count = |k: &str| counts[k].as_u64().unwrap_or(0);
        let dur = f(&v["duration_s"]).unwrap_or(0.0);
        let req_s = v["backend_requests"]["total"]
            .as_f64()
            .filter(|_| dur > 0.0)
            .map(|t| format!("{:.1}", t / dur))
            .unwrap_or_else(|| "–".into());
        let p = &v["detector_packets"];
        let packets = if p.is_null() {
            "–".to_owned()
        } else {
            format!(
                "{:.1} / {:.1} ({:.1})",
                f(&p["sent_per_node_s"]).unwrap_or(f64::NAN),
                f(&p["received_per_node_s"]).unwrap_or(f64::NAN),
                f(&p["max_sent_node_s"]).unwrap_or(f64::NAN)
            )
        };
        let neighbour = &v["neighbour"];
        let neighbour = if neighbour.is_null() {
            "none".to_owned()
        } else {
            format!(
                "{} % CPU, {}",
                neighbour["cpu_percent"],
                match neighbour["slice_ms"].as_u64() {
                    Some(0) | None => "bursty (random 0–500 ms slices)".to_owned(),
                    Some(ms) => format!("steady ({ms} ms slices)"),
                }
            )
        };
        let violations = v["verdict"]["violations"]
            .as_array()
            .map(|a| a.len())
            .unwrap_or(0);
        let _ = writeln!(
            md,
            "| {label} | {neighbour} | {} | {} | {} | {} | {} | {} | {} | {req_s} | {packets} | {} ({violations} violations) |",
            ms_cell(&v["detection_ms"]),
            ms_cell(&v["failover_ms"]),
            ms_cell(&v["kill_to_won_ms"]),
            count(baton::metrics::DETECTOR_DECLARED_DEAD),
            count(baton::metrics::DETECTOR_CONFIRMED_DEAD),
            false_failovers_of(v),
            v["rejections_total"],
            if v["verdict"]["pass"].as_bool().unwrap_or(false) {
                "PASS"
            } else {
                "FAIL"
            },
        );
        let gaps = kill_gaps_of(v);
        if !gaps.is_empty() {
            failovers.insert(label.clone(), gaps);
        }
        let mut by_len: BTreeMap<u64, (usize, usize)> = BTreeMap::new();
        for (len, changed) in pauses_of(v) {
            let e = by_len.entry(len as u64).or_default();
            e.0 += 1;
            e.1 += changed as usize;
        }
        if !by_len.is_empty() {
            pauses.insert(
                label,
                by_len
                    .into_iter()
                    .map(|(len, (n, changed))| {
                        (len as f64, 100.0 * changed as f64 / n as f64, None)
                    })
                    .collect(),
            );
        }
    }
    let _ = writeln!(md);
    let mut made = Vec::new();
    if !failovers.is_empty() {
        let series: BTreeMap<String, Vec<f64>> = failovers.into_iter().take(10).collect();
        plots::cdf(
            &out.join("failover-by-detector.svg"),
            &format!(
                "{}: failover after kill -9 of the leader, lease vs swim",
                spec.name
            ),
            "ms, last old write → first new write (fence_log.committed_at)",
            &series,
        )?;
        made.push("failover-by-detector.svg");
    }
    if !pauses.is_empty() {
        let x_max = pauses.values().flatten().map(|p| p.0).fold(0.0, f64::max) + 100.0;
        plots::lines(
            &out.join("false-positives-vs-pause.svg"),
            &plots::Axes {
                title: &format!(
                    "{}: pauses of the leader (SIGSTOP) that cost it its term",
                    spec.name
                ),
                x_desc: "pause length, ms",
                y_desc: "% of the pauses followed by a new leader",
                x_range: (0.0, x_max),
                marker: None,
            },
            &pauses,
        )?;
        made.push("false-positives-vs-pause.svg");
    }
    Ok(made)
}

/// `GET /read` results, when any run read: per run and mode, reads answered and stale ones, and
/// `stale-reads-vs-drift.svg` (stale reads against how far the clock is slower than the bound).
fn write_reads_section(
    md: &mut String,
    out: &Path,
    spec: &ExpSpec,
    runs: &[Value],
) -> anyhow::Result<()> {
    let with_reads: Vec<&Value> = runs
        .iter()
        .filter(|v| v["reads"].as_object().is_some_and(|o| !o.is_empty()))
        .collect();
    if with_reads.is_empty() {
        return Ok(());
    }
    let _ = writeln!(md, "## Reads (`GET /read`)\n");
    let _ = writeln!(
        md,
        "A read is **stale** when it returned a seq below an ID acknowledged before it was sent, or a token below one the resource had accepted before it was sent (witnessed by an acknowledged ID, or by a ledger row's `committed_at` + 20 ms, mapped onto the monotonic clock). `excess` = how much slower the clock runs than the configured bound = −drift − bound; the lease read window is only sound while excess ≤ 0. `clock`: `arithmetic` = the node scales its own deadlines by `clock_drift`; `libfaketime` = every node ran under libfaketime with its `CLOCK_MONOTONIC` really at rate 1 + drift (checked through `/status` after the restart; `faketime_observed_rates` in the run's JSON).\n"
    );
    let _ = writeln!(
        md,
        "| run | drift | clock | bound | excess | lease: answered / stale | quorum: answered / stale (of which fell back from lease) | resource: answered / stale |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    let mut lease_pts: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut other_pts: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for v in &with_reads {
        // A libfaketime run's clock really ran at `rate` (drift = rate − 1); otherwise the
        // node's arithmetic drift.
        let faketime = v["faketime_rate"].as_f64();
        let drift = faketime
            .map(|r| r - 1.0)
            .unwrap_or_else(|| v["clock_drift"].as_f64().unwrap_or(0.0));
        let clock = if faketime.is_some() {
            "libfaketime"
        } else {
            "arithmetic"
        };
        let bound = v["clock_rate_error"].as_f64().unwrap_or(0.01);
        let excess = -drift - bound;
        let m = |mode: &str, k: &str| v["reads"][mode][k].as_u64().unwrap_or(0);
        let _ = writeln!(
            md,
            "| {} | {drift:+.2} | {clock} | {bound:.2} | {excess:+.2} | {} / **{}** | {} / **{}** ({}) | {} / **{}** |",
            v["label"].as_str().unwrap_or("?"),
            m("lease", "reads"),
            m("lease", "stale"),
            m("quorum", "reads"),
            m("quorum", "stale"),
            m("quorum", "fell_back"),
            m("resource", "reads"),
            m("resource", "stale"),
        );
        let backend = v["backend"].as_str().unwrap_or("?").to_owned();
        let series = |what: &str| match faketime {
            Some(_) => format!("{backend} {what} (libfaketime)"),
            None => format!("{backend} {what}"),
        };
        lease_pts
            .entry(series("lease"))
            .or_default()
            .push((excess, m("lease", "stale") as f64));
        other_pts
            .entry(series("quorum+resource"))
            .or_default()
            .push((
                excess,
                (m("quorum", "stale") + m("resource", "stale")) as f64,
            ));
    }
    let _ = writeln!(md);
    let mut series = lease_pts;
    series.extend(other_pts);
    plots::xy(
        &out.join("stale-reads-vs-drift.svg"),
        &format!(
            "{}: stale reads vs clock slowness beyond the bound",
            spec.name
        ),
        "excess = -drift - clock_rate_error (0: the clock is exactly as slow as the bound allows)",
        "stale reads per run",
        &series,
    )?;
    let _ = writeln!(md, "![stale reads vs drift](stale-reads-vs-drift.svg)\n");
    Ok(())
}

/// Regenerates `summary.md`, `runs.csv` and the cross-run plots from every `LABEL.json` in `out`.
/// Returns the summary's verdict block (also printed).
pub fn write_experiment(out: &Path, spec: &ExpSpec) -> anyhow::Result<String> {
    let mut runs: Vec<Value> = Vec::new();
    for e in std::fs::read_dir(out)?.flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "json") {
            if let Ok(v) = serde_json::from_slice::<Value>(&std::fs::read(&p)?) {
                if v["experiment"] == spec.name.as_str() {
                    runs.push(v);
                }
            }
        }
    }
    for v in &runs {
        draw_run(out, v)?;
    }
    runs.sort_by(|a, b| {
        let key = |v: &Value| {
            (
                v["backend"].as_str().unwrap_or("").to_owned(),
                v["lease_ttl_ms"].as_u64().unwrap_or(0),
                v["label"].as_str().unwrap_or("").to_owned(),
            )
        };
        key(a).cmp(&key(b))
    });

    // Cross-run plots.
    let mut ttl_series: BTreeMap<String, Vec<(f64, f64, f64)>> = BTreeMap::new();
    let mut election: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut campaign: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut vacant: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut dark: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for v in &runs {
        let label = v["label"].as_str().unwrap_or("?").to_owned();
        let backend = v["backend"].as_str().unwrap_or("?").to_owned();
        let fo = &v["failover_ms"];
        if !fo.is_null() && v["fencing"] == "on" {
            let ttl_s = v["lease_ttl_ms"].as_f64().unwrap_or(0.0) / 1000.0;
            ttl_series.entry(backend.clone()).or_default().push((
                ttl_s,
                f(&fo["median"]).unwrap_or(0.0),
                f(&fo["max"]).unwrap_or(0.0),
            ));
        }
        let els = v["elections"].as_array().cloned().unwrap_or_default();
        let k2w = fault_to_won_of(v);
        if !k2w.is_empty() {
            election.insert(label.clone(), k2w);
        }
        let cw: Vec<f64> = els.iter().filter_map(|e| f(&e["campaign_ms"])).collect();
        if !cw.is_empty() {
            campaign.insert(label.clone(), cw);
        }
        let vw: Vec<f64> = els.iter().filter_map(|e| f(&e["election_ms"])).collect();
        if !vw.is_empty() {
            vacant.insert(label.clone(), vw);
        }
        let gaps: Vec<f64> = v["transitions"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter(|t| t["cause_kind"] == "kill-leader" || t["cause_kind"] == "stepdown")
            .filter_map(|t| f(&t["gap_ms"]))
            .collect();
        if !gaps.is_empty() {
            dark.insert(label, gaps);
        }
    }
    let mut plots_made = Vec::new();
    if !ttl_series.is_empty() {
        plots::failover_vs_ttl(
            &out.join("failover-vs-ttl.svg"),
            &format!("{}: failover after kill -9 vs lease TTL", spec.name),
            &ttl_series,
        )?;
        plots_made.push("failover-vs-ttl.svg");
    }
    let cdfs = [
        (
            "election-cdf.svg",
            "election latency, leader killed / stepped down → successor won",
            "ms (actor traces, CLOCK_MONOTONIC)",
            election,
        ),
        (
            "campaign-cdf.svg",
            "campaign → won per win (baton_campaign_duration_seconds)",
            "ms (actor traces)",
            campaign,
        ),
        (
            "vacant-to-won-cdf.svg",
            "seat vacant → won per win (baton_election_duration_seconds)",
            "ms (the winner's monotonic clock)",
            vacant,
        ),
        (
            "dark-cdf.svg",
            "dark time, last old write → first new write",
            "ms (fence_log.committed_at)",
            dark,
        ),
    ];
    for (file, title, x_label, series) in cdfs {
        if series.is_empty() {
            continue;
        }
        // At most 10 series per plot.
        let series: BTreeMap<String, Vec<f64>> = series.into_iter().take(10).collect();
        plots::cdf(
            &out.join(file),
            &format!("{}: {title}", spec.name),
            x_label,
            &series,
        )?;
        plots_made.push(file);
    }

    // runs.csv
    let mut csv = String::from(
        "label,backend,lease_ttl_ms,fencing,workset_rows,seed,pass,expect,expectation_met,writes,tokens,acked,rejections,faults,false_failovers,failover_median_ms,failover_p99_ms,failover_max_ms,dark_median_ms,dark_min_ms,kill_to_won_p99_ms,campaign_p99_ms,election_p99_ms,seq_not_increasing,token_backward,error\n",
    );
    for v in &runs {
        let g = |k: &str, q: &str| f(&v[k][q]).map(|x| format!("{x:.1}")).unwrap_or_default();
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},\"{}\"",
            v["label"].as_str().unwrap_or(""),
            v["backend"].as_str().unwrap_or(""),
            v["lease_ttl_ms"],
            v["fencing"].as_str().unwrap_or(""),
            v["workset_rows"],
            v["seed"],
            v["verdict"]["pass"],
            v["expect"].as_str().unwrap_or(""),
            v["expectation_met"],
            v["verdict"]["writes"],
            v["verdict"]["tokens"],
            v["verdict"]["acked"],
            v["rejections_total"],
            v["faults"].as_array().map(|a| a.len()).unwrap_or(0),
            false_failovers_of(v),
            g("failover_ms", "median"),
            g("failover_ms", "p99"),
            g("failover_ms", "max"),
            g("stepdown_dark_ms", "median"),
            g("stepdown_dark_ms", "min"),
            crate::report::Summary::of(&fault_to_won_of(v))
                .map(|s| format!("{:.1}", s.p99))
                .unwrap_or_default(),
            g("campaign_ms", "p99"),
            g("election_ms", "p99"),
            v["seq_steps"]["seq_not_increasing"],
            v["seq_steps"]["token_backward"],
            v["error"].as_str().unwrap_or("").replace('"', "'"),
        );
    }
    std::fs::write(out.join("runs.csv"), csv)?;

    // summary.md
    let mut md = String::new();
    let _ = writeln!(md, "# Experiment `{}`\n", spec.name);
    if !spec.description.is_empty() {
        let _ = writeln!(md, "{}\n", spec.description.trim());
    }
    let _ = writeln!(
        md,
        "Spec: `experiments/{}.toml` (seed {}). Generated by `baton exp`; every run below lists its own command, commit and machine in `LABEL.json` → `meta`.\n",
        spec.name, spec.seed
    );
    let mut metas: Vec<(String, String, String)> = runs
        .iter()
        .map(|v| {
            (
                v["meta"]["command"].as_str().unwrap_or("?").to_owned(),
                v["meta"]["commit"].as_str().unwrap_or("?").to_owned(),
                format!(
                    "nproc {}, kernel {}, {}, {} build",
                    v["meta"]["machine"]["nproc"],
                    v["meta"]["machine"]["kernel"].as_str().unwrap_or("?"),
                    v["meta"]["machine"]["cpu"].as_str().unwrap_or("?"),
                    v["meta"]["machine"]["build"].as_str().unwrap_or("?")
                ),
            )
        })
        .collect();
    metas.sort();
    metas.dedup();
    let _ = writeln!(md, "## Commands, commits, machines\n");
    for (c, commit, m) in &metas {
        let _ = writeln!(md, "- `{c}` — commit `{commit}` — {m}");
    }
    let _ = writeln!(
        md,
        "\nThe machine is shared and noisy (2 cores running PostgreSQL, the backend servers, every node and the load generator): treat single numbers as samples, not benchmarks.\n"
    );
    let _ = writeln!(md, "## Verdicts\n");
    let _ = writeln!(
        md,
        "| run | TTL | seed | verdict | expected | failover ms (median / p99 / max) | step-down dark ms | false failovers | refused writes | seq non-increasing steps |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
    let mut verdicts = String::new();
    for v in &runs {
        let label = v["label"].as_str().unwrap_or("?");
        if let Some(e) = v["error"].as_str().filter(|_| v["verdict"].is_null()) {
            let _ = writeln!(
                md,
                "| {label} | | {} | ERROR: {} | | | | | | |",
                v["seed"],
                e.replace('|', "/")
            );
            let _ = writeln!(verdicts, "{}/{label}: ERROR {e}", spec.name);
            continue;
        }
        let line = v["verdict"]["line"].as_str().unwrap_or("?");
        let met = v["expectation_met"].as_bool().unwrap_or(false);
        let _ = writeln!(
            md,
            "| {label} | {} ms | {} | `{}` | {} {} | {} | {} | {} | {} | {} |",
            v["lease_ttl_ms"],
            v["seed"],
            line.replace('|', "/"),
            v["expect"].as_str().unwrap_or("?"),
            if met { "✓" } else { "✗ UNEXPECTED" },
            ms_cell(&v["failover_ms"]),
            ms_cell(&v["stepdown_dark_ms"]),
            false_failovers_of(v),
            v["rejections_total"],
            v["seq_steps"]["seq_not_increasing"],
        );
        let _ = writeln!(
            verdicts,
            "{}/{label}: {line} [expected {}{}]",
            spec.name,
            v["expect"].as_str().unwrap_or("?"),
            if met { "" } else { ": UNEXPECTED" }
        );
    }
    let _ = writeln!(md, "\n```text\n{verdicts}```\n");
    write_reads_section(&mut md, out, spec, &runs)?;
    plots_made.extend(write_detector_section(&mut md, out, spec, &runs)?);
    let stale: Vec<String> = runs
        .iter()
        .flat_map(|v| {
            let label = v["label"].as_str().unwrap_or("?").to_owned();
            v["stale"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |s| {
                    // Results of older binaries: a fault no transition followed was ridden out.
                    let led_to_change = v["transitions"]
                        .as_array()
                        .is_some_and(|ts| ts.iter().any(|t| t["cause"] == s["fault"]));
                    let outcome = if !led_to_change
                        && s["rejected"].as_array().is_none_or(|r| r.is_empty())
                        && s["accepted_after_successor"].as_u64() == Some(0)
                    {
                        "rode it out: kept its lease, no leadership change, nothing refused"
                            .to_owned()
                    } else {
                        s["outcome"].as_str().unwrap_or("?").to_owned()
                    };
                    format!(
                        "- **{label}**, {} (token {}) hit at {:.2} s: {}{}",
                        s["node"].as_str().unwrap_or("?"),
                        s["token"],
                        s["applied_s"].as_f64().unwrap_or(0.0),
                        outcome,
                        s["belief_overlap_ms"]
                            .as_f64()
                            .map(|b| format!(" (both believed they led for {b:.0} ms)"))
                            .filter(|_| s["belief_overlap_ms"].as_f64().unwrap_or(0.0) > 0.0)
                            .unwrap_or_default()
                    )
                })
        })
        .collect();
    if !stale.is_empty() {
        let _ = writeln!(md, "## The paused / partitioned leader\n");
        // A nemesis run has hundreds: the first ones show the pattern, the JSON has them all.
        const SHOWN: usize = 60;
        let more = stale.len().saturating_sub(SHOWN);
        for s in stale.into_iter().take(SHOWN) {
            let _ = writeln!(md, "{s}");
        }
        if more > 0 {
            let _ = writeln!(md, "- … {more} more in the runs' `LABEL.json` → `stale`");
        }
        let _ = writeln!(md);
    }
    let elections: Vec<String> = runs
        .iter()
        .filter(|v| !fault_to_won_of(v).is_empty() || !v["campaign_ms"].is_null())
        .map(|v| {
            format!(
                "- **{}**: kill → won ms {}; seat vacant → won (the election) ms {}; campaign call → won (includes queueing) ms {}; wins per node {}; winners per round {}; backend requests per election {} (election ops only: {})",
                v["label"].as_str().unwrap_or("?"),
                ms_value(crate::report::Summary::of(&fault_to_won_of(v)).map(|s| serde_json::to_value(s).unwrap_or_default()).unwrap_or(Value::Null)),
                ms_cell(&v["election_ms"]),
                ms_cell(&v["campaign_ms"]),
                v["wins_per_node"],
                v["winners_per_round"],
                f(&v["backend_requests"]["per_election"]).map(|x| format!("{x:.1}")).unwrap_or_else(|| "–".into()),
                f(&v["backend_requests"]["campaign_ops_per_election"]).map(|x| format!("{x:.1}")).unwrap_or_else(|| "–".into()),
            )
        })
        .collect();
    if !elections.is_empty() {
        let _ = writeln!(md, "## Elections (actor traces)\n");
        for e in elections {
            let _ = writeln!(md, "{e}");
        }
        let _ = writeln!(md);
    }
    let nemesis_md = nemesis_section(&runs);
    if !nemesis_md.is_empty() {
        let _ = writeln!(md, "{nemesis_md}");
        plots_made
            .push("LABEL-nemesis.svg (per run: faults by kind, leaders acting, accepted tokens)");
    }
    let _ = writeln!(md, "## Files\n");
    for p in &plots_made {
        let _ = writeln!(md, "- `{p}`");
    }
    let _ = writeln!(
        md,
        "- per run: `LABEL.json` (everything), `LABEL-timeline.csv` (leaders acting by effect), `LABEL-client.csv` (client outcomes per second), `LABEL-seq.csv` (downsampled next rows), `LABEL-acting.svg`, `LABEL-seq.svg`\n- `runs.csv`: one row per run"
    );
    std::fs::write(out.join("summary.md"), md)?;
    Ok(verdicts)
}

/// The nemesis runs' faults by kind, availability and violations (empty without nemesis runs).
fn nemesis_section(runs: &[Value]) -> String {
    let mut md = String::new();
    for v in runs.iter().filter(|v| !v["nemesis"].is_null()) {
        let n = &v["nemesis"];
        let violations: Vec<String> = v["verdict"]["violations"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|x| format!("`{}`", x["invariant"].as_str().unwrap_or("?")))
            .collect();
        let _ = writeln!(
            md,
            "### {} (fencing {}, nemesis seed {})\n\n{} faults drawn, {} injected, **{} took effect** ({}); violations: {}; `/next` availability {:.1}% ({} acknowledged IDs, {} indeterminate); {} fault errors; verdict `{}`.\n",
            v["label"].as_str().unwrap_or("?"),
            v["fencing"].as_str().unwrap_or("?"),
            n["seed"],
            n["drawn"],
            n["injected"],
            n["took_effect"],
            if n["enough_took_effect"].as_bool().unwrap_or(false) {
                "enough"
            } else {
                "NOT ENOUGH: the run does not count"
            },
            if violations.is_empty() {
                "none".to_owned()
            } else {
                violations.join(", ")
            },
            f(&n["availability"]).unwrap_or(0.0) * 100.0,
            n["acked"],
            n["indeterminate"],
            n["errors"],
            v["verdict"]["line"].as_str().unwrap_or("?").replace('|', "/"),
        );
        let _ = writeln!(
            md,
            "| fault kind | injected | took effect | leadership changes after it | dark ms (median / p99 / max) |\n|---|---|---|---|---|"
        );
        for (kind, k) in n["by_kind"].as_object().cloned().unwrap_or_default() {
            let _ = writeln!(
                md,
                "| {kind} | {} | {} | {} | {} |",
                k["injected"],
                k["took_effect"],
                k["transitions"],
                ms_cell(&k["dark_ms"])
            );
        }
        let _ = writeln!(md);
    }
    if md.is_empty() {
        return md;
    }
    format!("## Nemesis\n\nFaults count only when observed in effect (process gone / stopped, path cut, the node's own clock at the other rate, killed while its step-down was in flight). Dark time: last write of the old leadership → first of the new (fence_log.committed_at), per change, attributed to the latest fault before it.\n\n{md}")
}

/// The plans of an experiment, for listing (`--backends` filter applied).
pub fn plans(name: &str, quick: bool) -> anyhow::Result<Vec<RunPlan>> {
    let (mut spec, _) = ExpSpec::load(name)?;
    if quick {
        spec = spec.quick();
    }
    spec.plan(None, None)
}
