//! `batch --shard I/N` + `forkscore merge`: N sharded jobs merged equal one unsharded job on the
//! example file (duplicates, error lines and all); a shard resumes like any job; merge refuses
//! files that are not the complete shards of one run.

mod common;

use common::{essence, examples, job, records, run};
use forkscore_pipeline::batch::done;
use forkscore_pipeline::batch::resume::OutputPolicy;
use forkscore_pipeline::batch::shard::Shard;
use forkscore_pipeline::batch::{BatchMode, Job};
use forkscore_pipeline::merge::{merge, merge_with};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn sharded(input: &Path, dir: &Path, count: u32) -> Vec<PathBuf> {
    (0..count)
        .map(|i| {
            let out = dir.join(format!("shard-{i}.jsonl"));
            run(&Job {
                shard: Some(Shard::new(i, count).unwrap()),
                ..job(input, &out, BatchMode::Grouped)
            });
            out
        })
        .collect()
}

#[test]
fn merged_shards_equal_one_unsharded_run() {
    let dir = tempfile::tempdir().unwrap();
    let input = examples().join("decisions.jsonl");
    let whole = dir.path().join("whole.jsonl");
    run(&job(&input, &whole, BatchMode::Grouped));
    let want: Vec<Value> = records(&whole).iter().map(essence).collect();
    for count in [1u32, 3, 5] {
        let sub = dir.path().join(format!("n{count}"));
        std::fs::create_dir(&sub).unwrap();
        let shards = sharded(&input, &sub, count);
        // every shard took a share, and no line twice
        let lens: Vec<usize> = shards.iter().map(|p| records(p).len()).collect();
        assert_eq!(lens.iter().sum::<usize>(), want.len(), "{count}: {lens:?}");
        let merged = sub.join("merged.jsonl");
        let n = merge(&shards, &merged, false).unwrap();
        assert_eq!(n as usize, want.len());
        let got = records(&merged);
        assert!(got.iter().all(|r| r["provenance"].get("shard").is_none()));
        let got: Vec<Value> = got.iter().map(essence).collect();
        assert_eq!(got, want, "{count} shards");
    }
}

#[test]
fn a_shard_resumes_and_refuses_another_shard() {
    let dir = tempfile::tempdir().unwrap();
    let input = examples().join("decisions.jsonl");
    let shards = sharded(&input, dir.path(), 2);
    let want = records(&shards[1]);
    // cut shard 1 after its third record and resume it
    let text = std::fs::read_to_string(&shards[1]).unwrap();
    let cut: String = text.lines().take(3).map(|l| format!("{l}\n")).collect();
    std::fs::write(&shards[1], cut).unwrap();
    let resume = |shard: Shard| {
        let (e, p) = common::engine();
        forkscore_pipeline::batch::run_job(
            e,
            p,
            &Job {
                shard: Some(shard),
                policy: OutputPolicy::Resume,
                ..job(&input, &shards[1], BatchMode::Grouped)
            },
        )
    };
    let err = resume(Shard::new(0, 2).unwrap()).unwrap_err();
    assert!(format!("{err:#}").contains("shard"), "{err:#}");
    resume(Shard::new(1, 2).unwrap()).unwrap();
    let got = records(&shards[1]);
    assert_eq!(
        got.iter().map(essence).collect::<Vec<_>>(),
        want.iter().map(essence).collect::<Vec<_>>()
    );
}

