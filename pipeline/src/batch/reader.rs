//! Stage 0, reading: the input JSONL file in, chunks of raw lines out (bytes, not yet decoded,
//! so an invalid UTF-8 line becomes an error record instead of stopping the job).
//!
//! Invariants: line numbers are 1-based physical lines; blank (whitespace-only) lines are
//! skipped and produce no record; a trailing `\r` is dropped; lines up to the resume point are
//! passed on marked `done` (their ids still count for duplicate detection) and never scored.
//! Memory: one chunk of at most `chunk_lines` lines at a time per channel slot.

use crossbeam_channel::Sender;
use std::io::BufRead;

/// One physical input line.
#[derive(Debug, Clone)]
pub struct RawLine {
    pub line: u64,
    pub bytes: Vec<u8>,
    /// Already in the output (resume): parse its id, score nothing.
    pub done: bool,
}

/// Read `input` and send chunks of lines to `out`. Returns the number of physical lines read,
/// or stops early (Ok) when the receiver hung up.
pub fn read_lines(
    mut input: impl BufRead,
    chunk_lines: usize,
    done_through: u64,
    out: &Sender<Vec<RawLine>>,
) -> std::io::Result<u64> {
    let mut line = 0u64;
    let mut chunk = Vec::with_capacity(chunk_lines);
    loop {
        let mut bytes = Vec::new();
        if input.read_until(b'\n', &mut bytes)? == 0 {
            break;
        }
        line += 1;
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
        }
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
        if line == 1 && bytes.starts_with(b"\xEF\xBB\xBF") {
            // a UTF-8 byte-order mark (editors on Windows write one) is not part of the JSON
            bytes.drain(..3);
        }
        if bytes.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        chunk.push(RawLine {
            line,
            bytes,
            done: line <= done_through,
        });
        if chunk.len() >= chunk_lines
            && out
                .send(std::mem::replace(
                    &mut chunk,
                    Vec::with_capacity(chunk_lines),
                ))
                .is_err()
        {
            return Ok(line);
        }
    }
    if !chunk.is_empty() {
        let _ = out.send(chunk);
    }
    Ok(line)
}

/// Count non-blank lines of a file quickly (for the progress bar's length).
pub fn count_lines(path: &std::path::Path) -> std::io::Result<u64> {
    let mut reader = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(path)?);
    let mut n = 0u64;
    let mut bytes = Vec::new();
    loop {
        bytes.clear();
        if reader.read_until(b'\n', &mut bytes)? == 0 {
            return Ok(n);
        }
        if !bytes.iter().all(u8::is_ascii_whitespace) {
            n += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_keep_line_numbers_and_skip_blank_lines() {
        let (tx, rx) = crossbeam_channel::bounded(8);
        let input = b"a\r\n\n  \nb\nc\xff\nd" as &[u8];
        assert_eq!(read_lines(input, 2, 4, &tx).unwrap(), 6);
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
