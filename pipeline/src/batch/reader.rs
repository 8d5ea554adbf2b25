//! Stage 0, reading: the input JSONL file in, chunks of raw lines out (bytes, not yet decoded,
//! so an invalid UTF-8 line becomes an error record instead of stopping the job).
//!
//! Invariants: line numbers are 1-based physical lines; blank (whitespace-only) lines are
//! skipped and produce no record; a trailing `\r` is dropped; lines up to the resume point are
//! passed on marked `done` (their ids still count for duplicate detection) and never scored.
//! Memory: one chunk of at most `chunk_lines` lines at a time per channel slot.

use crossbeam_channel::Sender;
use std::io::BufRead;

pub use forkscore_frontend::batch::item::RawLine;

/// Read `input` and send chunks of lines to `out`. Returns the number of physical lines read,
/// or stops early (Ok) when the receiver hung up. Lines are unbounded; the batch job uses
/// [`read_lines_bounded`].
pub fn read_lines(
    input: impl BufRead,
    chunk_lines: usize,
    done_through: u64,
    out: &Sender<Vec<RawLine>>,
) -> std::io::Result<u64> {
    read_lines_bounded(input, chunk_lines, done_through, u64::MAX, out)
}

/// [`read_lines`] storing at most `max_line_bytes` of any line: a longer line is passed on as
/// `too_long` with only its first `LEADING_BYTES` (its rest is skipped, not stored).
pub fn read_lines_bounded(
    input: impl BufRead,
    chunk_lines: usize,
    done_through: u64,
    max_line_bytes: u64,
    out: &Sender<Vec<RawLine>>,
) -> std::io::Result<u64> {
    read_input(input, chunk_lines, done_through, max_line_bytes, out).map(|end| end.lines)
}

/// Where reading stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadEnd {
    /// Physical lines read.
    pub lines: u64,
    /// Non-blank lines among them (each becomes a record when its shard owns it).
    pub records: u64,
    /// True when the input was read to its end (false: the receiver hung up first).
    pub complete: bool,
}

impl ReadEnd {
    /// The input was not read to its end.
    fn interrupted(self) -> ReadEnd {
        ReadEnd {
            complete: false,
            ..self
        }
    }
}

/// [`read_lines_bounded`], also saying how many lines were non-blank and whether the input was
/// read to its end (what a batch job's completion marker records).
pub fn read_input(
    mut input: impl BufRead,
    chunk_lines: usize,
    done_through: u64,
    max_line_bytes: u64,
    out: &Sender<Vec<RawLine>>,
) -> std::io::Result<ReadEnd> {
    use crate::input_bounds::{read_line_bounded, LineRead, MAX_SKIP_BYTES};
    let mut line = 0u64;
    let mut records = 0u64;
    // never pre-allocate from the caller's number
    let mut chunk = Vec::new();
    let mut bytes = Vec::new();
    loop {
        if crate::batch::interrupt::requested() {
            // Ctrl-C: stop reading; what was read is still scored and written
            return Ok(ReadEnd {
                lines: line,
                records,
                complete: chunk.is_empty() || out.send(chunk).is_ok(),
            }
            .interrupted());
        }
        let too_long =
            match read_line_bounded(&mut input, &mut bytes, max_line_bytes, MAX_SKIP_BYTES)? {
                LineRead::Eof => break,
                LineRead::Line => None,
                LineRead::TooLong(n) => Some(n),
            };
        line += 1;
        if too_long.is_some() {
            bytes.truncate(crate::input_bounds::LEADING_BYTES);
        }
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
        if line == 1 && bytes.starts_with(b"\xEF\xBB\xBF") {
            // a UTF-8 byte-order mark (editors on Windows write one) is not part of the JSON
            bytes.drain(..3);
        }
        if too_long.is_none() && bytes.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        records += 1;
        chunk.push(RawLine {
            line,
            bytes: std::mem::take(&mut bytes),
            done: line <= done_through,
            too_long,
        });
        if chunk.len() >= chunk_lines && out.send(std::mem::take(&mut chunk)).is_err() {
            return Ok(ReadEnd {
                lines: line,
                records,
                complete: false,
            });
        }
    }
    let complete = chunk.is_empty() || out.send(chunk).is_ok();
    Ok(ReadEnd {
        lines: line,
        records,
        complete,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_keep_line_numbers_and_skip_blank_lines() {
        let (tx, rx) = crossbeam_channel::bounded(8);
        let input = b"a\r\n\n  \nb\nc\xff\nd" as &[u8];
        let end = read_input(input, 2, 4, u64::MAX, &tx).unwrap();
        assert_eq!(
            end,
            ReadEnd {
                lines: 6,
                records: 4,
                complete: true
            }
        );
        drop(tx);
        let lines: Vec<RawLine> = rx.iter().flatten().collect();
        let got: Vec<(u64, &[u8], bool)> = lines
            .iter()
            .map(|l| (l.line, l.bytes.as_slice(), l.done))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, &b"a"[..], true),
                (4, b"b", true),
                (5, b"c\xff", false),
                (6, b"d", false)
            ]
        );
    }
}
