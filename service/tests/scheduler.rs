//! The continuous-batching scheduler of the model thread: each step decides the first group of
//! the oldest waiting context's bucket; requests admitted between steps join later groups;
//! every answer equals the request decided alone; failures and abandoned requests stay local.

mod common;

use common::engine_on;
use forkscore_engine::{Decision, EngineError, GroupBudget, Schema, ScoreOptions};
use forkscore_service::metrics::Metrics;
use forkscore_service::queue::Job;
use forkscore_service::scheduler::Scheduler;
use forkscore_testkit::fake::FakeBackend;
use serde_json::json;
use std::sync::Arc;
use tokio::sync::oneshot;

type Reply = oneshot::Receiver<Vec<Result<Decision, EngineError>>>;

fn schema(field: &str) -> Schema {
    Schema::from_value(&json!({
        field: {"type": "enum", "choices": ["low", "high"], "description": "Risk."},
        "urgent": {"type": "boolean"}
    }))
    .unwrap()
}

fn job(
    engine: &forkscore_engine::Engine<FakeBackend>,
    schema: &Schema,
    contexts: &[&str],
) -> (Job, Reply) {
    let (tx, rx) = oneshot::channel();
    let job = Job {
        compiled: Arc::new(engine.compile(schema).unwrap()),
        contexts: contexts.iter().map(|c| c.to_string()).collect(),
        options: ScoreOptions::default(),
        prepared: None,
        reply: tx,
    };
    (job, rx)
}

fn values(d: &[Result<Decision, EngineError>]) -> Vec<serde_json::Value> {
    d.iter()
        .map(|r| match r {
            Ok(d) => serde_json::to_value(&d.fields).unwrap(),
            Err(e) => json!({"error": e.to_string()}),
        })
        .collect()
}

#[test]
fn each_step_decides_one_group_oldest_first_and_late_requests_join_later_groups() {
    let engine = engine_on(FakeBackend::new(1));
    let metrics = Metrics::default();
    // two rows per context, at most four rows per group: two contexts per step
    let budget = GroupBudget {
        max_rows: 4,
        ..GroupBudget::default()
    };
    let mut s = Scheduler::new(&engine, budget);
    let risk = schema("risk");
    let (a, mut ra) = job(&engine, &risk, &["alpha one", "alpha two", "alpha three"]);
    s.admit(a);
    assert_eq!(s.pending_contexts(), 3);
    assert_eq!(s.step(&metrics), 2, "first group: the two oldest contexts");
    assert!(
        ra.try_recv().is_err(),
        "not answered before all its contexts are decided"
    );
    // a request arriving now joins the next group with the remaining oldest context
    let (b, mut rb) = job(&engine, &risk, &["beta"]);
    s.admit(b);
    assert_eq!(s.step(&metrics), 2);
    let got_a = ra.try_recv().expect("request a answered");
    let got_b = rb.try_recv().expect("request b answered");
    assert!(s.is_idle());
    let compiled = engine.compile(&risk).unwrap();
    let alone = |c: &str| {
        vec![Ok(engine
            .decide(c, &compiled, &ScoreOptions::default())
            .unwrap())]
    };
    let want_a: Vec<_> = ["alpha one", "alpha two", "alpha three"]
        .iter()
        .flat_map(|c| alone(c))
        .collect();
    assert_eq!(values(&got_a), values(&want_a));
    assert_eq!(values(&got_b), values(&alone("beta")));
}

#[test]
fn buckets_are_served_oldest_first_and_failures_stay_with_their_context() {
    let engine = engine_on(FakeBackend::new(2));
    let metrics = Metrics::default();
    let mut s = Scheduler::new(&engine, GroupBudget::default());
    let (a, mut ra) = job(&engine, &schema("risk"), &["first", "", "third"]);
    let (b, mut rb) = job(&engine, &schema("impact"), &["other schema"]);
    s.admit(a);
    s.admit(b);
    // the empty context failed to prepare: two contexts of `a`, one of `b` wait
    assert_eq!(s.pending_contexts(), 3);
    assert_eq!(s.step(&metrics), 2, "the oldest bucket (schema of a) first");
    let got = ra.try_recv().expect("a answered");
    assert!(got[0].is_ok() && got[1].is_err() && got[2].is_ok());
    assert!(rb.try_recv().is_err());
    assert_eq!(s.step(&metrics), 1);
    assert!(rb.try_recv().expect("b answered")[0].is_ok());
    assert_eq!(s.step(&metrics), 0, "nothing left");
}

#[test]
fn an_abandoned_request_is_not_scored() {
    let engine = engine_on(FakeBackend::new(3));
    let metrics = Metrics::default();
    let mut s = Scheduler::new(&engine, GroupBudget::default());
    let (a, ra) = job(&engine, &schema("risk"), &["gone", "also gone"]);
    s.admit(a);
    drop(ra);
    assert_eq!(s.step(&metrics), 0);
    assert!(s.is_idle());
}

#[test]
fn contexts_prepared_by_the_handler_decide_as_those_the_model_thread_prepares() {
    let engine = engine_on(FakeBackend::new(4));
    let metrics = Metrics::default();
    let contexts = ["first context", "", "third context"];
    let mut answers = Vec::new();
    for handler_prepares in [false, true] {
        let mut s = Scheduler::new(&engine, GroupBudget::default());
        let (mut j, mut rx) = job(&engine, &schema("risk"), &contexts);
        if handler_prepares {
            j.prepared = Some(forkscore_service::scheduler::prepare_contexts(
                &engine,
                &j.contexts,
                &j.compiled,
                &j.options,
            ));
        }
        s.admit(j);
        assert_eq!(
            s.pending_contexts(),
            2,
            "the empty context failed to prepare"
        );
        while s.step(&metrics) > 0 {}
        let got = rx.try_recv().expect("answered");
        assert!(got[0].is_ok() && got[1].is_err() && got[2].is_ok());
        answers.push(values(&got));
    }
    assert_eq!(answers[0], answers[1]);
}