#[test]
fn merge_refuses_what_is_not_one_complete_run() {
    let dir = tempfile::tempdir().unwrap();
    let input = examples().join("decisions.jsonl");
    let shards = sharded(&input, dir.path(), 3);
    let out = dir.path().join("merged.jsonl");
    let err = |files: &[PathBuf]| format!("{:#}", merge(files, &out, true).unwrap_err());

    let e = err(&shards[..2]);
    assert!(e.contains("3 shards but 2 files"), "{e}");
    let e = err(&[shards[0].clone(), shards[0].clone(), shards[1].clone()]);
    assert!(e.contains("both shard 0/3"), "{e}");
    // an unsharded output is not a shard
    let whole = dir.path().join("whole.jsonl");
    run(&job(&input, &whole, BatchMode::Grouped));
    let e = err(&[whole.clone(), shards[1].clone(), shards[2].clone()]);
    assert!(e.contains("no \"shard\""), "{e}");
    // an interrupted shard (half a record at the end)
    let cut = dir.path().join("cut.jsonl");
    let text = std::fs::read_to_string(&shards[2]).unwrap();
    std::fs::write(&cut, &text[..text.len() / 2]).unwrap();
    let e = err(&[shards[0].clone(), shards[1].clone(), cut]);
    assert!(e.contains("--resume"), "{e}");
    // another run (another temperature) for one shard
    let other = dir.path().join("other.jsonl");
    let mut j = Job {
        shard: Some(Shard::new(2, 3).unwrap()),
        ..job(&input, &other, BatchMode::Grouped)
    };
    j.options.temperature = Some(2.0);
    run(&j);
    let e = err(&[shards[0].clone(), shards[1].clone(), other]);
    assert!(
        e.contains("different runs") && e.contains("temperature"),
        "{e}"
    );
    // the output is never a shard, and an existing output needs --force
    let e = format!("{:#}", merge(&shards, &shards[0], true).unwrap_err());
    assert!(e.contains("is one of the shard files"), "{e}");
    std::fs::write(&out, "x\n").unwrap();
    let e = format!("{:#}", merge(&shards, &out, false).unwrap_err());
    assert!(e.contains("--force"), "{e}");
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "x\n",
        "left as it was"
    );
}

fn marker(out: &Path) -> Value {
    let text = std::fs::read_to_string(done::marker_path(out)).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn write_marker(out: &Path, edit: impl FnOnce(&mut Value)) {
    let mut m = marker(out);
    edit(&mut m);
    std::fs::write(done::marker_path(out), m.to_string()).unwrap();
}

fn merge_temps(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".forkscore-merge."))
        .collect()
}

/// A finished job's marker names its input (SHA-256 of its bytes, physical and non-blank
/// lines), its shard, its record count and size; `--resume` of a finished job keeps it valid.
#[test]
fn a_finished_job_writes_its_marker_and_a_resume_keeps_it_valid() {
    use sha2::{Digest, Sha256};
    let dir = tempfile::tempdir().unwrap();
    let input = examples().join("decisions.jsonl");
    let shards = sharded(&input, dir.path(), 2);
    let bytes = std::fs::read(&input).unwrap();
    let physical =
        bytes.iter().filter(|&&b| b == b'\n').count() as u64 + u64::from(!bytes.ends_with(b"\n"));
    for (i, s) in shards.iter().enumerate() {
        let m = marker(s);
        assert_eq!(m["format"], done::FORMAT);
        assert_eq!(m["shard"], format!("{i}/2"));
        assert_eq!(m["records"], records(s).len() as u64);
        assert_eq!(m["output_bytes"], std::fs::metadata(s).unwrap().len());
        assert_eq!(m["input"]["sha256"], hex::encode(Sha256::digest(&bytes)));
        assert_eq!(m["input"]["lines"], physical);
        assert_eq!(m["input"]["records"], 35, "36 lines, one blank");
        assert!(m["provenance"]["model_id"].is_string() && m["provenance"].get("shard").is_none());
    }
    let before = marker(&shards[1]);
    let (e, p) = common::engine();
    let summary = forkscore_pipeline::batch::run_job(
        e,
        p,
        &Job {
            shard: Some(Shard::new(1, 2).unwrap()),
            policy: OutputPolicy::Resume,
            ..job(&input, &shards[1], BatchMode::Grouped)
        },
    )
    .unwrap();
    assert_eq!(summary.marker, Some(done::marker_path(&shards[1])));
    assert_eq!(marker(&shards[1]), before, "nothing to do: the same marker");
    let merged = dir.path().join("merged.jsonl");
    assert_eq!(
        merge_with(&shards, &merged, false, Some(&input))
            .unwrap()
            .records,
        35
    );
}

