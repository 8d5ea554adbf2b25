//! `forkscore merge`: join the outputs of the N jobs of `forkscore batch --shard I/N` into the
//! one file an unsharded run would have written — every record once, in input-line order, with
//! `provenance.shard` removed.
//!
//! Refused, naming the file and line: a record that is not a JSON object with a `line` and a
//! `provenance.shard`; a file whose records come from two shards or are out of line order; two
//! files of the same shard, shard counts that differ, a number of files other than the shard
//! count; provenance that differs between shards (model, revision, dtype, mode, temperature,
//! default schema…); the same input line or the same id in two shards; an incomplete last
//! record (finish that shard with `batch --resume` first). The merged file is written next to
//! `--output` under a temporary name and renamed into place, so a failed merge leaves nothing.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::{Map, Value};

use crate::batch::shard::{id_key, Shard};
use crate::input_bounds::{read_line_bounded, LineRead};

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
    /// The outputs of `forkscore batch --shard I/N`, one per shard, in any order.
    #[arg(required = true, value_name = "SHARD_OUTPUT")]
    pub shards: Vec<PathBuf>,
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

/// A shard file being read in order.
struct ShardFile {
    path: PathBuf,
    reader: BufReader<File>,
    buf: Vec<u8>,
    /// Physical line of the file (for messages).
    at: u64,
    last_line: u64,
    shard: Option<Shard>,
}

impl ShardFile {
    fn open(path: &Path) -> Result<Self> {
        let f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        Ok(ShardFile {
            path: path.to_path_buf(),
            reader: BufReader::with_capacity(1 << 20, f),
            buf: Vec::new(),
            at: 0,
            last_line: 0,
            shard: None,
        })
    }

    /// The next record, `None` at the end.
    fn next(&mut self) -> Result<Option<Record>> {
        loop {
            let read = read_line_bounded(&mut self.reader, &mut self.buf, MAX_RECORD_BYTES, 0)
                .with_context(|| format!("reading {}", self.path.display()))?;
            self.at += 1;
            let where_ = || format!("{} line {}", self.path.display(), self.at);
            match read {
                LineRead::Eof => return Ok(None),
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
            if let Some(s) = self.shard {
                if s != rec.shard {
                    bail!(
                        "{}: a record of shard {} in a file of shard {s}",
                        where_(),
                        rec.shard
                    );
                }
            }
            if rec.line <= self.last_line {
                bail!(
                    "{}: input line {} after line {}: records are out of order",
                    where_(),
                    rec.line,
                    self.last_line
                );
            }
            self.shard = Some(rec.shard);
            self.last_line = rec.line;
            return Ok(Some(rec));
        }
    }
}

fn parse_record(mut record: Value) -> Result<Record> {
    let obj = record
        .as_object_mut()
        .context("a record must be a JSON object")?;
    let line = obj
        .get("line")
        .and_then(Value::as_u64)
        .context("a record must have a positive integer \"line\"")?;
    let id = obj.get("id").cloned().unwrap_or(Value::Null);
    let prov = obj
        .get_mut("provenance")
        .and_then(Value::as_object_mut)
        .context("a record must have a \"provenance\" object")?;
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

/// Merge; returns the number of records written.
pub fn merge(shards: &[PathBuf], output: &Path, force: bool) -> Result<u64> {
    if shards.is_empty() {
        bail!("give the shard outputs to merge");
    }
    for s in shards {
        if crate::batch::lock::same_file(s, output) {
            bail!("--output {} is one of the shard files", output.display());
        }
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
    let mut files = shards
        .iter()
        .map(|p| ShardFile::open(p))
        .collect::<Result<Vec<_>>>()?;
    // first records: which shard each file is, and the job they come from
    let mut heap = BinaryHeap::new();
    let mut pending: Vec<Option<Record>> = Vec::with_capacity(files.len());
    let mut by_index: HashMap<u32, PathBuf> = HashMap::new();
    let mut count: Option<(u32, PathBuf)> = None;
    let mut base: Option<(Map<String, Value>, PathBuf)> = None;
    for (i, f) in files.iter_mut().enumerate() {
        let first = f.next()?;
        if let Some(r) = &first {
            if let Some(other) = by_index.insert(r.shard.index(), f.path.clone()) {
                bail!(
                    "{} and {} are both shard {}",
                    other.display(),
                    f.path.display(),
                    r.shard
                );
            }
            match &count {
                Some((n, p)) if *n != r.shard.count() => bail!(
                    "{} is a shard of {} but {} a shard of {n}",
                    f.path.display(),
                    r.shard.count(),
                    p.display()
                ),
                Some(_) => {}
                None => count = Some((r.shard.count(), f.path.clone())),
            }
            check_base(&mut base, &r.base, &f.path)?;
            heap.push(Reverse((r.line, i)));
        }
        pending.push(first);
    }
    if let Some((n, _)) = &count {
        if shards.len() != *n as usize {
            let mut missing: Vec<u32> = (0..*n).filter(|i| !by_index.contains_key(i)).collect();
            missing.truncate(16);
            bail!(
                "the job has {n} shards but {} files were given (shards without records: {missing:?}; an empty shard output still counts as a file)",
                shards.len()
            );
        }
    }

    let dir = output.parent().filter(|d| !d.as_os_str().is_empty());
    let tmp = tempfile::NamedTempFile::new_in(dir.unwrap_or(Path::new(".")))
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
    out.flush()?;
    drop(out);
    tmp.as_file().sync_all()?;
    tmp.persist(output)
        .with_context(|| format!("cannot write {}", output.display()))?;
    Ok(written)
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
    let n = merge(&args.shards, &args.output, args.force)?;
    eprintln!(
        "forkscore merge: {n} records from {} shard outputs into {}",
        args.shards.len(),
        args.output.display()
    );
    Ok(())
}
