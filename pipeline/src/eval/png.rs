//! The reliability diagram of one field as a PNG: the SVG's content ([`super::svg`]) drawn into
//! an RGB raster here, for viewers and reports that take no SVG. Text uses the public-domain
//! 8 × 8 bitmap font of the `font8x8` crate (ASCII; any other character is drawn as `?`), the
//! image is encoded by hand (one IDAT chunk, zlib by `flate2`, CRCs by `crc32fast`).
//!
//! Layout (pixels): a 680 × 520 canvas, the plot square 400 × 400 at (140, 70);
//! per equal-width bin a bar of the bin's accuracy over its confidence range with the item count
//! above it, a dot at the bin's mean confidence, the dashed diagonal of perfect calibration,
//! grid lines and ticks every 0.1, axis titles, and a title with the field, N, accuracy and both
//! ECEs (bin count stated).

use super::metrics::FieldMetrics;
use super::svg::{summary, BARS_LEGEND, X_TITLE, Y_TITLE};
use std::io::Write;

/// Canvas and plot geometry (the SVG's plot; the canvas wider, for the fixed-width font).
const W: usize = 680;
const H: usize = 520;
const LEFT: usize = 140;
const TOP: usize = 70;
const PLOT: usize = 400;

type Rgb = [u8; 3];
const WHITE: Rgb = [255, 255, 255];
const BLACK: Rgb = [0, 0, 0];
const GRID: Rgb = [229, 229, 229];
const GREY: Rgb = [85, 85, 85];
/// The SVG's bar colour `#4c78a8` at 75 % over white.
pub const BAR: Rgb = [121, 154, 190];
const DOT: Rgb = [228, 87, 86];
const DIAGONAL: Rgb = [51, 51, 51];

/// Plot x of a confidence, y of an accuracy (both in [0, 1]).
fn x(c: f64) -> i64 {
    (LEFT as f64 + c.clamp(0.0, 1.0) * PLOT as f64).round() as i64
}
fn y(a: f64) -> i64 {
    (TOP as f64 + (1.0 - a.clamp(0.0, 1.0)) * PLOT as f64).round() as i64
}

/// Where a text sits relative to its x.
#[derive(Clone, Copy)]
enum Anchor {
    Start,
    Middle,
    End,
}

struct Canvas {
    px: Vec<Rgb>,
}

impl Canvas {
    fn new() -> Canvas {
        Canvas {
            px: vec![WHITE; W * H],
        }
    }

    fn set(&mut self, x: i64, y: i64, c: Rgb) {
        if (0..W as i64).contains(&x) && (0..H as i64).contains(&y) {
            self.px[y as usize * W + x as usize] = c;
        }
    }

    /// The rectangle `[x0, x1) × [y0, y1)`.
    fn fill(&mut self, x0: i64, y0: i64, x1: i64, y1: i64, c: Rgb) {
        for yy in y0..y1 {
            for xx in x0..x1 {
                self.set(xx, yy, c);
            }
        }
    }

    /// A one-pixel line (Bresenham), dashed `on` pixels on, `off` off when `dash` is given.
    fn line(&mut self, from: (i64, i64), to: (i64, i64), c: Rgb, dash: Option<(u32, u32)>) {
        let (mut x0, mut y0) = from;
        let (dx, dy) = ((to.0 - x0).abs(), -(to.1 - y0).abs());
        let (sx, sy) = (
            if x0 < to.0 { 1 } else { -1 },
            if y0 < to.1 { 1 } else { -1 },
        );
        let mut err = dx + dy;
        let mut step = 0u32;
        loop {
            let on = dash.is_none_or(|(a, b)| step % (a + b) < a);
            if on {
                self.set(x0, y0, c);
            }
            step += 1;
            if (x0, y0) == to {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x0 += sx;
            }
            if e2 <= dx {
                err += dx;
                y0 += sy;
            }
        }
    }

    fn disc(&mut self, cx: i64, cy: i64, r: i64, c: Rgb) {
        for yy in -r..=r {
            for xx in -r..=r {
                if xx * xx + yy * yy <= r * r {
                    self.set(cx + xx, cy + yy, c);
                }
            }
        }
    }

