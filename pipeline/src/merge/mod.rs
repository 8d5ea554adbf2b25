//! `forkscore merge`: join the outputs of the N jobs of `forkscore batch --shard I/N` into the
//! one file an unsharded run would have written — every record once, in input-line order, with
//! `provenance.shard` removed.
//!
//! A shard is merged only with its completion marker (`SHARD.done.json`, see
//! [`crate::batch::done`]), which its job writes when it finishes cleanly and removes before it
//! touches the output again. Refused, naming the file:
//! - a shard without a valid marker (interrupted, still running, or not a batch output), or
//!   whose size or record count differs from what its marker says (changed after its job);
//! - markers that disagree: shard count, input (SHA-256, lines, non-blank lines), provenance
//!   (model, revision, dtype, mode, temperature, default schema…); two files of the same shard;
//!   a number of files other than the shard count;
//! - a record that is not a JSON object with a `line` and its marker's `provenance.shard`;
//!   records out of line order; a record of a line its shard does not own or past the input's
//!   end; the same input line or the same id in two shards; an incomplete last record;
//! - records that do not cover the input: all shards' records must add up to the input's
//!   non-blank lines (every marker records them); with `--input FILE` ([`coverage`]) the file
//!   must be the input the shards read (SHA-256, lines) and each of its non-blank lines must
//!   have exactly one record.
//!
//! The merged file is written under a locked temporary name next to `--output` and renamed into
//! place, so a failed merge leaves nothing; the temporaries of killed merges are removed by the
//! next merge into that folder ([`temp`]).

pub mod coverage;
pub mod temp;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::{Map, Value};

use crate::batch::done::{self, DoneError, DoneMarker, InputFacts};
use crate::batch::lock::{LockError, OutputLock};
use crate::batch::openai::{record_id, record_line, record_provenance_mut};
use crate::batch::shard::{id_key, Shard};
use crate::input_bounds::{read_line_bounded, LineRead};
use coverage::{Gap, InputCursor};

/// A record line longer than this is refused (batch records are a few KiB).
const MAX_RECORD_BYTES: u64 = 64 << 20;

#[derive(Debug, clap::Args)]
pub struct MergeArgs {
    /// The merged JSONL (refused if it exists and is not empty, unless --force).
    #[arg(long)]
    pub output: PathBuf,
    /// Overwrite an existing --output.
    #[arg(long)]
    pub force: bool,
    /// The input file the shards read: also check that it is that file (SHA-256) and that each
    /// of its non-blank lines has exactly one record.
    #[arg(long, value_name = "FILE")]
    pub input: Option<PathBuf>,
    /// The outputs of `forkscore batch --shard I/N`, one per shard, in any order (each with its
    /// completion marker SHARD_OUTPUT.done.json next to it).
    #[arg(required = true, value_name = "SHARD_OUTPUT")]
    pub shards: Vec<PathBuf>,
}

/// What a merge did.
#[derive(Debug, Clone, PartialEq)]
pub struct MergeSummary {
    /// Records written.
    pub records: u64,
    /// Temporary files of killed merges removed from the output's folder.
    pub stale_removed: Vec<PathBuf>,
}

/// One parsed record of a shard file.
struct Record {
    line: u64,
    id: Value,
    shard: Shard,
    /// The record with `provenance.shard` removed.
    value: Value,
    /// Provenance without `shard` and `schema_hash`: what every record of a job shares.
    base: Map<String, Value>,
}

/// A shard file being read in order, with what its marker vouches for.
struct ShardFile {
    path: PathBuf,
    reader: BufReader<File>,
    buf: Vec<u8>,
    /// Physical line of the file (for messages).
    at: u64,
    last_line: u64,
    /// Records read so far.
    records: u64,
    done: DoneMarker,
    shard: Shard,
}

/// `path`'s marker, or why the shard cannot be merged.
fn shard_marker(path: &Path) -> Result<DoneMarker> {
    let done = match done::read(path) {
        Ok(d) => d,
        Err(DoneError::Missing { .. }) if matches!(OutputLock::probe(path), Err(LockError::Busy { .. })) => bail!(
            "{} is still being written by a running batch job (it holds the output's lock): wait for that job to finish, then merge",
            path.display()
        ),
        Err(e) => return Err(e.into()),
    };
    let len = std::fs::metadata(path)
        .with_context(|| format!("cannot open {}", path.display()))?
        .len();
    if len != done.output_bytes {
        bail!(
            "{} has {len} bytes but its completion marker {} says {}: the file changed after its job finished (appended to, cut or replaced); run its `forkscore batch` command again with --resume",
            path.display(),
            done::marker_path(path).display(),
            done.output_bytes
        );
    }
    Ok(done)
}

