//! `forkscore serve`: load the model once, then answer HTTP requests (see the
//! `forkscore-service` crate) until Ctrl-C / SIGTERM; requests in flight finish first, within
//! `--shutdown-deadline-s`, then the process exits 0.
//!
//! At start the open-file soft limit is raised to the hard limit (each connection holds a file
//! descriptor), and `--max-connections` is lowered to fit under it if needed (both logged).

use crate::input_bounds::{check_flags, check_float_flag};
use crate::load::{self, ModelArgs};
use anyhow::{Context, Result};
use forkscore_engine::DEFAULT_MAX_INPUT_TOKENS;
use forkscore_service::guard::RequestGuard;
use forkscore_service::{AppState, ServeConfig};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// File descriptors kept out of the connection cap: the model's files, the listener, stdio,
/// the runtime's own.
const FD_RESERVE: u64 = 64;

/// How long an idle model thread may take to see the closed queue and end, past the deadline.
const MODEL_THREAD_GRACE: Duration = Duration::from_millis(250);

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
    /// Open connections at most; one past the cap evicts the connection idle the longest (or
    /// gets a 503 when every one has a request in flight). Lowered to fit the open-file limit.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// Seconds a request head may take to arrive, from the connection opening or the previous
    /// response; slow, half-open and idle connections are closed after it.
    #[arg(long, default_value_t = 10.0)]
    pub header_read_timeout_s: f64,
    /// Seconds a request body may take to arrive after its head (then 408).
    #[arg(long, default_value_t = 30.0)]
    pub body_read_timeout_s: f64,
    /// Seconds requests in flight may still take after Ctrl-C / SIGTERM; then every connection
    /// is closed and the process exits 0.
    #[arg(long, default_value_t = 10.0)]
    pub shutdown_deadline_s: f64,
    /// Accept this name in the Host header besides the bound address (repeatable; `*`: any).
    /// Needed to serve under a DNS name or behind a reverse proxy.
    #[arg(long = "allow-host", value_name = "NAME")]
    pub allow_hosts: Vec<String>,
    /// Accept requests from web pages of this origin, e.g. `https://app.example` (repeatable;
    /// `*`: any). By default only the page the server itself serves.
    #[arg(long = "allow-origin", value_name = "ORIGIN")]
    pub allow_origins: Vec<String>,
}

pub fn run(args: &ServeArgs) -> Result<()> {
    // request logs and the service's warnings: stderr, level from RUST_LOG (default info)
    forkscore_service::logging::init()?;
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
        ("--max-connections", args.max_connections, 1 << 20),
    ] {
        anyhow::ensure!(
            (1..=max).contains(&v),
            "{flag} {v} is out of range: it must be between 1 and {max}"
        );
    }
    for (flag, v) in [
        ("--request-timeout-s", args.request_timeout_s),
        ("--header-read-timeout-s", args.header_read_timeout_s),
        ("--body-read-timeout-s", args.body_read_timeout_s),
        ("--shutdown-deadline-s", args.shutdown_deadline_s),
    ] {
        anyhow::ensure!(
            v.is_finite() && v > 0.0 && v <= 86_400.0,
            "{flag} {v} must be a number of seconds in (0, 86400]"
        );
    }
    // the same parse the server does, before the model loads
    RequestGuard::new(
        ([127, 0, 0, 1], args.port).into(),
        &args.allow_hosts,
        &args.allow_origins,
    )
    .map_err(|e| anyhow::anyhow!("--allow-host / --allow-origin: {e}"))?;
    let nofile = raise_open_file_limit();
    let max_connections = match nofile {
        Ok(n) => args.max_connections.min(
            n.saturating_sub(FD_RESERVE)
                .max(1)
                .try_into()
                .unwrap_or(usize::MAX),
        ),
        Err(_) => args.max_connections,
    };
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
        max_connections,
        header_read_timeout: Duration::from_secs_f64(args.header_read_timeout_s),
        body_read_timeout: Duration::from_secs_f64(args.body_read_timeout_s),
        shutdown_deadline: Duration::from_secs_f64(args.shutdown_deadline_s),
        allowed_hosts: args.allow_hosts.clone(),
        allowed_origins: args.allow_origins.clone(),
        prepare_in_handlers: !forkscore_backends::switches::is(
            "FORKSCORE_SERVE_PREPARE",
            "model-thread",
        ),
        ..ServeConfig::default()
    };
    let shutdown_deadline = config.shutdown_deadline;
    let model = loaded.provenance.object()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let (state, model_thread) =
        AppState::start(engine, model, config).context("cannot start the model thread")?;
    // when the stop signal came: the shutdown deadline counts from it
    let stop_at = Arc::new(OnceLock::new());
    let served = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("cannot bind {}:{}", args.host, args.port))?;
        let addr = listener.local_addr()?;
        // one line: the address first (scripts and tests read it from here), then the limits
        let limits = match &nofile {
            Ok(n) => format!(
                "open-file limit {n}, at most {max_connections} connections{}",
                if max_connections < args.max_connections {
                    format!(
                        " (--max-connections {} lowered to fit)",
                        args.max_connections
                    )
                } else {
                    String::new()
                }
            ),
            Err(e) => {
                format!("open-file limit unknown ({e}), at most {max_connections} connections")
            }
        };
        eprintln!("forkscore serving on http://{addr}/ (Ctrl-C to stop; {limits})");
        let stop_at = stop_at.clone();
        let stop = async move {
            shutdown_signal().await;
            let _ = stop_at.set(Instant::now());
        };
        forkscore_service::serve(listener, state, stop)
            .await
            .context("server failed")
    });
    // a schema compile still running on a blocking thread is abandoned, not waited for
    runtime.shutdown_background();
    served?;
    // the model thread ends once it has answered its current call and seen the queue closed;
    // past the deadline (plus a moment for an idle thread to wake) the process exits without it
    // (the call's requester is gone)
    let until = (stop_at.get().copied().unwrap_or_else(Instant::now) + shutdown_deadline)
        .max(Instant::now() + MODEL_THREAD_GRACE);
    while !model_thread.is_finished() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    if model_thread.is_finished() {
        model_thread
            .join()
            .map_err(|_| anyhow::anyhow!("the model thread panicked"))?;
    } else {
        eprintln!(
            "forkscore serve: the model thread was still scoring at the shutdown deadline; exiting without it"
        );
    }
    eprintln!("forkscore serve: stopped");
    Ok(())
}

/// Raise the open-file soft limit to the hard limit; the limit now in force.
#[cfg(unix)]
fn raise_open_file_limit() -> std::io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit through a valid pointer to a local
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads one rlimit through a valid pointer to a local
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit.rlim_cur = limit.rlim_max;
        }
        // refused (macOS refuses an unlimited hard limit): the soft limit stays in force
    }
    #[allow(clippy::unnecessary_cast)] // rlim_t is u64 on Linux, not on every unix
    Ok(limit.rlim_cur as u64)
}

#[cfg(not(unix))]
fn raise_open_file_limit() -> std::io::Result<u64> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "no RLIMIT_NOFILE on this platform",
    ))
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
