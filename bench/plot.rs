//! busbw against size as a hand-written SVG: log2 size axis, one polyline per
//! collective and placement, legend on the right.

use crate::opts::fmt_size;
use crate::report::Record;
use std::fmt::Write as _;

const W: f64 = 960.0;
const H: f64 = 560.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 250.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 70.0;
const COLORS: [&str; 10] =
    ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

fn xml(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A step of 1, 2 or 5 times a power of ten giving about `ticks` ticks up to `max`.
fn nice_step(max: f64, ticks: f64) -> f64 {
    let raw = max / ticks;
    let p = 10f64.powf(raw.log10().floor());
    let m = raw / p;
    p * if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    }
}

/// One line of the plot: (collective, placement, points (size, busbw)).
pub type Series = (&'static str, &'static str, Vec<(u64, f64)>);

/// Series in order of first appearance.
pub fn series(records: &[Record]) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::new();
    for r in records {
        let i = match out.iter().position(|s| s.0 == r.collective && s.1 == r.placement) {
            Some(i) => i,
            None => {
                out.push((r.collective, r.placement, Vec::new()));
                out.len() - 1
            }
        };
        // A log axis has no place for size 0.
        if r.size_bytes > 0 {
            out[i].2.push((r.size_bytes, r.busbw));
        }
    }
    out
}

pub fn svg(records: &[Record], title: &str) -> String {
    let ser = series(records);
    let sizes = ser.iter().flat_map(|s| s.2.iter().map(|p| p.0));
    let (mut xmin, mut xmax) = (f64::INFINITY, f64::NEG_INFINITY);
    for s in sizes {
        let l = (s as f64).log2();
        xmin = xmin.min(l.floor());
        xmax = xmax.max(l.ceil());
    }
    if !xmin.is_finite() {
        (xmin, xmax) = (3.0, 10.0);
    }
    if xmax <= xmin {
        xmin -= 1.0;
        xmax += 1.0;
    }
    let ymax_data = ser.iter().flat_map(|s| s.2.iter().map(|p| p.1)).filter(|v| v.is_finite()).fold(0.0, f64::max);
    let ystep = nice_step(if ymax_data > 0.0 { ymax_data * 1.05 } else { 1.0 }, 6.0);
    let ymax = ((if ymax_data > 0.0 { ymax_data * 1.05 } else { 1.0 }) / ystep).ceil() * ystep;
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let px = |log2: f64| LEFT + (log2 - xmin) / (xmax - xmin) * pw;
    let py = |v: f64| TOP + ph - (v.clamp(0.0, ymax) / ymax) * ph;

    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" font-family=\"sans-serif\" font-size=\"12\">"
    );
    let _ = writeln!(s, "<rect x=\"0\" y=\"0\" width=\"{W}\" height=\"{H}\" fill=\"white\"/>");
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"28\" text-anchor=\"middle\" font-size=\"15\">{}</text>",
        LEFT + pw / 2.0,
        xml(title)
    );
    // Grid, ticks and labels: x at every power of two (labels thinned to ~12).
    let nx = (xmax - xmin) as i64;
    let label_every = ((nx as f64) / 12.0).ceil().max(1.0) as i64;
    for i in 0..=nx {
        let l = xmin + i as f64;
        let x = px(l);
        let _ =
            writeln!(s, "<line x1=\"{x:.1}\" y1=\"{TOP}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#e5e5e5\"/>", TOP + ph);
        if (l as i64) % label_every == 0 {
            let label = format!("{}{}", fmt_size(1u64 << (l as u32).min(62)), if l < 10.0 { "B" } else { "" });
            let _ = writeln!(
                s,
                "<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                TOP + ph + 18.0,
                xml(&label)
            );
        }
    }
    let mut v = 0.0;
    while v <= ymax + ystep * 1e-9 {
        let y = py(v);
        let _ =
            writeln!(s, "<line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#e5e5e5\"/>", LEFT + pw);
        let label = if ystep >= 1.0 { format!("{v:.0}") } else { format!("{v:.*}", (-ystep.log10().floor()) as usize) };
        let _ = writeln!(s, "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{label}</text>", LEFT - 6.0, y + 4.0);
        v += ystep;
    }
    let _ =
        writeln!(s, "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"#333\"/>");
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">message size (bytes, log2 scale)</text>",
        LEFT + pw / 2.0,
        H - 20.0
    );
    let _ = writeln!(
        s,
        "<text x=\"20\" y=\"{:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 20 {:.1})\">bus bandwidth busbw (GB/s)</text>",
        TOP + ph / 2.0,
        TOP + ph / 2.0
    );
    // One polyline per series; colour by collective, dashed for in-place.
    let mut colls: Vec<&str> = Vec::new();
    for (i, (coll, placement, pts)) in ser.iter().enumerate() {
        let ci = match colls.iter().position(|c| c == coll) {
            Some(i) => i,
            None => {
                colls.push(coll);
                colls.len() - 1
            }
        };
        let color = COLORS[ci % COLORS.len()];
        let dash = if *placement == "in" { " stroke-dasharray=\"6,4\"" } else { "" };
        let points: Vec<String> =
            pts.iter().map(|&(sz, bw)| format!("{:.1},{:.1}", px((sz as f64).log2()), py(bw))).collect();
        let name = format!("{coll} {}", if *placement == "in" { "in-place" } else { "out-of-place" });
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"{dash} points=\"{}\"><title>{}</title></polyline>",
            points.join(" "),
            xml(&name)
        );
        for &(sz, bw) in pts {
            let _ = writeln!(
                s,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" fill=\"{color}\"/>",
                px((sz as f64).log2()),
                py(bw)
            );
        }
        let ly = TOP + 10.0 + i as f64 * 18.0;
        let lx = W - RIGHT + 20.0;
        let _ = writeln!(
            s,
            "<line x1=\"{lx}\" y1=\"{ly}\" x2=\"{}\" y2=\"{ly}\" stroke=\"{color}\" stroke-width=\"2\"{dash}/>",
            lx + 28.0
        );
        let _ = writeln!(s, "<text x=\"{}\" y=\"{}\">{}</text>", lx + 34.0, ly + 4.0, xml(&name));
    }
    let _ = writeln!(s, "</svg>");
    s
}