    /// `s` in the 8 × 8 font at `scale`, the glyphs' top row at `top`, placed at `x` by
    /// `anchor`.
    fn text(&mut self, s: &str, x: i64, top: i64, scale: i64, anchor: Anchor, c: Rgb) {
        let n = s.chars().count() as i64;
        let width = n * 8 * scale;
        let left = match anchor {
            Anchor::Start => x,
            Anchor::Middle => x - width / 2,
            Anchor::End => x - width,
        };
        for (i, ch) in s.chars().enumerate() {
            let glyph = glyph(ch);
            for (row, bits) in glyph.iter().enumerate() {
                for col in 0..8 {
                    if bits & (1 << col) != 0 {
                        let gx = left + (i as i64 * 8 + col) * scale;
                        let gy = top + row as i64 * scale;
                        self.fill(gx, gy, gx + scale, gy + scale, c);
                    }
                }
            }
        }
    }

    /// `s` reading upwards, centred on `(x, y_mid)`.
    fn text_up(&mut self, s: &str, x: i64, y_mid: i64, c: Rgb) {
        let n = s.chars().count() as i64;
        let bottom = y_mid + n * 4;
        for (i, ch) in s.chars().enumerate() {
            for (row, bits) in glyph(ch).iter().enumerate() {
                for col in 0..8i64 {
                    if bits & (1 << col) != 0 {
                        // glyph (col, row) -> canvas (x + row, bottom − 8i − col)
                        self.set(x + row as i64, bottom - (i as i64 * 8 + col), c);
                    }
                }
            }
        }
    }

    /// The PNG file: 8-bit RGB, no interlace, every row filter 0.
    fn encode(&self) -> Vec<u8> {
        let mut raw = Vec::with_capacity(H * (1 + 3 * W));
        for row in self.px.chunks(W) {
            raw.push(0);
            for p in row {
                raw.extend_from_slice(p);
            }
        }
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        // writing into a Vec cannot fail
        let idat = z
            .write_all(&raw)
            .and_then(|_| z.finish())
            .unwrap_or_default();
        let mut ihdr = Vec::with_capacity(13);
        ihdr.extend_from_slice(&(W as u32).to_be_bytes());
        ihdr.extend_from_slice(&(H as u32).to_be_bytes());
        ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
        let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
        for (kind, data) in [(b"IHDR", &ihdr), (b"IDAT", &idat), (b"IEND", &Vec::new())] {
            out.extend_from_slice(&(data.len() as u32).to_be_bytes());
            let mut crc = crc32fast::Hasher::new();
            crc.update(kind);
            crc.update(data);
            out.extend_from_slice(kind);
            out.extend_from_slice(data);
            out.extend_from_slice(&crc.finalize().to_be_bytes());
        }
        out
    }
}

/// `s` cut to the canvas width in the plain-size font (an ellipsis marks the cut).
fn fit(s: &str) -> String {
    let max = W / 8 - 2;
    match s.chars().count() <= max {
        true => s.to_string(),
        false => s.chars().take(max - 3).chain("...".chars()).collect(),
    }
}

/// The 8 × 8 glyph of `ch` (bit `c` of row `r` is pixel `(c, r)`); `?` outside ASCII.
fn glyph(ch: char) -> [u8; 8] {
    let i = if ch.is_ascii() {
        ch as usize
    } else {
        '?' as usize
    };
    font8x8::legacy::BASIC_LEGACY[i]
}

