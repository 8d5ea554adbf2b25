//! `forkscore serve`: load the model once, then answer HTTP requests (see the
//! `forkscore-service` crate) until Ctrl-C / SIGTERM; requests in flight finish first.

use crate::input_bounds::{check_flags, check_float_flag};
use crate::load::{self, ModelArgs};
use anyhow::{Context, Result};
use forkscore_engine::DEFAULT_MAX_INPUT_TOKENS;
use forkscore_service::{AppState, ServeConfig};
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to bind (loopback by default; bind 0.0.0.0 only behind your own access control).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port (0: any free port; the chosen address is printed).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Token bound of every prompt (a request may lower it, never raise it).
    #[arg(long, default_value_t = DEFAULT_MAX_INPUT_TOKENS)]
    pub max_input_tokens: usize,
    /// Largest request body, in MiB.
    #[arg(long, default_value_t = 4)]
    pub max_body_mib: usize,
    /// Most contexts in one /v1/decide_many request.
    #[arg(long, default_value_t = 256)]
    pub max_contexts_per_request: usize,
    /// Requests waiting for the model; a full queue answers 503.
    #[arg(long, default_value_t = 1024)]
    pub queue_capacity: usize,
    /// Most contexts merged into one scoring call across concurrent requests.
    #[arg(long, default_value_t = 256)]
    pub max_merged_contexts: usize,
    /// Seconds a request may wait for its result (then 504).
    #[arg(long, default_value_t = 60.0)]
    pub request_timeout_s: f64,
    #[command(flatten)]
    pub group: crate::group_args::GroupBudgetArgs,
    /// Trust the contexts' special-token text (see `forkscore score --help`).
    #[arg(long)]
    pub context_special_tokens: bool,
}

pub fn run(args: &ServeArgs) -> Result<()> {
    check_flags(&[
        ("--max-input-tokens", Some(args.max_input_tokens)),
        ("--prefill-chunk", args.model.prefill_chunk),
        ("--group-max-rows", args.group.group_max_rows),
        (
            "--group-max-prefix-tokens",
            args.group.group_max_prefix_tokens,
        ),
        ("--group-max-mib", args.group.group_max_mib),
    ])?;
    check_float_flag(
        "--device-memory-gib",
        args.group.device_memory_gib,
        (1u64 << 20) as f64,
    )?;
    for (flag, v, max) in [
        ("--max-body-mib", args.max_body_mib, 1024),
        (
            "--max-contexts-per-request",
            args.max_contexts_per_request,
            1 << 16,
        ),
        ("--queue-capacity", args.queue_capacity, 1 << 20),
        ("--max-merged-contexts", args.max_merged_contexts, 1 << 16),
    ] {
        anyhow::ensure!(
            (1..=max).contains(&v),
            "{flag} {v} is out of range: it must be between 1 and {max}"
        );
    }
    anyhow::ensure!(
        args.request_timeout_s.is_finite()
            && args.request_timeout_s > 0.0
            && args.request_timeout_s <= 86_400.0,
        "--request-timeout-s {} must be a number of seconds in (0, 86400]",
        args.request_timeout_s
    );
    let loaded = load::open(&args.model)?;
    let engine = loaded
        .engine
        .with_context_special_tokens(args.context_special_tokens);
    let budget = args
        .group
        .budget(args.model.device, &engine.memory_model())?;
    let config = ServeConfig {
        max_body_bytes: args.max_body_mib << 20,
        max_contexts_per_request: args.max_contexts_per_request,
        max_input_tokens: args.max_input_tokens,
        queue_capacity: args.queue_capacity,
        max_merged_contexts: args.max_merged_contexts,
        request_timeout: Duration::from_secs_f64(args.request_timeout_s),
        budget,
        eos_ids: forkscore_engine::generate::eos_ids_from_folder(
            &engine.backend().checkpoint().dir,
        ),
        ..ServeConfig::default()
    };
    let model = match serde_json::to_value(&loaded.provenance)? {
        serde_json::Value::Object(m) => m,
        other => anyhow::bail!("model provenance serialized to {other}, not an object"),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let (state, model_thread) =
        AppState::start(engine, model, config).context("cannot start the model thread")?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("cannot bind {}:{}", args.host, args.port))?;
        let addr = listener.local_addr()?;
        eprintln!("forkscore serving on http://{addr}/ (Ctrl-C to stop)");
        forkscore_service::serve(listener, state, shutdown_signal())
            .await
            .context("server failed")
    })?;
    model_thread
        .join()
        .map_err(|_| anyhow::anyhow!("the model thread panicked"))?;
    eprintln!("forkscore serve: stopped");
    Ok(())
}

/// Ctrl-C, or SIGTERM on Unix (what Kubernetes and systemd send).
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}
