//! A reliability diagram of one field as a self-contained SVG (hand-written, no fonts or
//! scripts beyond the viewer's default sans-serif): per equal-width confidence bin a bar of the
//! bin's accuracy, drawn over the bin's confidence range, a dot at the bin's mean confidence,
//! the item count above each bar, the diagonal of perfect calibration, axis ticks and labels,
//! and a title with the field name, N, accuracy and both ECEs (bin count stated).

use super::metrics::FieldMetrics;
use std::fmt::Write;

const W: f64 = 600.0;
const H: f64 = 520.0;
const LEFT: f64 = 100.0;
const TOP: f64 = 70.0;
const PLOT: f64 = 400.0;

/// The axis titles and the bars' legend, as both the SVG and the PNG ([`super::png`]) write them.
pub(super) const X_TITLE: &str = "confidence (probability of the chosen value)";
pub(super) const Y_TITLE: &str = "accuracy in the bin";
pub(super) const BARS_LEGEND: &str = "accuracy per bin (n = items)";

/// The line under the title: accuracy and both ECEs with the bin count, parts joined by `sep`.
pub(super) fn summary(m: &FieldMetrics, sep: &str) -> String {
    format!(
        "accuracy {:.3}{sep}ECE {:.3} (equal-width, {} bins){sep}ECE {:.3} (equal-mass, {} bins)",
        m.accuracy, m.ece_equal_width, m.bins, m.ece_equal_mass, m.bins
    )
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Plot x of a confidence, y of an accuracy (both in [0, 1]).
fn x(c: f64) -> f64 {
    LEFT + c * PLOT
}
fn y(a: f64) -> f64 {
    TOP + (1.0 - a) * PLOT
}

/// The SVG text of `field`'s reliability diagram (`label`: what was evaluated, e.g. the model).
pub fn reliability_svg(field: &str, m: &FieldMetrics, label: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15" font-weight="bold">Reliability of field “{}” (N = {})</text>"#,
        W / 2.0,
        esc(field),
        m.n
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="40" text-anchor="middle">{}</text>"#,
        W / 2.0,
        summary(m, " · ")
    );
    let _ = writeln!(
        s,
        r##"<text x="{}" y="56" text-anchor="middle" fill="#555">{}</text>"##,
        W / 2.0,
        esc(label)
    );
    // frame and grid
    for t in 0..=10 {
        let v = t as f64 / 10.0;
        let _ = writeln!(
            s,
            r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#e5e5e5"/>"##,
            x(0.0),
            y(v),
            x(1.0),
            y(v)
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{v:.1}</text>"#,
            x(0.0) - 6.0,
            y(v) + 4.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{v:.1}</text>"#,
            x(v),
            y(0.0) + 16.0
        );
    }
    // bars: accuracy per equal-width bin
    for b in &m.reliability_equal_width.bins {
        let Some(acc) = b.accuracy else { continue };
        let (x0, x1) = (x(b.lower) + 1.0, x(b.upper) - 1.0);
        let _ = writeln!(
            s,
            r##"<rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#4c78a8" fill-opacity="0.75"><title>confidence {:.1}–{:.1}: {} items, accuracy {acc:.3}, mean confidence {:.3}</title></rect>"##,
            y(acc),
            (x1 - x0).max(0.5),
            (y(0.0) - y(acc)).max(0.0),
            b.lower,
            b.upper,
            b.count,
            b.mean_confidence.unwrap_or(f64::NAN)
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10">n={}</text>"#,
            (x0 + x1) / 2.0,
            y(acc) - 4.0,
            b.count
        );
        if let Some(c) = b.mean_confidence {
            let _ = writeln!(
                s,
                r##"<circle cx="{:.1}" cy="{:.1}" r="3" fill="#e45756"/>"##,
                x(c),
                y(acc)
            );
        }
    }
    // the diagonal and the frame on top
    let _ = writeln!(
        s,
        r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#333" stroke-dasharray="6 4"/>"##,
        x(0.0),
        y(0.0),
        x(1.0),
        y(1.0)
    );
    let _ = writeln!(
        s,
        r#"<rect x="{LEFT}" y="{TOP}" width="{PLOT}" height="{PLOT}" fill="none" stroke="black"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{X_TITLE}</text>"#,
        x(0.5),
        y(0.0) + 34.0
    );
    let _ = writeln!(
        s,
        r#"<text x="50" y="{:.1}" text-anchor="middle" transform="rotate(-90 50 {:.1})">{Y_TITLE}</text>"#,
        y(0.5),
        y(0.5)
    );
    // legend
    let ly = y(0.0) + 46.0;
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{:.1}" width="12" height="10" fill="#4c78a8" fill-opacity="0.75"/><text x="{:.1}" y="{:.1}">{BARS_LEGEND}</text>"##,
        ly - 9.0,
        LEFT + 16.0,
        ly
    );
    let _ = writeln!(
        s,
        r##"<circle cx="{:.1}" cy="{:.1}" r="3" fill="#e45756"/><text x="{:.1}" y="{:.1}">mean confidence in the bin</text>"##,
        LEFT + 190.0,
        ly - 4.0,
        LEFT + 198.0,
        ly
    );
    let _ = writeln!(
        s,
        r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#333" stroke-dasharray="6 4"/><text x="{:.1}" y="{:.1}">perfect calibration</text>"##,
        LEFT + 350.0,
        ly - 4.0,
        LEFT + 370.0,
        ly - 4.0,
        LEFT + 374.0,
        ly
    );
    s.push_str("</svg>\n");
    s
}
