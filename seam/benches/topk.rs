//! Exact top-K + logsumexp per 256-row chunk at vocabulary 248,320: the block-max prefiltered
//! path (`forkscore_seam::topk::top_k`, what the backends run) against the plain path (full
//! log-softmax + full sort, `top_k_reference`), measured side by side in one run, single
//! thread, with a floor beside them: one read pass over the chunk (row maxima) and the
//! logsumexp alone (one `exp` per logit, which both paths must pay).
//!
//! `cargo bench -p forkscore-seam --bench topk --profile dev` (the seam is optimised in the dev
//! profile; this bench lives in the seam crate because it needs nothing but the seam, so it
//! builds in seconds without the tensor library). Env: FORKSCORE_BENCH_REPEATS (default 3). Logits are seeded pseudo-normal
//! (σ ≈ 2.5) with a few peaks per row, like a language model's next-token logits.

use forkscore_seam::topk::{logsumexp, top_k, top_k_reference};
use std::time::Instant;

const VOCAB: usize = 248_320;
const ROWS: usize = 256;

fn chunk() -> Vec<Vec<f32>> {
    let mut s: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..ROWS)
        .map(|_| {
            let mut row: Vec<f32> = (0..VOCAB)
                .map(|_| (next() + next() + next() + next() - 2.0) * 4.3)
                .collect();
            for _ in 0..8 {
                let i = (next() * VOCAB as f32) as usize % VOCAB;
                row[i] = 12.0 + next() * 8.0;
            }
            row
        })
        .collect()
}

fn median_ms(repeats: usize, mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..repeats)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let repeats: usize = std::env::var("FORKSCORE_BENCH_REPEATS")
        .ok()
        .map(|v| v.parse())
        .transpose()?
        .unwrap_or(3);
    let rows = chunk();
    let mut sink = 0f32;
    let read = median_ms(repeats, || {
        for r in &rows {
            sink += r.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        }
    });
    let lse = median_ms(repeats, || {
        for r in &rows {
            sink += logsumexp(r).unwrap_or(0.0);
        }
    });
    println!("| K | block-max top-K + logsumexp (ms / 256 rows) | full log-softmax + sort (ms) | plain ÷ fast | floor: read pass (ms) | floor: logsumexp alone (ms) |");
    println!("|---:|---:|---:|---:|---:|---:|");
    let mut report = Vec::new();
    for k in [1usize, 5, 128] {
        let fast = median_ms(repeats, || {
            for r in &rows {
                sink += top_k(r, k).map(|v| v.logsumexp).unwrap_or(0.0);
            }
        });
        let plain = median_ms(1, || {
            for r in &rows {
                sink += top_k_reference(r, k).map(|v| v.logsumexp).unwrap_or(0.0);
            }
        });
        // the two paths agree bit for bit on this chunk
        for r in rows.iter().take(8) {
            assert_eq!(top_k(r, k)?, top_k_reference(r, k)?);
        }
        println!(
            "| {k} | {fast:.1} | {plain:.1} | {:.1}× | {read:.1} | {lse:.1} |",
            plain / fast
        );
        report.push(format!(
            "{{\"k\": {k}, \"fast_ms\": {fast:.3}, \"plain_ms\": {plain:.3}, \"read_floor_ms\": {read:.3}, \"logsumexp_floor_ms\": {lse:.3}, \"rows\": {ROWS}, \"vocab\": {VOCAB}}}"
        ));
    }
    std::hint::black_box(sink);
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("topk.json"), format!("[{}]\n", report.join(",\n")))?;
    Ok(())
}
