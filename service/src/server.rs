//! The connection layer under the routes: [`serve`] accepts TCP connections itself and runs each
//! on hyper's HTTP/1 connection, so that no client can hold the server open or lock others out.
//!
//! - **Slow or idle clients.** A request head must arrive complete within
//!   `header_read_timeout` of the connection opening or of the previous response (hyper's header
//!   read timeout, and a per-connection watchdog for the idle time between requests): slow heads,
//!   half-open and idle keep-alive connections are closed. The body has its own bound
//!   (`body_read_timeout`, enforced by the handler: 408).
//! - **Connection cap.** At most `max_connections` are open. One past the cap evicts the
//!   connection that has gone longest without a request in flight; when every open connection
//!   has a request in flight, the newcomer gets a 503 and is closed. So idle clients can never
//!   keep `/health` or a real request out. An accept that fails for want of file descriptors
//!   also evicts the idlest connection.
//! - **Host and Origin.** Every request passes [`RequestGuard`] before any route (403 otherwise).
//! - **Shutdown.** When `shutdown` resolves the listener closes, idle connections close, and
//!   requests in flight may finish for up to `shutdown_deadline`; then every remaining connection
//!   is dropped and [`serve`] returns, so no client holds the process beyond the deadline.

use crate::error::ApiError;
use crate::guard::RequestGuard;
use crate::metrics::Metrics;
use crate::router::router;
use crate::routes::AppState;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use forkscore_seam::Backend;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::ServiceExt;

/// Serve until `shutdown` resolves; requests in flight then finish within the configured
/// shutdown deadline (see the module docs). Fails only if the configured allowed hosts or
/// origins do not parse, or the listener has no local address.
pub async fn serve<B: Backend + 'static>(
    listener: TcpListener,
    state: Arc<AppState<B>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let cfg = &state.config;
    let guard = RequestGuard::new(
        listener.local_addr()?,
        &cfg.allowed_hosts,
        &cfg.allowed_origins,
    )
    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let shared = Arc::new(Shared {
        app: router(state.clone()),
        guard,
        metrics: state.metrics.clone(),
        idle_timeout: cfg.header_read_timeout,
    });
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(cfg.header_read_timeout);
    let registry = Arc::new(Registry::new());
    let refusal = refusal_response();
    let (stop, stopping) = watch::channel(false);
    let mut tasks = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            _ = &mut shutdown => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) if is_connection_error(&e) => continue,
                Err(_) => {
                    // out of file descriptors (or another resource): free the idlest
                    // connection's, then retry after a pause instead of spinning
                    if let Some(victim) = registry.take_idlest() {
                        victim.evict.notify_one();
                        shared.metrics.connection_evicted();
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        if registry.len() >= cfg.max_connections {
            match registry.take_idlest() {
                Some(victim) => {
                    victim.evict.notify_one();
                    shared.metrics.connection_evicted();
                }
                None => {
                    refuse(stream, &refusal);
                    shared.metrics.refused("connections_full");
                    continue;
                }
            }
        }
        let conn = registry.open();
        tasks.spawn(connection(
            stream,
            conn,
            registry.clone(),
            shared.clone(),
            http.clone(),
            stopping.clone(),
        ));
    }
    // stop: no new connections; idle ones close now, busy ones after their response
    drop(listener);
    let _ = stop.send(true);
    let deadline = tokio::time::sleep(cfg.shutdown_deadline);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            next = tasks.join_next() => if next.is_none() { break },
            _ = &mut deadline => {
                tasks.shutdown().await;
                break;
            }
        }
    }
    Ok(())
}

/// What every connection task shares.
struct Shared {
    app: axum::Router,
    guard: RequestGuard,
    metrics: Arc<Metrics>,
    /// A connection without a request in flight for this long is closed.
    idle_timeout: Duration,
}

/// One open connection's state, seen by the accept loop (to pick whom to evict) and its task.
struct Conn {
    id: u64,
    epoch: Instant,
    /// Requests being answered (0 or 1 on HTTP/1).
    in_flight: AtomicUsize,
    /// Milliseconds after `epoch` when the connection last became idle: opened, or a response
    /// produced.
    idle_since_ms: AtomicU64,
    /// Close at once (evicted to admit another connection).
    evict: Notify,
}

impl Conn {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
    /// When the connection will have been idle for `idle` (a request in flight: check again
    /// `idle` from now).
    fn idle_deadline(&self, idle: Duration) -> Instant {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            Instant::now() + idle
        } else {
            self.epoch + Duration::from_millis(self.idle_since_ms.load(Ordering::Acquire)) + idle
        }
    }
    fn idle_for(&self) -> Option<Duration> {
        (self.in_flight.load(Ordering::Acquire) == 0).then(|| {
            Duration::from_millis(
                self.now_ms()
                    .saturating_sub(self.idle_since_ms.load(Ordering::Acquire)),
            )
        })
    }
}

