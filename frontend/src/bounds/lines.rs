//! JSONL input lines under a byte bound: a line may have at most three times the context bound
//! (JSON escapes) plus [`LINE_SLACK_BYTES`] for its inline schema ([`max_line_bytes`]); an
//! over-long line is skipped without being stored (in a non-regular input, at most
//! [`MAX_SKIP_BYTES`] of it, then the job stops), keeping only its leading bytes to find its id
//! ([`leading_key`]). The progress bar's total is counted only for a regular input file, on the
//! already-open handle, which is then rewound ([`progress_total`]): a pipe is never read twice.

use super::text::max_context_bytes;
use serde_json::Value;
use std::io::{BufRead, Seek, SeekFrom};

/// Room for a line's id, keys and inline schema on top of its context.
pub const LINE_SLACK_BYTES: u64 = 1 << 20;

/// Most bytes of one over-long line skipped in a non-regular input before the job stops (a
/// regular file is finite, so there the rest of the line is always skipped).
pub const MAX_SKIP_BYTES: u64 = 1 << 30;

/// Most bytes one JSONL input line may have under `max_input_tokens`.
pub fn max_line_bytes(max_input_tokens: usize) -> u64 {
    max_context_bytes(max_input_tokens)
        .saturating_mul(3)
        .saturating_add(LINE_SLACK_BYTES)
}

/// One line read by [`read_line_bounded`].
#[derive(Debug, PartialEq, Eq)]
pub enum LineRead {
    /// End of input.
    Eof,
    /// A line (its bytes in the buffer, without the newline).
    Line,
    /// A line of this many bytes (without the newline), over the bound: the buffer holds
    /// only its first `max` bytes, the rest was skipped.
    TooLong(u64),
}

/// Read one line into `buf` (cleared first), storing at most `max` bytes of it; the rest of an
/// over-long line is consumed without being stored, up to `max_skip` bytes (then an error).
pub fn read_line_bounded(
    input: &mut impl BufRead,
    buf: &mut Vec<u8>,
    max: u64,
    max_skip: u64,
) -> std::io::Result<LineRead> {
    buf.clear();
    let mut total = 0u64;
    let mut any = false;
    loop {
        let chunk = match input.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            break;
        }
        any = true;
        let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (chunk.len(), false),
        };
        let room = max.saturating_sub(buf.len() as u64) as usize;
        buf.extend_from_slice(&chunk[..take.min(room)]);
        total += take as u64;
        input.consume(if done { take + 1 } else { take });
        if done {
            break;
        }
        if total > max.saturating_add(max_skip) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "a line runs past {} bytes without a newline; stopping (lines are limited to {max} bytes)",
                    max.saturating_add(max_skip)
                ),
            ));
        }
    }
    Ok(match (any, total > max) {
        (false, _) => LineRead::Eof,
        (true, false) => LineRead::Line,
        (true, true) => LineRead::TooLong(total),
    })
}

/// How much of an over-long line is kept to find its `"id"` (see [`leading_id`]).
pub const LEADING_BYTES: usize = 4096;

/// The `"id"` of a JSON object line from the line's first bytes alone, when it appears among
/// the leading members before any member whose value is not a complete scalar (string, number,
/// `true`, `false`, `null`) within those bytes: `{"id": "a1", "context": "…megabytes…"}` → `"a1"`.
/// `None` when it cannot be found that way (the error record then has no id).
pub fn leading_id(prefix: &[u8]) -> Option<Value> {
    leading_key(prefix, "id")
}

/// [`leading_id`] for any top-level key (`custom_id` in OpenAI batch lines).
pub fn leading_key(prefix: &[u8], wanted: &str) -> Option<Value> {
    let mut at = 0usize;
    let skip_ws = |at: &mut usize| {
        while prefix.get(*at).is_some_and(u8::is_ascii_whitespace) {
            *at += 1;
        }
    };
    // One complete scalar starting at `at`: its bytes' end.
    let scalar_end = |at: usize| -> Option<usize> {
        match prefix.get(at)? {
            b'"' => {
                let mut i = at + 1;
                loop {
                    match prefix.get(i)? {
                        b'\\' => i += 2,
                        b'"' => return Some(i + 1),
                        _ => i += 1,
                    }
                }
            }
            b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => {
                let len = prefix[at..]
                    .iter()
                    .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'+' | b'.'))
                    .count();
                // a number or literal cut off by the end of the prefix is not complete
                (at + len < prefix.len()).then_some(at + len)
            }
            _ => None,
        }
    };
    skip_ws(&mut at);
    if prefix.get(at) != Some(&b'{') {
        return None;
    }
    at += 1;
    loop {
        skip_ws(&mut at);
        let key_end = scalar_end(at)?;
        let key: String = serde_json::from_slice(&prefix[at..key_end]).ok()?;
        at = key_end;
        skip_ws(&mut at);
        if prefix.get(at) != Some(&b':') {
            return None;
        }
        at += 1;
        skip_ws(&mut at);
        let value_end = scalar_end(at)?;
        let value: Value = serde_json::from_slice(&prefix[at..value_end]).ok()?;
        if key == wanted {
            return Some(value);
        }
        at = value_end;
        skip_ws(&mut at);
        if prefix.get(at) != Some(&b',') {
            return None;
        }
        at += 1;
    }
}

