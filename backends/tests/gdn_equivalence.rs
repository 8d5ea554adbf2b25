//! Gated DeltaNet equivalence tests on the CPU f32 path:
//! chunked == token-by-token recurrence (core and whole layer, non-zero start states, lengths
//! crossing several chunks, ragged tails), split prefill == one-shot, right padding invariance.

use anyhow::Result;
use candle_core::{DType, Device, Tensor, D};
use forkscore_backends::candle::gated_deltanet::{
    chunked::chunked_gated_delta_rule, recurrence::recurrent_gated_delta_rule, DeltaRule, GdnDims,
    GdnLayer, GdnState, GdnWeights, RightPadding,
};
use proptest::prelude::*;

/// CPU f32 chunked-vs-recurrent and padded-vs-unpadded agreement (brief: ≤ 1e-5).
const TOL: f32 = 1e-5;

/// Deterministic splitmix64 stream of f32 in [lo, hi).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32
    }
    fn tensor(&mut self, shape: &[usize], lo: f32, hi: f32) -> Result<Tensor> {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| lo + (hi - lo) * self.next()).collect();
        Ok(Tensor::from_vec(v, shape, &Device::Cpu)?)
    }
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    Ok(a.sub(b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?)
}

fn l2(x: &Tensor) -> Result<Tensor> {
    Ok(x.broadcast_div(&x.sqr()?.sum_keepdim(D::Minus1)?.sqrt()?)?)
}

struct CoreInputs {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor,
    s0: Tensor,
}

fn core_inputs(
    rng: &mut Rng,
    b: usize,
    hv: usize,
    l: usize,
    dk: usize,
    dv: usize,
) -> Result<CoreInputs> {
    let q = (l2(&rng.tensor(&[b, hv, l, dk], -1.0, 1.0)?)? * (dk as f64).powf(-0.5))?;
    let k = l2(&rng.tensor(&[b, hv, l, dk], -1.0, 1.0)?)?;
    let v = rng.tensor(&[b, hv, l, dv], -2.0, 2.0)?;
    let beta = rng.tensor(&[b, hv, l], 0.0, 1.0)?;
    // Head 0 decays fast (exercises underflow of Γ), the others slowly.
    let g = rng.tensor(&[b, hv, l], -0.3, 0.0)?;
    let fast = rng.tensor(&[b, 1, l], -6.0, -2.0)?;
    let g = Tensor::cat(&[&fast, &g.narrow(1, 1, hv - 1)?], 1)?;
    let s0 = rng.tensor(&[b, hv, dk, dv], -1.0, 1.0)?;
    Ok(CoreInputs {
        q,
        k,
        v,
        beta,
        g,
        s0,
    })
}

#[test]
fn chunked_core_equals_recurrence_across_chunks_with_start_state() -> Result<()> {
    let mut rng = Rng(7);
    let mut worst = 0f32;
    for &(l, chunk) in &[
        (1, 64),
        (5, 64),
        (64, 64),
        (65, 64),
        (150, 64),
        (200, 64),
        (150, 16),
        (37, 8),
    ] {
        let x = core_inputs(&mut rng, 2, 3, l, 16, 8)?;
        let (o_r, s_r) = recurrent_gated_delta_rule(&x.q, &x.k, &x.v, &x.beta, &x.g, &x.s0)?;
        let (o_c, s_c) = chunked_gated_delta_rule(&x.q, &x.k, &x.v, &x.beta, &x.g, &x.s0, chunk)?;
        let (eo, es) = (max_abs_diff(&o_r, &o_c)?, max_abs_diff(&s_r, &s_c)?);
        assert!(
            eo <= TOL && es <= TOL,
            "L={l} C={chunk}: output {eo:e}, state {es:e}"
        );
        worst = worst.max(eo).max(es);
    }
    println!("chunked vs recurrent core, max |diff| = {worst:e}");
    Ok(())
}

#[test]
fn chunked_core_is_stable_for_identical_keys_without_decay() -> Result<()> {
    // Worst case of the triangular solve (forward substitution in `chunked`): identical unit
    // keys, β ≈ 1, g = 0.
    let (b, hv, l, dk, dv) = (1, 2, 128, 8, 4);
    let mut rng = Rng(11);
    let key = l2(&rng.tensor(&[1, 1, 1, dk], -1.0, 1.0)?)?;
    let k = key.broadcast_as((b, hv, l, dk))?.contiguous()?;
    let q = (k.clone() * (dk as f64).powf(-0.5))?;
    let v = rng.tensor(&[b, hv, l, dv], -1.0, 1.0)?;
    let beta = (Tensor::ones((b, hv, l), DType::F32, &Device::Cpu)? * 0.999)?;
    let g = Tensor::zeros((b, hv, l), DType::F32, &Device::Cpu)?;
    let s0 = rng.tensor(&[b, hv, dk, dv], -1.0, 1.0)?;
    let (o_r, s_r) = recurrent_gated_delta_rule(&q, &k, &v, &beta, &g, &s0)?;
    let (o_c, s_c) = chunked_gated_delta_rule(&q, &k, &v, &beta, &g, &s0, 64)?;
    let (eo, es) = (max_abs_diff(&o_r, &o_c)?, max_abs_diff(&s_r, &s_c)?);
    println!("identical keys: output {eo:e}, state {es:e}");
    assert!(eo <= TOL && es <= TOL, "output {eo:e}, state {es:e}");
    Ok(())
}

