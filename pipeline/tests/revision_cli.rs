//! `--revision` is optional: a local folder without one is recorded as "unlabelled" (its
//! fingerprint identifies it), and ORG/NAME without one resolves the offline cache's
//! `refs/main` and records the commit; a cache without `refs/main` is a clear error.

use forkscore_testkit::tiny_model::{ensure_tiny_model, write_hf_cache, TinySpec};
use serde_json::Value;
use std::process::{Command, Output};

const CONTEXT: &str = "Our production payment service is completely down for every customer.";

fn forkscore(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_forkscore"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("forkscore runs")
}

fn schema() -> String {
    format!(
        "{}/../fixtures/examples/fintech_fraud.json",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn score(model: &str, revision: Option<&str>, env: &[(&str, &str)]) -> Output {
    let schema = schema();
    let mut args = vec!["score", "--model", model];
    if let Some(r) = revision {
        args.extend(["--revision", r]);
    }
    args.extend(["--schema-file", &schema, "--context", CONTEXT]);
    forkscore(&args, env)
}

fn provenance(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "forkscore failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    v["provenance"].clone()
}

#[test]
fn a_local_folder_needs_no_revision_and_is_recorded_as_unlabelled() {
    let model = ensure_tiny_model(&TinySpec::qwen25());
    let m = model.to_str().unwrap();
    let unlabelled = provenance(&score(m, None, &[]));
    assert_eq!(unlabelled["revision"], "unlabelled");
    assert_eq!(unlabelled["source"], "folder");
    let labelled = provenance(&score(m, Some("my-label"), &[]));
    assert_eq!(labelled["revision"], "my-label");
    // the fingerprint is the identity either way
    assert_eq!(unlabelled["fingerprint"], labelled["fingerprint"]);
}

#[test]
fn a_hub_id_without_revision_resolves_refs_main_in_the_offline_cache() {
    let cache = tempfile::tempdir().unwrap();
    let rev = "fedcba9876543210fedcba9876543210fedcba98";
    let snapshot =
        write_hf_cache(cache.path(), "tiny-org/tiny-qwen3", rev, &TinySpec::qwen3()).unwrap();
    let env = [("HF_HUB_CACHE", cache.path().to_str().unwrap())];
    let p = provenance(&score("tiny-org/tiny-qwen3", None, &env));
    assert_eq!(p["revision"], rev, "the resolved commit is recorded");
    assert_eq!(p["source"], "hf_cache");
    assert_eq!(p["model_id"], "tiny-org/tiny-qwen3");

    // refs/main naming something that is not a commit is refused, naming the file
    let main = snapshot
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("refs/main");
    std::fs::write(&main, "main\n").unwrap();
    let out = score("tiny-org/tiny-qwen3", None, &env);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("refs/main") && err.contains("not reproducible"),
        "{err}"
    );

    // no refs/main: a clear error that says to pass --revision; an explicit one still works
    std::fs::remove_file(&main).unwrap();
    let out = score("tiny-org/tiny-qwen3", None, &env);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("no refs/main") && err.contains("--revision"),
        "{err}"
    );
    assert_eq!(
        provenance(&score("tiny-org/tiny-qwen3", Some(rev), &env))["revision"],
        rev
    );
}
