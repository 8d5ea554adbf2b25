//! The last stage: output lines in (in input order, one message per finished group), appended
//! to the output file and flushed after every message, so a crash loses at most the group in
//! flight — and `--resume` cuts a torn last line. Also drives the progress bar (stderr, only
//! when it is a terminal and the job is not `--quiet`): lines done, rows/s, ETA. With
//! `--allowed-mass` it also keeps every scored field's allowed mass (8 bytes per field; reused
//! decisions are not counted again) for the job's min / median summary.

use super::prepare::OutLine;
use super::records::ErrorKind;
use crossbeam_channel::Receiver;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::Instant;

/// Where the records go: the output file, or stdout (`--output -`).
pub enum Sink {
    File(std::fs::File),
    Stdout(std::io::Stdout),
}

impl Sink {
    /// Make what was written durable (a file's data reaches the disk; stdout has nothing to sync).
    pub fn sync(&self) -> std::io::Result<()> {
        match self {
            Sink::File(f) => f.sync_data(),
            Sink::Stdout(_) => Ok(()),
        }
    }
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Sink::File(f) => f.write(buf),
            Sink::Stdout(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Sink::File(f) => f.flush(),
            Sink::Stdout(s) => s.flush(),
        }
    }
}

/// What the writer wrote.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Written {
    pub lines: u64,
    pub errors: u64,
    /// The error records by kind (`{"invalid_json": 2, "invalid_schema": 1}`).
    pub errors_by_kind: BTreeMap<ErrorKind, u64>,
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
            if let Some(kind) = line.error_kind {
                w.errors += 1;
                *w.errors_by_kind.entry(kind).or_default() += 1;
            }
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

impl Written {
    /// The error counts as a JSON object, kinds in their record spelling.
    pub fn errors_by_kind_json(&self) -> serde_json::Value {
        serde_json::Value::Object(
            self.errors_by_kind
                .iter()
                .map(|(k, n)| (k.as_str().to_string(), (*n).into()))
                .collect(),
        )
    }
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
