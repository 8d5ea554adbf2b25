//! The last stage: output lines in (in input order, one message per finished group), appended
//! to the output file and flushed after every message, so a crash loses at most the group in
//! flight — and `--resume` cuts a torn last line. Also drives the progress bar (stderr, only
//! when it is a terminal and the job is not `--quiet`): lines done, rows/s, ETA.

use super::prepare::OutLine;
use crossbeam_channel::Receiver;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::time::Instant;

/// What the writer wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Written {
    pub lines: u64,
    pub errors: u64,
    pub rows: u64,
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
    let start = Instant::now();
    for batch in rx {
        for line in &batch {
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
    Ok(w)
}