/// Tiny layer: D = 32, Hk = 2, Hv = 4 (r = 2), dk = 8, dv = 6, Kc = 4.
fn tiny_layer(rng: &mut Rng) -> Result<GdnLayer> {
    let dims = GdnDims {
        hidden: 32,
        key_heads: 2,
        value_heads: 4,
        key_dim: 8,
        value_dim: 6,
        conv_kernel: 4,
        rms_norm_eps: 1e-6,
    };
    let (d, cc, cv, hv) = (
        dims.hidden,
        dims.conv_channels(),
        dims.value_channels(),
        dims.value_heads,
    );
    let s = 1.0 / (d as f32).sqrt();
    let w = GdnWeights {
        in_proj_qkv: rng.tensor(&[cc, d], -s, s)?,
        in_proj_z: rng.tensor(&[cv, d], -s, s)?,
        in_proj_b: rng.tensor(&[hv, d], -s, s)?,
        in_proj_a: rng.tensor(&[hv, d], -s, s)?,
        conv1d: rng.tensor(&[cc, 1, dims.conv_kernel], -0.5, 0.5)?,
        a_log: rng.tensor(&[hv], -1.0, 1.5)?,
        dt_bias: rng.tensor(&[hv], -1.0, 1.0)?,
        norm: rng.tensor(&[dims.value_dim], 0.5, 1.5)?,
        out_proj: rng.tensor(&[d, cv], -s, s)?,
    };
    Ok(GdnLayer::new(dims, w, DType::F32)?)
}

fn random_state(rng: &mut Rng, layer: &GdnLayer, batch: usize) -> Result<GdnState> {
    let d = layer.dims();
    Ok(GdnState {
        conv: rng.tensor(&[batch, d.conv_state_len(), d.conv_channels()], -1.0, 1.0)?,
        recurrent: rng.tensor(&[batch, d.value_heads, d.key_dim, d.value_dim], -0.5, 0.5)?,
    })
}

fn state_diff(a: &GdnState, b: &GdnState) -> Result<f32> {
    Ok(max_abs_diff(&a.conv, &b.conv)?.max(max_abs_diff(&a.recurrent, &b.recurrent)?))
}

#[test]
fn layer_chunked_equals_token_by_token_and_split_prefill() -> Result<()> {
    let mut rng = Rng(21);
    let layer = tiny_layer(&mut rng)?;
    let (b, l) = (2, 150);
    let x = rng.tensor(&[b, l, 32], -2.0, 2.0)?;
    let s0 = random_state(&mut rng, &layer, b)?;

    let (y_c, st_c) = layer.forward_with(&x, &s0, None, None, DeltaRule::Chunked(64))?;
    let (y_r, st_r) = layer.forward_with(&x, &s0, None, None, DeltaRule::Recurrent)?;
    // Decode-style: one call per token, state carried.
    let mut st = s0.clone();
    let mut ys = Vec::new();
    for t in 0..l {
        let (y, next) = layer.forward(&x.narrow(1, t, 1)?, &st, None)?;
        ys.push(y);
        st = next;
    }
    let y_steps = Tensor::cat(&ys, 1)?;
    // Prefill split across two chunked calls (cut inside the second chunk), state carried.
    let (y1, mid) = layer.forward(&x.narrow(1, 0, 70)?, &s0, None)?;
    let (y2, st_split) = layer.forward(&x.narrow(1, 70, l - 70)?, &mid, None)?;
    let y_split = Tensor::cat(&[&y1, &y2], 1)?;

    let e = [
        max_abs_diff(&y_c, &y_r)?,
        state_diff(&st_c, &st_r)?,
        max_abs_diff(&y_c, &y_steps)?,
        state_diff(&st_c, &st)?,
        max_abs_diff(&y_c, &y_split)?,
        state_diff(&st_c, &st_split)?,
    ];
    println!("layer chunked vs recurrent / steps / split: {e:?}");
    assert!(e.iter().all(|v| *v <= TOL), "{e:?}");
    Ok(())
}