/// A shard whose job did not finish has no marker (a job removes it before touching its
/// output) and is refused by name, as is one changed after its marker was written; a resume
/// finishes it and the merge then goes through.
#[test]
fn merge_refuses_unfinished_or_changed_shards_until_resumed() {
    let dir = tempfile::tempdir().unwrap();
    let input = examples().join("decisions.jsonl");
    let shards = sharded(&input, dir.path(), 3);
    let out = dir.path().join("merged.jsonl");
    let err = |files: &[PathBuf]| format!("{:#}", merge(files, &out, true).unwrap_err());
    let name = shards[2].display().to_string();

    // created, then killed before its first record: an empty file without a marker
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    let e = err(&[shards[0].clone(), shards[1].clone(), empty.clone()]);
    assert!(
        e.contains(&empty.display().to_string()) && e.contains("no completion marker"),
        "{e}"
    );

    // cut to whole records (what a kill mid-run leaves), marker still there: the size differs
    let text = std::fs::read_to_string(&shards[2]).unwrap();
    let cut: String = text.lines().take(2).map(|l| format!("{l}\n")).collect();
    std::fs::write(&shards[2], &cut).unwrap();
    let e = err(&shards);
    assert!(
        e.contains(&name) && e.contains("bytes but its completion marker"),
        "{e}"
    );
    // same size, fewer records (a record replaced by blank padding): the count differs
    let mut padded = cut.clone();
    padded.push_str(&" ".repeat(text.len() - cut.len() - 1));
    padded.push('\n');
    std::fs::write(&shards[2], &padded).unwrap();
    let e = err(&shards);
    assert!(
        e.contains(&name) && e.contains("records but its completion marker says"),
        "{e}"
    );

    // --force on a finished output removes its marker first; a job stopped by --fail-fast
    // writes none
    let (eng, prov) = common::engine();
    let summary = forkscore_pipeline::batch::run_job(
        eng,
        prov,
        &Job {
            shard: Some(Shard::new(2, 3).unwrap()),
            policy: OutputPolicy::Force,
            fail_fast: true,
            ..job(&input, &shards[2], BatchMode::Grouped)
        },
    )
    .unwrap();
    assert!(summary.stopped_at_error && summary.marker.is_none());
    assert!(!done::marker_path(&shards[2]).exists());
    let e = err(&shards);
    assert!(e.contains(&name) && e.contains("--resume"), "{e}");

    // --resume finishes it: marker back, merge complete
    let summary = forkscore_pipeline::batch::run_job(
        eng,
        prov,
        &Job {
            shard: Some(Shard::new(2, 3).unwrap()),
            policy: OutputPolicy::Resume,
            ..job(&input, &shards[2], BatchMode::Grouped)
        },
    )
    .unwrap();
    assert!(summary.marker.is_some());
    assert_eq!(merge(&shards, &out, true).unwrap(), 35);
    assert!(merge_temps(dir.path()).is_empty());
}

/// A resume cannot vouch for an output with a hole: the job's owned lines and the output's
/// records must agree before a marker is written.
#[test]
fn a_resume_over_an_output_with_a_hole_writes_no_marker() {
    let dir = tempfile::tempdir().unwrap();
    let input = examples().join("decisions.jsonl");
    let out = dir.path().join("out.jsonl");
    run(&job(&input, &out, BatchMode::Grouped));
    let text = std::fs::read_to_string(&out).unwrap();
    let holed: String = text
        .lines()
        .enumerate()
        .filter(|(i, _)| *i != 3)
        .map(|(_, l)| format!("{l}\n"))
        .collect();
    std::fs::write(&out, holed).unwrap();
    let (e, p) = common::engine();
    let err = forkscore_pipeline::batch::run_job(
        e,
        p,
        &Job {
            policy: OutputPolicy::Resume,
            ..job(&input, &out, BatchMode::Grouped)
        },
    )
    .unwrap_err();
    let err = format!("{err:#}");
    assert!(
        err.contains("owns 35 input lines but the output holds 34 records"),
        "{err}"
    );
    assert!(!done::marker_path(&out).exists());
}

