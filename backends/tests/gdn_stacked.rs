//! The Gated DeltaNet input projections stacked into one product (`fusion::set_gdn_projections`,
//! the CUDA default) against the four separate products, on the CPU f32 backend with a tiny
//! seeded Qwen3.5. Its own test binary: the switch is process-wide and read at load, so no
//! other test may load a model while it is set.

use anyhow::Result;
use forkscore_backends::candle::{fusion, CandleBackend, LoadOptions, ResolvedCheckpoint};
use forkscore_backends::Backend;
use forkscore_testkit::tiny_qwen35::{Qwen35Layout, TinyQwen35};
use forkscore_testkit::tolerance::Tolerance;

fn load(stacked: bool) -> Result<CandleBackend> {
    let dir = TinyQwen35::new(4, Qwen35Layout::TextOnly).ensure()?;
    let ckpt = ResolvedCheckpoint::from_folder(&dir, "tiny-qwen35")?;
    fusion::set_gdn_projections(Some(stacked));
    let backend = CandleBackend::load(&ckpt, &LoadOptions::default());
    fusion::set_gdn_projections(None);
    Ok(backend?)
}

/// The same logits within the f32 tolerance (one GEMM over more columns may sum in another
/// order) on a prompt across a 64-token chunk, for the full forward and for a prefill + fork;
/// the same quantization summary (four projections counted either way).
#[test]
fn stacked_gdn_projections_equal_separate_products() -> Result<()> {
    let (stacked, separate) = (load(true)?, load(false)?);
    assert_eq!(stacked.quant_summary(), separate.quant_summary());
    let prompt: Vec<u32> = (0..90u32)
        .map(|i| 248_045 - 1 - (i * 7919 + 13) % 240_000)
        .collect();
    let candidates = [15u32, 1000, 90_000, 248_044];
    let got = stacked.forward_full(&prompt, &candidates)?;
    let want = separate.forward_full(&prompt, &candidates)?;
    Tolerance::CPU_F32_LOGITS.assert_close("forward_full, stacked vs separate", &got, &want);
    let rows = |b: &CandleBackend| -> Result<Vec<f32>> {
        let state = b.prefill(&prompt[..80])?;
        let states = [&state];
        let rows = [forkscore_backends::ScoreRow {
            state: 0,
            suffix: &prompt[80..],
        }];
        let request = forkscore_backends::ScoreRequest::new(&states, &rows, &candidates)?;
        Ok(b.score(&request)?.data)
    };
    Tolerance::CPU_F32_LOGITS.assert_close(
        "prefill + fork, stacked vs separate",
        &rows(&stacked)?,
        &rows(&separate)?,
    );
    Ok(())
}
