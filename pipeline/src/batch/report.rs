//! What `forkscore batch` tells the user on stderr when a job ends: the summary (lines, errors
//! by kind, rows, time, allowed mass), the Ctrl-C hint (and exit status 130), the missing
//! completion marker of a non-file output, and the `--fail-fast` stop.

use super::{is_stdio, JobSummary};
use anyhow::{bail, Result};
use std::path::Path;

/// Report `summary` of a job writing `output`; exits with status 130 after an interrupt.
pub fn report(output: &Path, quiet: bool, summary: &JobSummary) -> Result<()> {
    if summary.interrupted {
        let lines = summary.written.lines;
        if is_stdio(output) {
            eprintln!("interrupted: {lines} lines written to stdout; --output - cannot be resumed (write to a file to be able to resume)");
        } else {
            let kept = summary.resumed.as_ref().map_or(0, |r| r.records);
            eprintln!(
                "interrupted: {lines} lines written; rerun with --resume to continue ({} holds {} records)",
                output.display(),
                kept + lines
            );
        }
        std::process::exit(130);
    }
    if !quiet {
        let w = &summary.written;
        let by_kind = if w.errors > 0 {
            format!(": {}", w.errors_by_kind_json())
        } else {
            String::new()
        };
        eprintln!(
            "forkscore batch: {} lines written ({} errors{by_kind}), {} rows in {:.1} s{}",
            w.lines,
            w.errors,
            w.rows,
            summary.seconds,
            summary.resumed.as_ref().map_or(String::new(), |r| format!(
                ", resumed after line {}",
                r.last_line
            )),
        );
        if let Some(m) = w.allowed_mass {
            eprintln!(
                "forkscore batch: allowed mass over {} scored fields: min {:.6}, median {:.6}",
                m.fields, m.min, m.median
            );
        }
    }
    if summary.marker.is_none() && !summary.stopped_at_error && !is_stdio(output) {
        eprintln!(
            "forkscore batch: --output {} is not a regular file, so no completion marker was written next to it (`forkscore merge` accepts only shard outputs that are files with their marker)",
            output.display()
        );
    }
    if summary.stopped_at_error {
        bail!("--fail-fast: stopped at the first failing line (its error record is the output's last line)");
    }
    Ok(())
}