/// Markers that were edited, or that describe different inputs, are refused; `--input` checks
/// the markers against the input itself. A refused merge leaves no temporary file.
#[test]
fn tampered_markers_and_another_input_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let input = examples().join("decisions.jsonl");
    let shards = sharded(&input, dir.path(), 3);
    let out = dir.path().join("merged.jsonl");
    let err =
        |input: Option<&Path>| format!("{:#}", merge_with(&shards, &out, true, input).unwrap_err());
    let pristine: Vec<Value> = shards.iter().map(|s| marker(s)).collect();
    let restore = || {
        for (s, m) in shards.iter().zip(&pristine) {
            std::fs::write(done::marker_path(s), m.to_string()).unwrap();
        }
    };

    // one marker's input line count edited
    write_marker(&shards[1], |m| m["input"]["lines"] = 37.into());
    let e = err(None);
    assert!(
        e.contains("different inputs") && e.contains("37 lines"),
        "{e}"
    );
    restore();
    // one marker's record count edited
    write_marker(&shards[0], |m| {
        m["records"] = (m["records"].as_u64().unwrap() + 1).into()
    });
    let e = err(None);
    assert!(e.contains("records but its completion marker says"), "{e}");
    restore();
    // every marker claims one more non-blank input line: a line without a record
    for s in &shards {
        write_marker(s, |m| m["input"]["records"] = 36.into());
    }
    let e = err(None);
    assert!(
        e.contains("35 records but their input has 36 non-blank lines"),
        "{e}"
    );
    // ... and every marker claims another line count: --input knows better
    for s in &shards {
        write_marker(s, |m| m["input"]["lines"] = 40.into());
    }
    let e = err(Some(&input));
    assert!(e.contains("is not the input the shards read"), "{e}");
    restore();
    // a marker that is not one
    std::fs::write(done::marker_path(&shards[2]), "{\"format\": 1}").unwrap();
    let e = err(None);
    assert!(e.contains("not a valid completion marker"), "{e}");
    restore();

    // another input, a line longer: --input names it
    let other = dir.path().join("other.jsonl");
    let mut text = std::fs::read(&input).unwrap();
    text.extend_from_slice(b"{\"id\": \"extra\", \"context\": \"x\"}\n");
    std::fs::write(&other, &text).unwrap();
    let e = err(Some(&other));
    assert!(e.contains("is not the input the shards read"), "{e}");
    assert!(
        merge_temps(dir.path()).is_empty(),
        "refused merges leave no temporary file"
    );
    assert!(!out.exists());
    assert_eq!(
        merge_with(&shards, &out, true, Some(&input))
            .unwrap()
            .records,
        35
    );
}

/// The temporary file a killed merge left (pattern name, lock free) is removed by the next
/// merge into that folder; one a running merge holds (locked) is not.
#[test]
fn the_next_merge_removes_a_killed_merges_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let input = examples().join("decisions.jsonl");
    let shards = sharded(&input, dir.path(), 2);
    let out = dir.path().join("merged.jsonl");
    let stale = dir.path().join(".merged.jsonl.forkscore-merge.k1lled.tmp");
    std::fs::write(&stale, vec![b'x'; 1 << 20]).unwrap();
    let held_path = dir.path().join(".other.jsonl.forkscore-merge.runnin.tmp");
    let held = std::fs::File::create(&held_path).unwrap();
    held.lock().unwrap();
    let not_ours = dir.path().join(".merged.jsonl.tmp123");
    std::fs::write(&not_ours, "x").unwrap();
    let summary = merge_with(&shards, &out, false, None).unwrap();
    assert_eq!(summary.stale_removed, vec![stale.clone()]);
    assert!(!stale.exists() && held_path.exists() && not_ours.exists());
    assert_eq!(
        merge_temps(dir.path()),
        vec![".other.jsonl.forkscore-merge.runnin.tmp"]
    );
    drop(held);
}
