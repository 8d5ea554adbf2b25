//! `forkscore merge --input FILE`: the merged records checked against the input itself.
//!
//! The input is streamed once, alongside the merge (records come out in input-line order), and
//! hashed as it is read. Every non-blank line must have a record; a blank (whitespace-only) line
//! may have none — the batch job skips blank lines, except one longer than its line bound, which
//! becomes a `line_too_long` record. "Blank" is the batch reader's rule: ASCII whitespace only,
//! after a UTF-8 byte-order mark on line 1. Memory: one read buffer, whatever the line lengths.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use crate::batch::done::HashingReader;

const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

/// Where the records and the input part ways.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gap {
    /// Input line `line` is not blank and no shard has a record of it.
    Missing { line: u64 },
    /// A record of input line `line`, but the input has only `lines` lines.
    PastEnd { line: u64, lines: u64 },
}

/// What reading the whole input found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputEnd {
    /// SHA-256 (hex) of the input's bytes.
    pub sha256: String,
    /// Physical lines.
    pub lines: u64,
    /// The first non-blank line after the last record (it has no record), if any.
    pub missing: Option<u64>,
}

/// The input, read line by line as the merged records advance.
pub struct InputCursor {
    pub path: PathBuf,
    reader: BufReader<HashingReader<File>>,
    /// Lines read so far.
    line: u64,
}

impl InputCursor {
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let file = File::open(path)?;
        Ok(InputCursor {
            path: path.to_path_buf(),
            reader: BufReader::with_capacity(1 << 20, HashingReader::new(file)),
            line: 0,
        })
    }

    /// The next physical line: `Some(blank)`, or `None` at the end.
    fn next_line(&mut self) -> std::io::Result<Option<bool>> {
        let first = self.line == 0;
        let mut head: Vec<u8> = Vec::with_capacity(BOM.len());
        let mut rest_blank = true;
        let mut any = false;
        loop {
            let chunk = match self.reader.fill_buf() {
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
            for &b in &chunk[..take] {
                if head.len() < BOM.len() {
                    head.push(b);
                } else if !b.is_ascii_whitespace() {
                    rest_blank = false;
                }
            }
            self.reader.consume(if done { take + 1 } else { take });
            if done {
                break;
            }
        }
        if !any {
            return Ok(None);
        }
        self.line += 1;
        let head_blank = (first && head == BOM) || head.iter().all(u8::is_ascii_whitespace);
        Ok(Some(head_blank && rest_blank))
    }

    /// Read up to input line `line`, which has a record: the lines before it that have none
    /// must be blank.
    pub fn advance_to(&mut self, line: u64) -> std::io::Result<Result<(), Gap>> {
        while self.line < line {
            match self.next_line()? {
                None => {
                    return Ok(Err(Gap::PastEnd {
                        line,
                        lines: self.line,
                    }))
                }
                Some(false) if self.line < line => {
                    return Ok(Err(Gap::Missing { line: self.line }))
                }
                Some(_) => {}
            }
        }
        Ok(Ok(()))
    }

    /// Read the rest of the input (its lines have no records).
    pub fn finish(mut self) -> std::io::Result<InputEnd> {
        let mut missing = None;
        while let Some(blank) = self.next_line()? {
            if !blank && missing.is_none() {
                missing = Some(self.line);
            }
        }
        let (sha256, _) = self.reader.into_inner().finish();
        Ok(InputEnd {
            sha256,
            lines: self.line,
            missing,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    fn cursor(dir: &Path, text: &[u8]) -> InputCursor {
        let p = dir.join("in.jsonl");
        std::fs::write(&p, text).unwrap();
        InputCursor::open(&p).unwrap()
    }

    #[test]
    fn blank_lines_need_no_record_and_others_do() {
        let dir = tempfile::tempdir().unwrap();
        let text = b"\xEF\xBB\xBF \r\n{\"id\":1}\n \t\n{\"id\":2}\nx";
        let mut c = cursor(dir.path(), text);
        assert_eq!(c.advance_to(2).unwrap(), Ok(()));
        assert_eq!(c.advance_to(4).unwrap(), Ok(()));
        let end = c.finish().unwrap();
        assert_eq!(end.lines, 5);
        assert_eq!(end.missing, Some(5));
        assert_eq!(end.sha256, hex::encode(Sha256::digest(text)));

        let mut c = cursor(dir.path(), text);
        assert_eq!(c.advance_to(4).unwrap(), Err(Gap::Missing { line: 2 }));
        let mut c = cursor(dir.path(), text);
        assert_eq!(
            c.advance_to(9).unwrap(),
            Err(Gap::Missing { line: 2 }),
            "the first gap is named"
        );
        let mut c = cursor(dir.path(), b"a\n\n");
        assert_eq!(c.advance_to(1).unwrap(), Ok(()));
        assert_eq!(
            c.advance_to(3).unwrap(),
            Err(Gap::PastEnd { line: 3, lines: 2 })
        );
        // a byte-order mark is blank only on line 1
        let mut c = cursor(dir.path(), b"a\n\xEF\xBB\xBF\n");
        assert_eq!(c.advance_to(1).unwrap(), Ok(()));
        assert_eq!(c.finish().unwrap().missing, Some(2));
    }
}
