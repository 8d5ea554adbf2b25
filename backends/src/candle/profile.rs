//! Opt-in timing of where a forward pass spends its time, by layer kind (`FORKSCORE_PROFILE=1`
//! in the environment, or [`set_enabled`] — the modes bench profiles one extra run per case).
//!
//! GPU work is asynchronous, so each timed region synchronises the device before and after it:
//! the figures are exact per region but the whole run is slower than without profiling (the
//! launch queue never runs ahead). Off by default, and then a region costs one relaxed check.
//!
//! Regions: `embed`, `attention` / `linear_attention` (the token mixers), `mlp`, `head`; the
//! caller reads and clears the totals with [`take`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use candle_core::Device;

/// 0: not decided yet (read `FORKSCORE_PROFILE` on first use), 1: off, 2: on.
static STATE: AtomicU8 = AtomicU8::new(0);

/// Whether profiling is on: [`set_enabled`], else `FORKSCORE_PROFILE` set to something other
/// than `0`.
pub fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        0 => {
            let on = crate::switches::value("FORKSCORE_PROFILE").is_some_and(|v| v != "0");
            STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
        s => s == 2,
    }
}

/// Switch profiling on or off for the whole process.
pub fn set_enabled(on: bool) {
    STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

/// Accumulated time of one region.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RegionTotal {
    /// Times the region ran.
    pub calls: u64,
    /// Wall time inside it, device synchronised at both ends.
    pub total: Duration,
}

fn totals() -> &'static Mutex<BTreeMap<&'static str, RegionTotal>> {
    static T: OnceLock<Mutex<BTreeMap<&'static str, RegionTotal>>> = OnceLock::new();
    T.get_or_init(|| Mutex::new(BTreeMap::new()))
}

/// Run `f` as region `name`: timed (device synchronised around it) when profiling is on.
pub fn region<T>(name: &'static str, device: &Device, f: impl FnOnce() -> T) -> T {
    if !enabled() {
        return f();
    }
    // A failed synchronisation only blurs the figure; the computation's own errors still surface.
    let _ = device.synchronize();
    let start = Instant::now();
    let out = f();
    let _ = device.synchronize();
    let spent = start.elapsed();
    if let Ok(mut t) = totals().lock() {
        let e = t.entry(name).or_default();
        e.calls += 1;
        e.total += spent;
    }
    out
}

/// The totals so far, by region name, and a reset.
pub fn take() -> BTreeMap<&'static str, RegionTotal> {
    totals()
        .lock()
        .map(|mut t| std::mem::take(&mut *t))
        .unwrap_or_default()
}