impl ShardFile {
    fn open(path: &Path) -> Result<Self> {
        if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
            bail!("{} is not a regular file", path.display());
        }
        let f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let done = shard_marker(path)?;
        let shard = done.shard.with_context(|| {
            format!(
                "{}: its completion marker has no \"shard\": is this the output of `batch --shard`?",
                path.display()
            )
        })?;
        Ok(ShardFile {
            path: path.to_path_buf(),
            reader: BufReader::with_capacity(1 << 20, f),
            buf: Vec::new(),
            at: 0,
            last_line: 0,
            records: 0,
            done,
            shard,
        })
    }

    /// The next record, `None` at the end (where the count must be the marker's).
    fn next(&mut self) -> Result<Option<Record>> {
        loop {
            let read = read_line_bounded(&mut self.reader, &mut self.buf, MAX_RECORD_BYTES, 0)
                .with_context(|| format!("reading {}", self.path.display()))?;
            self.at += 1;
            let where_ = || format!("{} line {}", self.path.display(), self.at);
            match read {
                LineRead::Eof => {
                    if self.records != self.done.records {
                        bail!(
                            "{} holds {} records but its completion marker says {}: the file changed after its job finished; run its `forkscore batch` command again with --resume",
                            self.path.display(),
                            self.records,
                            self.done.records
                        );
                    }
                    return Ok(None);
                }
                LineRead::TooLong(n) => {
                    bail!("{}: a record of {n} bytes is not a batch record", where_())
                }
                LineRead::Line => {}
            }
            if self.buf.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let record: Value = serde_json::from_slice(&self.buf).with_context(|| {
                format!(
                    "{}: not a complete JSON record (an interrupted shard: finish it with `forkscore batch --resume` first)",
                    where_()
                )
            })?;
            let rec = parse_record(record).with_context(where_)?;
            self.check(&rec).with_context(where_)?;
            self.last_line = rec.line;
            self.records += 1;
            return Ok(Some(rec));
        }
    }

    /// A record belongs in this file: its shard, line order, ownership, the input's extent.
    fn check(&self, rec: &Record) -> Result<()> {
        if rec.shard != self.shard {
            bail!(
                "a record of shard {} in a file whose completion marker says shard {}",
                rec.shard,
                self.shard
            );
        }
        if rec.line <= self.last_line {
            bail!(
                "input line {} after line {}: records are out of order",
                rec.line,
                self.last_line
            );
        }
        if rec.line > self.done.input.lines {
            bail!(
                "a record of input line {} but the input had {} lines",
                rec.line,
                self.done.input.lines
            );
        }
        let id = (!rec.id.is_null()).then_some(&rec.id);
        if !self.shard.owns(rec.line, id) {
            let count = self.shard.count();
            let owner = (0..count)
                .find(|&i| Shard::new(i, count).is_ok_and(|s| s.owns(rec.line, id)))
                .unwrap_or(count);
            bail!(
                "input line {} (id {}) belongs to shard {owner}/{count}, not to this file's shard {}",
                rec.line,
                rec.id,
                self.shard
            );
        }
        Ok(())
    }
}

fn parse_record(mut record: Value) -> Result<Record> {
    if !record.is_object() {
        bail!("a record must be a JSON object");
    }
    // native records and OpenAI-shaped ones (`--format openai`) alike
    let line = record_line(&record).context("a record must have a positive integer \"line\"")?;
    let id = record_id(&record);
    let prov =
        record_provenance_mut(&mut record).context("a record must have a \"provenance\" object")?;
    let shard: Shard = prov
        .remove("shard")
        .and_then(|v| v.as_str().map(str::to_string))
        .context(
            "the record's provenance has no \"shard\": is this the output of `batch --shard`?",
        )?
        .parse()?;
    let mut base = prov.clone();
    base.remove("schema_hash");
    Ok(Record {
        line,
        id,
        shard,
        value: record,
        base,
    })
}

