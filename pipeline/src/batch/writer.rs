//! The last stage: output lines in (in input order, one message per finished group), appended
//! to the output file and flushed after every message, so a crash loses at most the group in
//! flight — and `--resume` cuts a torn last line. Also drives the progress bar (stderr, only
//! when it is a terminal and the job is not `--quiet`): lines done, rows/s, ETA. With
//! `--allowed-mass` it also keeps every scored field's allowed mass (8 bytes per field; reused
//! decisions are not counted again) for the job's min / median summary.

use super::prepare::OutLine;
use crossbeam_channel::Receiver;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::time::Instant;

/// What the writer wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Written {
    pub lines: u64,
    pub errors: u64,
    pub rows: u64,
    /// The allowed masses of the scored fields (only with `--allowed-mass`).
    pub allowed_mass: Option<MassSummary>,
}

/// Min and median of the allowed masses of a job's scored fields.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MassSummary {
    pub fields: u64,
    pub min: f64,
    /// The middle value (the mean of the two middle values for an even count).
    pub median: f64,
}

impl MassSummary {
    /// None for no values.
    pub fn of(mut masses: Vec<f64>) -> Option<MassSummary> {
        if masses.is_empty() {
            return None;
        }
        masses.sort_by(f64::total_cmp);
        let n = masses.len();
        let median = if n % 2 == 1 {
            masses[n / 2]
        } else {
            (masses[n / 2 - 1] + masses[n / 2]) / 2.0
        };
        Some(MassSummary {
            fields: n as u64,
            min: masses[0],
            median,
        })
    }
}

/// True when a progress bar would be drawn: not `quiet` and stderr is a terminal.
pub fn progress_shown(quiet: bool) -> bool {
    !quiet && std::io::stderr().is_terminal()
}

/// A progress bar on stderr, hidden unless [`progress_shown`].
pub fn progress_bar(quiet: bool, total: Option<u64>, already: u64) -> ProgressBar {
    if !progress_shown(quiet) {
        return ProgressBar::hidden();
    }
    let bar = match total {
        Some(t) => ProgressBar::with_draw_target(Some(t), ProgressDrawTarget::stderr()),
        None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
    };
    let style = ProgressStyle::with_template("{bar:30} {pos}/{len} lines  {msg}  ETA {eta}")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_position(already);
    bar
}

/// Write every message from `rx` to `out`, flushing after each. Stops at the first write error.
pub fn write_all(
    rx: &Receiver<Vec<OutLine>>,
    out: &mut impl Write,
    bar: &ProgressBar,
) -> std::io::Result<Written> {
    let mut w = Written::default();
    let mut masses: Vec<f64> = Vec::new();
    let start = Instant::now();
    for batch in rx {
        for line in &batch {
            masses.extend_from_slice(&line.allowed_masses);
            out.write_all(line.text.as_bytes())?;
            out.write_all(b"\n")?;
            w.lines += 1;
            w.errors += u64::from(line.is_error);
            w.rows += line.rows as u64;
        }
        out.flush()?;
        bar.inc(batch.len() as u64);
        let secs = start.elapsed().as_secs_f64().max(1e-9);
        bar.set_message(format!(
            "{:.1} rows/s, {} errors",
            w.rows as f64 / secs,
            w.errors
        ));
    }
    bar.finish_and_clear();
    w.allowed_mass = MassSummary::of(masses);
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::MassSummary;

    #[test]
    fn mass_summary_has_the_min_and_the_median() {
        assert_eq!(MassSummary::of(Vec::new()), None);
        let odd = MassSummary::of(vec![0.9, 0.1, 0.5]).unwrap();
        assert_eq!((odd.fields, odd.min, odd.median), (3, 0.1, 0.5));
        let even = MassSummary::of(vec![0.9, 0.2, 0.4, 1.0]).unwrap();
        assert_eq!((even.min, even.median), (0.2, 0.65));
    }
}
