//! The `forkscore` command line.

use anyhow::Result;
use clap::{Parser, Subcommand};
use forkscore_pipeline::{
    batch, calibrate, demo, eval, generate_cmd, logprobs_cmd, merge, score_cmd, serve_cmd,
};

#[derive(Parser)]
#[command(
    name = "forkscore",
    version,
    about = "Typed JSON decisions with a probability for every choice, from a local LLM checkpoint, without generating text"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Score one context against a schema of enum/boolean fields.
    Score(score_cmd::ScoreArgs),
    /// Write a tiny random-weight demo checkpoint (Hugging Face layout, real tokenizer).
    DemoModel(demo::DemoArgs),
    /// Score a JSONL file of decisions into a JSONL file of results (resumable).
    Batch(batch::BatchArgs),
    /// Join the outputs of `batch --shard I/N` jobs into one file in input order.
    Merge(merge::MergeArgs),
    /// Per-token log-probabilities of a text, with the top-K alternatives at every position.
    Logprobs(logprobs_cmd::LogprobsArgs),
    /// The autoregressive baseline: the model WRITES the JSON answer (greedy, KV cache), which
    /// is validated and compared with forkscore's decision on the same context and schema.
    Generate(generate_cmd::GenerateArgs),
    /// Evaluate on a labelled JSONL file: accuracy, macro-F1, confusion, Brier, log-loss, ECE,
    /// reliability diagrams (SVG), optionally against the generation baseline (resumable).
    Eval(eval::EvalArgs),
    /// Fit a temperature per field on a train split of a labelled JSONL file (optionally
    /// contextual calibration), write a calibration file, report held-out ECE before / after.
    Calibrate(calibrate::CalibrateArgs),
    /// Serve scoring over HTTP (loopback by default): /v1/score, /v1/decide_many, /v1/ask, /health, /metrics, /openapi.json.
    Serve(serve_cmd::ServeArgs),
}

fn main() {
    bound_heap_retention();
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// glibc serves allocations above a threshold from their own maps and returns them on free,
/// but raises that threshold to the size of each such block freed (up to 32 MiB). A load
/// frees many multi-megabyte transients (conversions, packing), so later weights of that size
/// came from the heap beside freed blocks that glibc kept: peak RSS 10–15 % above the weights.
/// A fixed threshold of 4 MiB keeps every large weight in its own map. A threshold the user
/// set (`MALLOC_MMAP_THRESHOLD_`) is left alone.
fn bound_heap_retention() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
        // SAFETY: `mallopt` only changes the allocator's tuning; called once, before any thread
        // starts.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let result = run_command(cli);
    report_profile();
    result
}

/// With `FORKSCORE_PROFILE=1`, where the forward passes of the whole command spent their time,
/// by region (device-synchronised; see the backends' `profile` module), on stderr.
fn report_profile() {
    use forkscore_backends::candle::profile;
    if !profile::enabled() {
        return;
    }
    let regions = profile::take();
    if regions.is_empty() {
        return;
    }
    eprintln!("profile (device-synchronised regions):");
    for (name, t) in regions {
        eprintln!(
            "  {name:<28} {:>8} calls {:>11.1} ms",
            t.calls,
            t.total.as_secs_f64() * 1e3
        );
    }
}

fn run_command(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Score(args) => score_cmd::run(&args),
        Command::DemoModel(args) => demo::run(&args),
        Command::Batch(args) => batch::run(&args),
        Command::Merge(args) => merge::run(&args),
        Command::Logprobs(args) => logprobs_cmd::run(&args),
        Command::Generate(args) => generate_cmd::run(&args),
        Command::Serve(args) => serve_cmd::run(&args),
        Command::Eval(args) => eval::run(&args),
        Command::Calibrate(args) => calibrate::run(&args),
    }
}