/// The markers of all files describe the shards of one job over one input: returns that
/// input's facts.
fn check_markers(
    files: &[ShardFile],
    base: &mut Option<(Map<String, Value>, PathBuf)>,
) -> Result<InputFacts> {
    let first = &files[0];
    let mut by_index: HashMap<u32, &Path> = HashMap::new();
    for f in files {
        if let Some(other) = by_index.insert(f.shard.index(), &f.path) {
            bail!(
                "{} and {} are both shard {}",
                other.display(),
                f.path.display(),
                f.shard
            );
        }
        if f.shard.count() != first.shard.count() {
            bail!(
                "{} is a shard of {} but {} a shard of {}",
                f.path.display(),
                f.shard.count(),
                first.path.display(),
                first.shard.count()
            );
        }
        let (a, b) = (&f.done.input, &first.done.input);
        if (&a.sha256, a.lines, a.records) != (&b.sha256, b.lines, b.records) {
            bail!(
                "{} and {} were made from different inputs (their completion markers say input SHA-256 {} with {} lines, {} non-blank, and SHA-256 {} with {} lines, {} non-blank)",
                f.path.display(),
                first.path.display(),
                a.sha256,
                a.lines,
                a.records,
                b.sha256,
                b.lines,
                b.records
            );
        }
        check_base(base, &f.done.provenance, &f.path)?;
    }
    let n = first.shard.count();
    if files.len() != n as usize {
        let mut missing: Vec<u32> = (0..n).filter(|i| !by_index.contains_key(i)).collect();
        missing.truncate(16);
        bail!(
            "the job has {n} shards but {} files were given (shards missing: {missing:?}; an empty shard output still counts as a file)",
            files.len()
        );
    }
    Ok(first.done.input.clone())
}

/// Merge; returns the number of records written. See [`merge_with`].
pub fn merge(shards: &[PathBuf], output: &Path, force: bool) -> Result<u64> {
    Ok(merge_with(shards, output, force, None)?.records)
}

/// Merge the shard outputs `shards` into `output`; with `input`, also check the records
/// against the input file itself.
pub fn merge_with(
    shards: &[PathBuf],
    output: &Path,
    force: bool,
    input: Option<&Path>,
) -> Result<MergeSummary> {
    if shards.is_empty() {
        bail!("give the shard outputs to merge");
    }
    for s in shards {
        if crate::batch::lock::same_file(s, output) {
            bail!("--output {} is one of the shard files", output.display());
        }
    }
    if input.is_some_and(|i| crate::batch::lock::same_file(i, output)) {
        bail!("--output {} is the --input file", output.display());
    }
    let non_empty = std::fs::metadata(output)
        .map(|m| m.len() > 0)
        .unwrap_or(false);
    if non_empty && !force {
        bail!(
            "--output {} exists: choose another path or pass --force",
            output.display()
        );
    }
    let stale_removed = temp::remove_stale(temp::folder_of(output));
    let mut files = shards
        .iter()
        .map(|p| ShardFile::open(p))
        .collect::<Result<Vec<_>>>()?;
    let mut base: Option<(Map<String, Value>, PathBuf)> = None;
    let facts = check_markers(&files, &mut base)?;
    let mut cursor = input
        .map(|p| {
            InputCursor::open(p).with_context(|| format!("cannot open --input {}", p.display()))
        })
        .transpose()?;

    // first records: the heap holds each file's next record line
    let mut heap = BinaryHeap::new();
    let mut pending: Vec<Option<Record>> = Vec::with_capacity(files.len());
    for (i, f) in files.iter_mut().enumerate() {
        let first = f.next()?;
        if let Some(r) = &first {
            check_base(&mut base, &r.base, &f.path)?;
            heap.push(Reverse((r.line, i)));
        }
        pending.push(first);
    }

    let tmp = temp::create(output)
        .with_context(|| format!("cannot create a file next to {}", output.display()))?;
    let mut out = BufWriter::new(tmp.as_file());
    let mut ids: HashMap<u128, (u64, usize)> = HashMap::new();
    let mut last: Option<(u64, usize)> = None;
    let mut written = 0u64;
    while let Some(Reverse((line, i))) = heap.pop() {
        let r = pending[i]
            .take()
            .context("merge: a queued record vanished")?;
        if let Some((prev, j)) = last {
            if prev == line {
                bail!(
                    "input line {line} has a record in both {} and {}",
                    files[j].path.display(),
                    files[i].path.display()
                );
            }
        }
        if !r.id.is_null() {
            if let Some((l, j)) = ids.insert(id_key(&r.id), (line, i)) {
                if j != i {
                    bail!(
                        "id {} is in {} (line {l}) and {} (line {line}): these files are not shards of one job",
                        r.id,
                        files[j].path.display(),
                        files[i].path.display()
                    );
                }
            }
        }
        if let Some(c) = cursor.as_mut() {
            let advanced = c
                .advance_to(line)
                .with_context(|| format!("reading --input {}", c.path.display()))?;
            if let Err(gap) = advanced {
                return Err(input_error(cursor.take(), &facts, gap));
            }
        }
        serde_json::to_writer(&mut out, &r.value)?;
        out.write_all(b"\n")?;
        written += 1;
        last = Some((line, i));
        if let Some(next) = files[i].next()? {
            check_base(&mut base, &next.base, &files[i].path)?;
            heap.push(Reverse((next.line, i)));
            pending[i] = Some(next);
        }
    }
    if let Some(c) = cursor {
        let path = c.path.clone();
        let end = c
            .finish()
            .with_context(|| format!("reading --input {}", path.display()))?;
        check_input(&path, &end.sha256, end.lines, &facts)?;
        if let Some(line) = end.missing {
            bail!(
                "input line {line} of {} has no record in any shard",
                path.display()
            );
        }
    }
    if written != facts.records {
        bail!(
            "the shards hold {written} records but their input has {} non-blank lines: {} lines have no record",
            facts.records,
            facts.records.saturating_sub(written)
        );
    }
    out.flush()?;
    drop(out);
    tmp.as_file().sync_all()?;
    tmp.persist(output)
        .with_context(|| format!("cannot write {}", output.display()))?;
    Ok(MergeSummary {
        records: written,
        stale_removed,
    })
}

