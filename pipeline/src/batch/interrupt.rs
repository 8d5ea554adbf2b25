//! Ctrl-C (SIGINT) during a batch job: the first one asks the job to stop after the group in
//! flight (the reader stops reading, the scorer stops after its current group, the writer
//! flushes what was scored), so the output ends on a complete record and the CLI can say how
//! many lines were written and that `--resume` continues; a second Ctrl-C exits at once.
//!
//! The handler runs on tokio's signal support (already a dependency of `serve`) in a thread
//! of its own, installed only once the model has loaded: Ctrl-C during a load still ends the
//! process the default way.

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// True once Ctrl-C was pressed during a job.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// Mark the job interrupted (what the signal handler does; tests call it directly).
pub fn request() {
    REQUESTED.store(true, Ordering::SeqCst);
}

/// Install the handler (once per process). A failure to install it leaves the default
/// behaviour (the process ends at Ctrl-C without the hint) and is not an error.
pub fn install() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(install_unix);
}

#[cfg(unix)]
fn install_unix() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
    else {
        return;
    };
    // registered here, before install() returns, so a Ctrl-C right after it is seen
    let mut sigint = {
        let _entered = runtime.enter();
        match signal(SignalKind::interrupt()) {
            Ok(s) => s,
            Err(_) => return,
        }
    };
    let _ = std::thread::Builder::new()
        .name("forkscore-sigint".into())
        .spawn(move || {
            runtime.block_on(async move {
                if sigint.recv().await.is_none() {
                    return;
                }
                request();
                eprintln!("forkscore batch: interrupted; finishing the group in flight (Ctrl-C again to stop at once)");
                if sigint.recv().await.is_some() {
                    std::process::exit(130);
                }
            })
        });
}

#[cfg(not(unix))]
fn install_unix() {}