/// The PNG bytes of `field`'s reliability diagram (`label`: what was evaluated).
pub fn reliability_png(field: &str, m: &FieldMetrics, label: &str) -> Vec<u8> {
    let mut cv = Canvas::new();
    let mid = (W / 2) as i64;
    let title = format!("Reliability of field \"{field}\" (N = {})", m.n);
    // twice the size where it fits, else the plain size, cut to the canvas
    let scale = if title.chars().count() * 16 <= W - 16 {
        2
    } else {
        1
    };
    cv.text(&fit(&title), mid, 10, scale, Anchor::Middle, BLACK);
    cv.text(&summary(m, " - "), mid, 34, 1, Anchor::Middle, BLACK);
    cv.text(&fit(label), mid, 48, 1, Anchor::Middle, GREY);
    // grid and ticks
    for t in 0..=10 {
        let v = t as f64 / 10.0;
        cv.line((x(0.0), y(v)), (x(1.0), y(v)), GRID, None);
        let tick = format!("{v:.1}");
        cv.text(&tick, x(0.0) - 6, y(v) - 4, 1, Anchor::End, BLACK);
        cv.text(&tick, x(v), y(0.0) + 8, 1, Anchor::Middle, BLACK);
    }
    // bars, counts and mean-confidence dots
    for b in &m.reliability_equal_width.bins {
        let Some(acc) = b.accuracy else { continue };
        let (x0, x1) = (x(b.lower) + 1, (x(b.upper) - 1).max(x(b.lower) + 2));
        cv.fill(x0, y(acc), x1, y(0.0), BAR);
        let n = format!("n={}", b.count);
        cv.text(&n, (x0 + x1) / 2, y(acc) - 11, 1, Anchor::Middle, BLACK);
        if let Some(c) = b.mean_confidence {
            cv.disc(x(c), y(acc), 3, DOT);
        }
    }
    // the diagonal and the frame on top
    cv.line((x(0.0), y(0.0)), (x(1.0), y(1.0)), DIAGONAL, Some((6, 4)));
    let (l, r, t, btm) = (x(0.0), x(1.0), y(1.0), y(0.0));
    for (a, b) in [
        ((l, t), (r, t)),
        ((r, t), (r, btm)),
        ((r, btm), (l, btm)),
        ((l, btm), (l, t)),
    ] {
        cv.line(a, b, BLACK, None);
    }
    cv.text(X_TITLE, x(0.5), y(0.0) + 24, 1, Anchor::Middle, BLACK);
    cv.text_up(Y_TITLE, LEFT as i64 - 56, y(0.5), BLACK);
    // legend
    let ly = y(0.0) + 40;
    cv.fill(LEFT as i64, ly, LEFT as i64 + 12, ly + 10, BAR);
    cv.text(
        BARS_LEGEND,
        LEFT as i64 + 16,
        ly + 1,
        1,
        Anchor::Start,
        BLACK,
    );
    cv.disc(LEFT as i64 + 258, ly + 5, 3, DOT);
    cv.text(
        "mean confidence",
        LEFT as i64 + 258,
        ly + 1,
        1,
        Anchor::Start,
        BLACK,
    );
    cv.line(
        (LEFT as i64 + 396, ly + 5),
        (LEFT as i64 + 416, ly + 5),
        DIAGONAL,
        Some((6, 4)),
    );
    cv.text(
        "calibrated",
        LEFT as i64 + 420,
        ly + 1,
        1,
        Anchor::Start,
        BLACK,
    );
    cv.encode()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chunks of a PNG file: (type, data), each CRC checked.
    fn chunks(png: &[u8]) -> Vec<([u8; 4], Vec<u8>)> {
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "signature");
        let mut out = Vec::new();
        let mut at = 8;
        while at < png.len() {
            let len = u32::from_be_bytes(png[at..at + 4].try_into().unwrap()) as usize;
            let kind: [u8; 4] = png[at + 4..at + 8].try_into().unwrap();
            let data = png[at + 8..at + 8 + len].to_vec();
            let crc = u32::from_be_bytes(png[at + 8 + len..at + 12 + len].try_into().unwrap());
            let mut h = crc32fast::Hasher::new();
            h.update(&kind);
            h.update(&data);
            assert_eq!(
                h.finalize(),
                crc,
                "CRC of {}",
                String::from_utf8_lossy(&kind)
            );
            out.push((kind, data));
            at += 12 + len;
        }
        out
    }

    /// A field whose confident items are all right and whose unsure ones are half right.
    fn metrics() -> FieldMetrics {
        use crate::eval::metrics::{field_metrics, Scored};
        let mut items = Vec::new();
        for i in 0..20 {
            items.push(Scored {
                truth: 0,
                predicted: 0,
                probabilities: vec![0.95, 0.05],
            });
            items.push(Scored {
                truth: i % 2,
                predicted: 0,
                probabilities: vec![0.55, 0.45],
            });
        }
        field_metrics(&items, 2, 10).expect("metrics")
    }

    #[test]
    fn the_png_is_well_formed_and_draws_the_bars() {
        use std::io::Read;
        let m = metrics();
        let png = reliability_png("topic", &m, "tiny model @ demo");
        let chunks = chunks(&png);
        let kinds: Vec<&[u8; 4]> = chunks.iter().map(|(k, _)| k).collect();
        assert_eq!(kinds, [b"IHDR", b"IDAT", b"IEND"]);
        let ihdr = &chunks[0].1;
        assert_eq!(u32::from_be_bytes(ihdr[0..4].try_into().unwrap()), W as u32);
        assert_eq!(u32::from_be_bytes(ihdr[4..8].try_into().unwrap()), H as u32);
        assert_eq!(&ihdr[8..], &[8, 2, 0, 0, 0]);
        let mut raw = Vec::new();
        flate2::read::ZlibDecoder::new(&chunks[1].1[..])
            .read_to_end(&mut raw)
            .expect("inflate");
        assert_eq!(raw.len(), H * (1 + 3 * W));
        let px = |cx: i64, cy: i64| -> Rgb {
            let at = cy as usize * (1 + 3 * W) + 1 + 3 * cx as usize;
            [raw[at], raw[at + 1], raw[at + 2]]
        };
        assert!(
            (0..H).all(|r| raw[r * (1 + 3 * W)] == 0),
            "filter 0 on every row"
        );
        assert_eq!(px(2, 2), WHITE);
        // the bin 0.9–1.0 is all right: its bar fills the plot's top right cell
        assert_eq!(px(x(0.93), y(0.5)), BAR);
        // the bin 0.5–0.6 is half right: bar below 0.5, none above 0.6
        assert_eq!(px(x(0.52), y(0.25)), BAR);
        assert_ne!(px(x(0.52), y(0.8)), BAR);
        // no bar where no item falls (0.1–0.2)
        assert!((y(0.9)..y(0.1)).all(|yy| px(x(0.15), yy) != BAR));
        // the title is drawn: dark pixels in its band
        assert!((10..26).any(|yy| (0..W as i64).any(|xx| px(xx, yy) == BLACK)));
        // a field name outside ASCII is drawn, not refused
        assert!(!reliability_png("thème – ü", &m, "").is_empty());
    }

    #[test]
    fn a_line_reaches_both_ends_and_a_dash_leaves_gaps() {
        let mut cv = Canvas::new();
        cv.line((10, 10), (40, 25), BLACK, None);
        assert_eq!(cv.px[10 * W + 10], BLACK);
        assert_eq!(cv.px[25 * W + 40], BLACK);
        let mut dashed = Canvas::new();
        dashed.line((10, 50), (109, 50), BLACK, Some((6, 4)));
        let on = (10..110)
            .filter(|&c| dashed.px[50 * W + c] == BLACK)
            .count();
        assert_eq!(on, 60, "6 on, 4 off over 100 pixels");
    }

    #[test]
    fn text_draws_the_glyph_bits_and_stands_in_for_non_ascii() {
        let mut cv = Canvas::new();
        cv.text("A", 0, 0, 1, Anchor::Start, BLACK);
        let a = glyph('A');
        for (r, bits) in a.iter().enumerate() {
            for c in 0..8 {
                let want = if bits & (1 << c) != 0 { BLACK } else { WHITE };
                assert_eq!(cv.px[r * W + c], want, "pixel ({c}, {r})");
            }
        }
        assert_eq!(glyph('é'), glyph('?'));
        assert_ne!(glyph('A'), glyph('?'));
    }
}