/// `--input` is the file the shards read (their markers' SHA-256 and line count).
fn check_input(path: &Path, sha256: &str, lines: u64, facts: &InputFacts) -> Result<()> {
    if sha256 != facts.sha256 || lines != facts.lines {
        bail!(
            "--input {} is not the input the shards read: it has SHA-256 {sha256} and {lines} lines, their completion markers say SHA-256 {} and {} lines",
            path.display(),
            facts.sha256,
            facts.lines
        );
    }
    Ok(())
}

/// The error for a gap between the records and `--input`: the input being another file, when
/// it is, else the gap itself.
fn input_error(cursor: Option<InputCursor>, facts: &InputFacts, gap: Gap) -> anyhow::Error {
    let Some(c) = cursor else {
        return anyhow::anyhow!("merge: the --input reader vanished");
    };
    let path = c.path.clone();
    match c.finish() {
        Err(e) => anyhow::Error::new(e).context(format!("reading --input {}", path.display())),
        Ok(end) => match check_input(&path, &end.sha256, end.lines, facts) {
            Err(e) => e,
            Ok(()) => match gap {
                Gap::Missing { line } => anyhow::anyhow!(
                    "input line {line} of {} has no record in any shard",
                    path.display()
                ),
                Gap::PastEnd { line, lines } => anyhow::anyhow!(
                    "a shard has a record of input line {line} but {} has {lines} lines",
                    path.display()
                ),
            },
        },
    }
}

fn check_base(
    seen: &mut Option<(Map<String, Value>, PathBuf)>,
    base: &Map<String, Value>,
    path: &Path,
) -> Result<()> {
    match seen {
        None => *seen = Some((base.clone(), path.to_path_buf())),
        Some((b, p)) if b != base => {
            let differs: std::collections::BTreeSet<&String> = b
                .keys()
                .chain(base.keys())
                .filter(|k| b.get(*k) != base.get(*k))
                .collect();
            bail!(
                "{} and {} come from different runs (provenance differs in {differs:?})",
                p.display(),
                path.display()
            )
        }
        Some(_) => {}
    }
    Ok(())
}

/// `forkscore merge`.
pub fn run(args: &MergeArgs) -> Result<()> {
    let summary = merge_with(
        &args.shards,
        &args.output,
        args.force,
        args.input.as_deref(),
    )?;
    for p in &summary.stale_removed {
        eprintln!(
            "forkscore merge: removed {}, the temporary file of a merge that did not finish",
            p.display()
        );
    }
    eprintln!(
        "forkscore merge: {} records from {} shard outputs into {}{}",
        summary.records,
        args.shards.len(),
        args.output.display(),
        args.input.as_ref().map_or(String::new(), |i| format!(
            " (every non-blank line of {} has its record)",
            i.display()
        )),
    );
    Ok(())
}