/// A request in flight on `conn`; dropping it marks the connection idle from now.
struct Busy(Arc<Conn>);

impl Busy {
    fn start(conn: Arc<Conn>) -> Busy {
        conn.in_flight.fetch_add(1, Ordering::AcqRel);
        Busy(conn)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0
            .idle_since_ms
            .store(self.0.now_ms(), Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The open connections.
struct Registry {
    epoch: Instant,
    next_id: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Conn>>>,
}

impl Registry {
    fn new() -> Registry {
        Registry {
            epoch: Instant::now(),
            next_id: AtomicU64::new(0),
            open: Mutex::new(HashMap::new()),
        }
    }
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        // inserts and removes only: a panic elsewhere cannot leave the map inconsistent
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn len(&self) -> usize {
        self.lock().len()
    }
    fn open(&self) -> Arc<Conn> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            id,
            epoch: self.epoch,
            in_flight: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(self.epoch.elapsed().as_millis() as u64),
            evict: Notify::new(),
        });
        self.lock().insert(id, conn.clone());
        conn
    }
    fn close(&self, id: u64) {
        self.lock().remove(&id);
    }
    /// Remove and return the connection idle the longest (None when every one is busy).
    fn take_idlest(&self) -> Option<Arc<Conn>> {
        let mut open = self.lock();
        let id = open
            .values()
            .filter(|c| c.in_flight.load(Ordering::Acquire) == 0)
            .min_by_key(|c| c.idle_since_ms.load(Ordering::Acquire))?
            .id;
        open.remove(&id)
    }
}

/// Unregisters its connection however the task ends (finished, evicted, aborted).
struct Registered {
    registry: Arc<Registry>,
    id: u64,
    metrics: Arc<Metrics>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.registry.close(self.id);
        self.metrics.connections_add(-1);
    }
}

async fn connection(
    stream: TcpStream,
    conn: Arc<Conn>,
    registry: Arc<Registry>,
    shared: Arc<Shared>,
    http: http1::Builder,
    mut stopping: watch::Receiver<bool>,
) {
    shared.metrics.connections_add(1);
    let _registered = Registered {
        registry,
        id: conn.id,
        metrics: shared.metrics.clone(),
    };
    let service = {
        let (conn, shared) = (conn.clone(), shared.clone());
        hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
            let busy = Busy::start(conn.clone());
            let shared = shared.clone();
            async move {
                let _busy = busy;
                if let Err(e) = shared.guard.check(req.headers()) {
                    let reason = if e.kind == "forbidden_host" {
                        "host"
                    } else {
                        "origin"
                    };
                    shared.metrics.refused(reason);
                    tracing::warn!(
                        method = %req.method(),
                        path = %req.uri().path(),
                        status = e.status.as_u16(),
                        reason,
                        "refused before routing"
                    );
                    return Ok::<_, Infallible>(e.into_response());
                }
                shared.app.clone().oneshot(req).await
            }
        })
    };
    let http = http.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(http);
    let idle = shared.idle_timeout;
    let mut graceful = false;
    loop {
        let wake = conn.idle_deadline(idle);
        tokio::select! {
            _ = http.as_mut() => return,
            _ = conn.evict.notified() => return,
            _ = stopping.changed(), if !graceful => {
                graceful = true;
                http.as_mut().graceful_shutdown();
            }
            _ = tokio::time::sleep_until(wake) => {
                if conn.idle_for().is_some_and(|t| t >= idle) {
                    return;
                }
            }
        }
    }
}

/// Errors of one incoming connection (the next accept may succeed at once).
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    matches!(
        e.kind(),
        K::ConnectionRefused | K::ConnectionAborted | K::ConnectionReset | K::Interrupted
    )
}

/// The full HTTP/1.1 503 a connection past the cap gets (every open connection busy).
fn refusal_response() -> Vec<u8> {
    let body = ApiError::bad(
        "connections_full",
        "<root>",
        "every connection this server accepts is busy; retry later",
    )
    .with_status(StatusCode::SERVICE_UNAVAILABLE)
    .body()
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Write the refusal without waiting (a fresh socket's send buffer takes it whole) and close.
/// What the client already sent is read off first, so that the close is a FIN the client reads
/// the refusal before, not a reset.
fn refuse(stream: TcpStream, refusal: &[u8]) {
    use std::io::{Read, Write};
    if let Ok(mut s) = stream.into_std() {
        let _ = s.set_nonblocking(true);
        let mut sink = [0u8; 4096];
        let _ = s.read(&mut sink);
        let _ = s.write(refusal);
        let _ = s.shutdown(std::net::Shutdown::Write);
    }
}