#[test]
fn right_padding_leaves_each_row_as_if_alone() -> Result<()> {
    let mut rng = Rng(33);
    let layer = tiny_layer(&mut rng)?;
    let lengths = vec![150usize, 37, 2, 1, 0];
    let (b, l) = (lengths.len(), 150);
    // Garbage (not zeros) in the padded region on purpose.
    let x = rng.tensor(&[b, l, 32], -2.0, 2.0)?;
    let s0 = random_state(&mut rng, &layer, b)?;
    let pad = RightPadding::new(lengths.clone(), l).ok_or_else(|| anyhow::anyhow!("padding"))?;
    let mut worst = 0f32;
    for rule in [DeltaRule::Chunked(64), DeltaRule::Recurrent] {
        let (y, st) = layer.forward_with(&x, &s0, None, Some(&pad), rule)?;
        for (row, &len) in lengths.iter().enumerate() {
            let s_row = s0.select_rows(&[row as u32])?;
            let want_state = if len == 0 {
                s_row.clone()
            } else {
                let (y_alone, st_alone) = layer.forward_with(
                    &x.narrow(0, row, 1)?.narrow(1, 0, len)?,
                    &s_row,
                    None,
                    None,
                    rule,
                )?;
                let e = max_abs_diff(&y.narrow(0, row, 1)?.narrow(1, 0, len)?, &y_alone)?;
                assert!(e <= TOL, "{rule:?} row {row} (len {len}): output {e:e}");
                worst = worst.max(e);
                st_alone
            };
            let e = state_diff(&st.select_rows(&[row as u32])?, &want_state)?;
            assert!(e <= TOL, "{rule:?} row {row} (len {len}): state {e:e}");
            worst = worst.max(e);
        }
    }
    println!("padded vs alone, max |diff| = {worst:e}");
    Ok(())
}

#[test]
fn source_state_is_not_mutated_and_fork_broadcasts() -> Result<()> {
    let mut rng = Rng(45);
    let layer = tiny_layer(&mut rng)?;
    let prefix = random_state(&mut rng, &layer, 1)?;
    let before = (
        prefix.conv.to_vec3::<f32>()?,
        prefix.recurrent.flatten_all()?.to_vec1::<f32>()?,
    );
    let rows = prefix.select_rows(&[0, 0, 0])?;
    let x = rng.tensor(&[3, 9, 32], -2.0, 2.0)?;
    let (_, after) = layer.forward(&x, &rows, None)?;
    assert_eq!(after.batch(), 3);
    assert_eq!(prefix.conv.to_vec3::<f32>()?, before.0);
    assert_eq!(prefix.recurrent.flatten_all()?.to_vec1::<f32>()?, before.1);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, failure_persistence: None, ..ProptestConfig::default() })]
    /// Cutting a prefill anywhere (and calling the step path for 1-token pieces) gives the
    /// one-shot result.
    #[test]
    fn any_split_of_a_prefill_gives_the_one_shot_result(cut in 1usize..99, seed in 0u64..1000) {
        let run = || -> Result<f32> {
            let mut rng = Rng(seed);
            let layer = tiny_layer(&mut rng)?;
            let x = rng.tensor(&[1, 100, 32], -2.0, 2.0)?;
            let s0 = random_state(&mut rng, &layer, 1)?;
            let (y, st) = layer.forward(&x, &s0, None)?;
            let (y1, mid) = layer.forward(&x.narrow(1, 0, cut)?, &s0, None)?;
            let (y2, st2) = layer.forward(&x.narrow(1, cut, 100 - cut)?, &mid, None)?;
            let ys = Tensor::cat(&[&y1, &y2], 1)?;
            Ok(max_abs_diff(&y, &ys)?.max(state_diff(&st, &st2)?))
        };
        let e = run().map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(e <= TOL, "cut {}: {:e}", cut, e);
    }
}

/// Rows continuing picked state rows (a scoring pass forked from retained states) equal the
/// same rows run from a gathered copy of those states, with and without right padding; a map
/// of the wrong length or naming a missing state row is refused with a clear error.
#[test]
fn rows_from_slots_equal_gathered_rows_and_bad_slots_are_refused() -> Result<()> {
    let mut rng = Rng(41);
    let layer = tiny_layer(&mut rng)?;
    let (b, l) = (3, 20);
    let x = rng.tensor(&[b, l, 32], -2.0, 2.0)?;
    let s0 = random_state(&mut rng, &layer, 2)?;
    let slots = [1u32, 0, 1];
    let pad = RightPadding::new(vec![20, 7, 13], l).ok_or_else(|| anyhow::anyhow!("padding"))?;
    for padding in [None, Some(&pad)] {
        let (y, st) = layer.forward_from_slots(&x, &s0, &slots, padding)?;
        let (y_g, st_g) = layer.forward(&x, &s0.select_rows(&slots)?, padding)?;
        assert_eq!(max_abs_diff(&y, &y_g)?, 0.0);
        assert_eq!(state_diff(&st, &st_g)?, 0.0);
    }
    let err = layer
        .forward_from_slots(&x, &s0, &[0, 2, 1], None)
        .expect_err("slot 2 of 2 states")
        .to_string();
    assert!(
        err.contains("row slot 2 out of range: the GDN state holds 2 rows"),
        "{err}"
    );
    let err = layer
        .forward_from_slots(&x, &s0, &[0, 1], None)
        .expect_err("2 slots for 3 rows")
        .to_string();
    assert!(err.contains("2 row slots for an input of 3 rows"), "{err}");
    Ok(())
}
