//! `--plot FILE.svg`: GB/s by block size (log2 x axis), one solid series per op and transport,
//! the anchors measured in the same run dashed beside them; the title names the transports, the
//! date, the commit and the machine. `--plot-from FILE.jsonl` (repeatable) draws the rows of
//! earlier `--json` invocations instead of measuring: e.g. TCP and same-host rows in one image.

use std::collections::BTreeSet;
use std::path::Path;

use plotters::prelude::{
    BLACK, ChartBuilder, Circle, Color, DashedLineSeries, IntoDrawingArea, IntoFont, LineSeries,
    Palette, Palette99, PathElement, SVGBackend, SeriesLabelPosition, Text, TriangleMarker, WHITE,
};

use super::human;

/// One row as the plot needs it: a main-table row of this run or of a `--json` file.
pub(crate) struct PlotRow {
    pub op: String,
    pub transport: String,
    pub block: usize,
    pub gbps: f64,
    pub anchors: Vec<(String, Option<f64>)>,
}

/// Where and when rows were measured: the `{"metric":"run",...}` line of a `--json` run.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct RunMeta {
    pub date: String,
    pub commit: String,
    pub machine: String,
}

impl RunMeta {
    /// This run's: today's date (UTC), `git rev-parse --short HEAD` of the checkout the bench
    /// was built from ("unknown" without git; "+changes" when the tree differs from it), the
    /// CPU model and the CPUs this process may use.
    pub(crate) fn here() -> Self {
        let dir = env!("CARGO_MANIFEST_DIR");
        let git = |args: &[&str]| {
            std::process::Command::new("git")
                .args(["-C", dir])
                .args(args)
                .stderr(std::process::Stdio::null())
                .output()
                .ok()
        };
        let commit = match git(&["rev-parse", "--short", "HEAD"]) {
            Some(o) if o.status.success() => {
                let mut c = String::from_utf8_lossy(&o.stdout).trim().to_owned();
                if git(&["diff", "--quiet", "HEAD"]).is_some_and(|o| o.status.code() == Some(1)) {
                    c.push_str("+changes");
                }
                c
            }
            _ => "unknown".to_owned(),
        };
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, m)| m.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown CPU".to_owned());
        let n = std::thread::available_parallelism().map_or(0, |n| n.get());
        RunMeta {
            date: today(),
            commit,
            machine: format!("{cpu}, {n} CPUs"),
        }
    }

    /// The `--json` line that carries it.
    pub(crate) fn json(&self) -> String {
        serde_json::json!({
            "metric": "run",
            "date": self.date,
            "commit": self.commit,
            "machine": self.machine,
        })
        .to_string()
    }
}

/// Today's date (UTC) as YYYY-MM-DD, from the system clock (days to civil date, H. Hinnant's
/// algorithm).
fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Reads the main-table rows and the run lines of `--json` output files (other lines, such as
/// the extra metrics and the many-to-many rows, are skipped).
pub(crate) fn read_jsonl(
    files: &[String],
) -> Result<(Vec<PlotRow>, Vec<RunMeta>), Box<dyn std::error::Error>> {
    let mut rows = Vec::new();
    let mut metas = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).map_err(|e| format!("--plot-from {f}: {e}"))?;
        for (n, line) in text.lines().enumerate() {
            // from the first brace: a line may carry the progress output of a `2>&1` capture
            let Some(line) = line.find('{').map(|i| line[i..].trim()) else {
                continue;
            };
            let v: serde_json::Value =
                serde_json::from_str(line).map_err(|e| format!("{f}:{}: {e}", n + 1))?;
            let s = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_owned);
            if s("metric").as_deref() == Some("run") {
                metas.push(RunMeta {
                    date: s("date").unwrap_or_default(),
                    commit: s("commit").unwrap_or_default(),
                    machine: s("machine").unwrap_or_default(),
                });
                continue;
            }
            let (Some(op), Some(transport), Some(block), Some(gbps)) = (
                s("op"),
                s("transport"),
                v.get("block").and_then(|x| x.as_u64()),
                v.get("gbps").and_then(|x| x.as_f64()),
            ) else {
                continue;
            };
            if v.get("metric").is_some() || !matches!(op.as_str(), "WRITE" | "READ") {
                continue; // a many-to-many, link-cost or 8-byte latency row
            }
            let anchors = v
                .get("anchors")
                .and_then(|a| a.as_object())
                .map(|a| {
                    a.iter()
                        .map(|(k, g)| (k.clone(), g.as_f64()))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            rows.push(PlotRow {
                op,
                transport,
                block: block as usize,
                gbps,
                anchors,
            });
        }
    }
    Ok((rows, metas))
}

struct Series {
    name: String,
    anchor: bool,
    points: Vec<(f64, f64)>,
}

/// The anchors whose figure depends on the op (the peers' READ and WRITE, `process_vm_readv`
/// and `writev`); the others (iperf3, memcpy, `ucx_perftest ucp_put_bw`) do not, and are drawn
/// once per transport, the mean of the rows' measurements at a block size.
const PER_OP: &[&str] = &["mooncake", "nixl", "nixl_sm", "process_vm"];

