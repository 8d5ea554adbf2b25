//! forkscore over HTTP: the engine behind `forkscore serve`.
//!
//! Why axum + tokio: the scoring itself is a blocking, CPU/GPU-bound call that must stay on one
//! thread owning the model, while the HTTP side must hold many slow clients, time them out and
//! shut down gracefully. tokio gives the async side (timeouts, signals, bounded channels that a
//! blocking thread can read), and axum is the thinnest typed router on hyper for it (no macros,
//! handlers are plain async functions). Under the router, [`server`] runs each connection on
//! hyper itself (header/body/idle timeouts, a connection cap, a shutdown deadline) and
//! [`guard`] refuses requests whose `Host` or `Origin` is not this server's.
//!
//! Flow: request body (bounded bytes) → [`request`] (strict JSON, one validated type per
//! endpoint; bad input is a 4xx [`error::ApiError`] naming the JSON path and the rule) →
//! [`queue`] (bounded; a single model thread drains every pending job, merges jobs that share a
//! schema and options into one `Engine::decide_many` call, so the engine's group planner and the
//! batch memory budget decide the context groups) → the `forkscore score` JSON (built by the
//! front ends' one result builder, `forkscore_frontend::result`) → response. [`metrics`] counts
//! it all for `/metrics`, [`logging`] writes a line per request; [`routes`] wires the endpoints.

pub mod api_types;
pub mod config;
pub mod error;
pub mod guard;
pub mod job;
pub mod logging;
pub mod metrics;
pub mod openai;
pub mod openapi;
pub mod presets;
pub mod queue;
pub mod request;
pub mod router;
pub mod routes;
pub mod scheduler;
pub mod schemas;
pub mod server;

pub use config::ServeConfig;
pub use router::router;
pub use routes::AppState;
pub use server::serve;