/// The progress bar's total: non-blank lines of a regular input file, counted on `file` (then
/// rewound); `None` for pipes, devices and when no bar is shown. Streams, never holds a line.
pub fn progress_total(file: &mut std::fs::File, shown: bool) -> Option<u64> {
    if !shown || !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut reader = std::io::BufReader::with_capacity(1 << 20, &mut *file);
    let (mut n, mut blank) = (0u64, true);
    loop {
        let chunk = reader.fill_buf().ok()?;
        if chunk.is_empty() {
            break;
        }
        for &b in chunk {
            if b == b'\n' {
                n += u64::from(!blank);
                blank = true;
            } else if !b.is_ascii_whitespace() {
                blank = false;
            }
        }
        let len = chunk.len();
        reader.consume(len);
    }
    n += u64::from(!blank);
    drop(reader);
    file.seek(SeekFrom::Start(0)).ok()?;
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::io::Read;

    #[test]
    fn leading_id_is_found_before_the_first_long_value() {
        let huge = "x".repeat(10_000);
        let cases: Vec<(String, Option<Value>)> = vec![
            (
                format!(r#"{{"id": "a1", "context": "{huge}"}}"#),
                Some(json!("a1")),
            ),
            (
                format!(r#"  {{"n": 3, "ok": true, "id":17,"context":"{huge}"}}"#),
                Some(json!(17)),
            ),
            (
                format!(r#"{{"id": "q\"uote", "context": "{huge}"}}"#),
                Some(json!("q\"uote")),
            ),
            (format!(r#"{{"context": "{huge}", "id": "late"}}"#), None),
            (
                format!(r#"{{"schema": {{"a": 1}}, "id": "x", "c": "{huge}"}}"#),
                None,
            ),
            (format!(r#"["id", "{huge}"]"#), None),
            (r#"{"id": 12"#.to_string(), None),
            (r#"{"id": "unterminated"#.to_string(), None),
            (String::new(), None),
        ];
        for (line, want) in cases {
            let prefix = &line.as_bytes()[..line.len().min(LEADING_BYTES)];
            assert_eq!(leading_id(prefix), want, "{}", &line[..line.len().min(60)]);
        }
    }

    #[test]
    fn bounded_lines_table() {
        // (input, max, expected reads as (kind, stored bytes))
        type Case<'a> = (&'a [u8], u64, &'a [(&'a str, &'a [u8])]);
        let cases: &[Case] = &[
            (
                b"ab\ncd",
                8,
                &[("line", b"ab"), ("line", b"cd"), ("eof", b"")],
            ),
            (
                b"abcdef\nx\n",
                3,
                &[("long6", b"abc"), ("line", b"x"), ("eof", b"")],
            ),
            (b"", 3, &[("eof", b"")]),
            (b"\n\n", 3, &[("line", b""), ("line", b""), ("eof", b"")]),
            (b"abc", 3, &[("line", b"abc"), ("eof", b"")]),
            (b"abcd", 3, &[("long4", b"abc"), ("eof", b"")]),
        ];
        for (input, max, want) in cases {
            let mut r = std::io::BufReader::with_capacity(2, *input);
            let mut buf = Vec::new();
            for (kind, bytes) in *want {
                let got = read_line_bounded(&mut r, &mut buf, *max, u64::MAX).unwrap();
                let k = match got {
                    LineRead::Eof => "eof".to_string(),
                    LineRead::Line => "line".to_string(),
                    LineRead::TooLong(n) => format!("long{n}"),
                };
                assert_eq!((k.as_str(), buf.as_slice()), (*kind, *bytes), "{input:?}");
            }
        }
    }

    #[test]
    fn an_endless_line_stops_at_the_bound() {
        let mut r = std::io::BufReader::new(std::io::repeat(0));
        let mut buf = Vec::new();
        let e = read_line_bounded(&mut r, &mut buf, 100, 1000).unwrap_err();
        assert!(e.to_string().contains("without a newline"), "{e}");
        assert!(buf.len() <= 100);
    }

    #[test]
    fn a_pipe_gets_no_total_and_loses_no_byte() {
        use std::io::Write;
        let (reader, mut writer) = std::io::pipe().unwrap();
        writer.write_all(b"{\"id\":1}\n{\"id\":2}\n").unwrap();
        drop(writer);
        let mut file = std::fs::File::from(std::os::fd::OwnedFd::from(reader));
        assert_eq!(progress_total(&mut file, true), None);
        let mut rest = String::new();
        file.read_to_string(&mut rest).unwrap();
        assert_eq!(rest.lines().count(), 2);
        // a regular file is counted, then rewound
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("in.jsonl");
        std::fs::write(&p, "a\n\n  \nb\nc").unwrap();
        let mut f = std::fs::File::open(&p).unwrap();
        assert_eq!(progress_total(&mut f, true), Some(3));
        let mut all = String::new();
        f.read_to_string(&mut all).unwrap();
        assert_eq!(all, "a\n\n  \nb\nc");
        assert_eq!(progress_total(&mut f, false), None);
    }

    #[test]
    fn the_line_bound_follows_max_input_tokens() {
        assert_eq!(max_line_bytes(4096), 3 * 4096 * 64 + LINE_SLACK_BYTES);
        assert_eq!(max_line_bytes(usize::MAX), u64::MAX);
    }
}