/// The series of `rows`: hixl's per (op, transport); each anchor per transport, and per op too
/// where it depends on the op ([`PER_OP`]).
fn series(rows: &[PlotRow]) -> Vec<Series> {
    let multi = rows
        .iter()
        .map(|r| &r.transport)
        .collect::<BTreeSet<_>>()
        .len()
        > 1;
    let mut out: Vec<Series> = Vec::new();
    // (name, anchor, block) -> the values measured for it
    let mut points: Vec<(String, bool, usize, Vec<f64>)> = Vec::new();
    let mut add = |name: String, anchor: bool, block: usize, g: f64| match points
        .iter_mut()
        .find(|p| p.0 == name && p.2 == block)
    {
        Some(p) => p.3.push(g),
        None => points.push((name, anchor, block, vec![g])),
    };
    for r in rows {
        add(
            format!("hixl {} {}", r.op, r.transport),
            false,
            r.block,
            r.gbps,
        );
    }
    for r in rows {
        for (a, g) in &r.anchors {
            let Some(g) = *g else { continue };
            let mut name = a.clone();
            if PER_OP.contains(&a.as_str()) {
                name = format!("{name} {}", r.op);
            }
            if multi {
                name = format!("{name} ({})", r.transport);
            }
            add(name, true, r.block, g);
        }
    }
    for (name, anchor, block, gs) in points {
        let p = (
            (block as f64).log2(),
            gs.iter().sum::<f64>() / gs.len() as f64,
        );
        match out.iter_mut().find(|s| s.name == name) {
            Some(s) => s.points.push(p),
            None => out.push(Series {
                name,
                anchor,
                points: vec![p],
            }),
        }
    }
    for s in &mut out {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// Draws `rows` into the SVG file `path` (its folder is made if it is missing); `metas` are the
/// runs they come from.
pub(crate) fn draw(
    path: &Path,
    rows: &[PlotRow],
    metas: &[RunMeta],
) -> Result<(), Box<dyn std::error::Error>> {
    if rows.is_empty() {
        return Err("--plot: no rows to draw".into());
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| {
            format!(
                "--plot {}: cannot make its folder {}: {e}",
                path.display(),
                dir.display()
            )
        })?;
    }
    let series = series(rows);
    let transports: Vec<&str> = rows
        .iter()
        .map(|r| r.transport.as_str())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let list = |f: fn(&RunMeta) -> &String| {
        metas
            .iter()
            .map(f)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    };
    let title = format!("hixl GB/s by block size: {}", transports.join(" + "));
    let subtitle = format!(
        "{} | commit {} | {}",
        list(|m| &m.date),
        list(|m| &m.commit),
        list(|m| &m.machine)
    );
    let (lo, hi) = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let top = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0f64, f64::max)
        // headroom above the data for the legend (about 20 of the plot's 570 pixels a series)
        / (1.0 - ((20 * series.len() + 30) as f64 / 570.0).min(0.6));
    let (lo, hi) = (lo.floor() - 0.5, hi.ceil() + 0.5);

    let root = SVGBackend::new(path, (1100, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let (head, body) = root.split_vertically(56);
    head.draw(&Text::new(
        title,
        (20, 8),
        ("sans-serif", 26).into_font().color(&BLACK),
    ))?;
    head.draw(&Text::new(
        subtitle,
        (20, 34),
        ("sans-serif", 17).into_font().color(&BLACK.mix(0.7)),
    ))?;
    let mut chart = ChartBuilder::on(&body)
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(lo..hi, 0.0..top.max(0.1))?;
    // at most about 12 labels: every `step`-th power of two
    let step = ((hi - lo) / 12.0).ceil().max(1.0) as i64;
    let label = |x: &f64| {
        if (x - x.round()).abs() < 1e-6 && *x >= 0.0 && (x.round() as i64) % step == 0 {
            human(1usize << (x.round() as u32))
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .x_labels(((hi - lo) as usize + 1).max(2))
        .x_label_formatter(&label)
        .light_line_style(WHITE.mix(0.0))
        .label_style(("sans-serif", 15))
        .x_desc("block size (log2)")
        .y_desc("GB/s (1e9 bytes/s)")
        .draw()?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        if s.anchor {
            let style = color.stroke_width(1);
            chart
                .draw_series(DashedLineSeries::new(s.points.clone(), 6, 4, style))?
                .label(s.name.clone())
                .legend(move |(x, y)| {
                    plotters::element::DashedPathElement::new(
                        vec![(x, y), (x + 20, y)],
                        6,
                        4,
                        style,
                    )
                });
            chart.draw_series(
                s.points
                    .iter()
                    .map(|&p| TriangleMarker::new(p, 3, color.filled())),
            )?;
        } else {
            let style = color.stroke_width(3);
            chart
                .draw_series(LineSeries::new(s.points.clone(), style))?
                .label(s.name.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
            chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()?;
    root.present()?;
    Ok(())
}
