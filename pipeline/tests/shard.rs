//! `batch --shard I/N` + `forkscore merge`: N sharded jobs merged equal one unsharded job on the
//! example file (duplicates, error lines and all); a shard resumes like any job; merge refuses
//! files that are not the complete shards of one run.

mod common;

use common::{essence, examples, job, records, run};
use forkscore_pipeline::batch::resume::OutputPolicy;
use forkscore_pipeline::batch::shard::Shard;
use forkscore_pipeline::batch::{BatchMode, Job};
use forkscore_pipeline::merge::merge;
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
