use super::*;
use crate::candle::layers::attention::tests::rand;
use crate::candle::layers::attention::{attend_candle, AttnMasks};
use crate::candle::layers::mask;
use candle_core::Device;

/// One call's shape: rows, query heads, KV heads, new tokens, head dim, past slots and
/// length (0: no past), each row's own past length (left padding; `None`: all of it), and
/// the tree's parents (`None`: causal).
struct Case {
    b: usize,
    h: usize,
    hkv: usize,
    l: usize,
    hd: usize,
    slots: usize,
    p: usize,
    past_lens: Option<Vec<usize>>,
    tree: Option<Vec<Option<usize>>>,
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .and_then(|d| d.abs())
        .and_then(|d| d.flatten_all())
        .and_then(|d| d.max(0))
        .and_then(|d| d.to_scalar::<f32>())
        .expect("diff")
}

fn check(c: &Case, sizes: TileSizes, seed: &mut u64) -> f32 {
    check_rounded(c, sizes, seed, false)
}

/// [`check`]; with `bf16`, the candle path's operands are the kernel's rounded to bf16 (the
/// reference of the AMX form, which rounds them so).
fn check_rounded(c: &Case, sizes: TileSizes, seed: &mut u64, bf16: bool) -> f32 {
    let dev = Device::Cpu;
    let q = rand(&[c.b, c.h, c.l, c.hd], seed);
    let k = rand(&[c.b, c.hkv, c.l, c.hd], seed);
    let v = rand(&[c.b, c.hkv, c.l, c.hd], seed);
    let pk = rand(&[c.hkv, c.slots, c.p, c.hd], seed);
    let pv = rand(&[c.hkv, c.slots, c.p, c.hd], seed);
    let round = |t: &Tensor| match bf16 {
        true => t
            .to_dtype(DType::BF16)
            .and_then(|t| t.to_dtype(DType::F32))
            .expect("bf16"),
        false => t.clone(),
    };
    let (rq, rk, rv, rpk, rpv) = (round(&q), round(&k), round(&v), round(&pk), round(&pv));
    let rpast = (c.p > 0).then_some(PastKv { k: &rpk, v: &rpv });
    let past = (c.p > 0).then_some(PastKv { k: &pk, v: &pv });
    let new_keys = match (&c.tree, c.l) {
        (Some(parents), _) => Some(NewKeysMask::tree(parents, &dev).expect("tree")),
        (None, 1) => None,
        (None, l) => Some(NewKeysMask::causal(l, &dev)),
    };
    let (padding, starts) = match &c.past_lens {
        Some(lens) => (
            Some(mask::left_padding(lens, c.p, &dev).expect("padding")),
            Some(mask::past_starts(lens, c.p, &dev).expect("starts")),
        ),
        None => (None, None),
    };
    let masks = AttnMasks {
        new_keys: new_keys.as_ref(),
        past: padding.as_ref(),
        past_start: starts.as_ref(),
        precision: Default::default(),
    };
    assert!(supports(&q, &k, &v, past.as_ref()));
    let got = attend_with(
        &q,
        &k,
        &v,
        past.as_ref(),
        starts.as_ref(),
        new_keys.as_ref(),
        sizes,
    )
    .expect("cpu kernel");
    let want = attend_candle(&rq, &rk, &rv, rpast, &masks).expect("candle");
    assert_eq!(got.dims(), want.dims());
    max_diff(&got, &want)
}

/// The kernel equals the candle path on a long causal prefill (several query blocks and a
/// ragged one), short calls over one shared past, over several slots with left padding, a
/// packed tree, one-token rows, and a long chunk continuing a past.
#[test]
fn cpu_kernel_equals_the_candle_path() {
    let mut seed = 11u64;
    let cases = [
        Case {
            b: 1,
            h: 14,
            hkv: 2,
            l: 2 * 64 + 21,
            hd: 64,
            slots: 1,
            p: 0,
            past_lens: None,
            tree: None,
        },
        Case {
            b: 2,
            h: 4,
            hkv: 2,
            l: 7,
            hd: 8,
            slots: 1,
            p: 0,
            past_lens: None,
            tree: None,
        },
        Case {
            b: 5,
            h: 6,
            hkv: 2,
            l: 3,
            hd: 16,
            slots: 1,
            p: 40,
            past_lens: None,
            tree: None,
        },
        Case {
            b: 30,
            h: 7,
            hkv: 1,
            l: 5,
            hd: 8,
            slots: 1,
            p: 33,
            past_lens: None,
            tree: None,
        },
        Case {
            b: 4,
            h: 4,
            hkv: 2,
            l: 4,
            hd: 8,
            slots: 2,
            p: 9,
            past_lens: Some(vec![9, 7, 2, 9]),
            tree: None,
        },
        Case {
            b: 2,
            h: 4,
            hkv: 1,
            l: 5,
            hd: 16,
            slots: 2,
            p: 6,
            past_lens: Some(vec![6, 3]),
            tree: Some(vec![None, Some(0), Some(1), Some(1), None]),
        },
        Case {
            b: 6,
            h: 2,
            hkv: 2,
            l: 1,
            hd: 8,
            slots: 3,
            p: 5,
            past_lens: Some(vec![5, 5, 1, 4, 0, 2]),
            tree: None,
        },
        Case {
            b: 1,
            h: 4,
            hkv: 2,
            l: 64 + 36,
            hd: 32,
            slots: 1,
            p: 70,
            past_lens: None,
            tree: None,
        },
        // a past of several softmax blocks, left-padded rows, head dim 128
        Case {
            b: 6,
            h: 4,
            hkv: 2,
            l: 3,
            hd: 128,
            slots: 2,
            p: 3 * 84 + 5,
            past_lens: Some(vec![257, 100, 3, 257, 1, 200]),
            tree: None,
        },
        // head dim 256 (the hybrid's gated attention), a causal chunk over a past
        Case {
            b: 1,
            h: 4,
            hkv: 1,
            l: 40,
            hd: 256,
            slots: 1,
            p: 30,
            past_lens: None,
            tree: None,
        },
        // head dim 40 (a multiple of 8, not of 16: the 8-lane key-major form under Auto
        // even with AVX-512; a ragged 8-column value tile), a causal chunk over a past
        Case {
            b: 3,
            h: 6,
            hkv: 2,
            l: 11,
            hd: 40,
            slots: 1,
            p: 23,
            past_lens: None,
            tree: None,
        },
        // a tree over a long past, scores far apart (the running maximum moves)
        Case {
            b: 2,
            h: 6,
            hkv: 3,
            l: 6,
            hd: 16,
            slots: 1,
            p: 190,
            past_lens: None,
            tree: Some(vec![None, Some(0), Some(0), Some(2), None, Some(4)]),
        },
    ];
    // the default tiles, small ones (many query blocks, one-row tiles, one key group per
    // softmax block) and one block for all, in the form this CPU takes by default, in the
    // 8-lane key-major form (where the CPU has AVX2), and in the products form
    for spec in [
        "",
        "query_block=5,tile_rows=7,key_block=1",
        "query_block=1000,tile_rows=100000,key_block=15",
        "key_block=100000",
        "form=avx2",
        "query_block=5,tile_rows=7,key_block=1,form=avx2",
        "query_block=1000,tile_rows=100000,key_block=7,form=avx2",
        "form=products",
        "query_block=5,tile_rows=7,form=products",
    ] {
        let sizes = TileSizes::parse(spec).expect("valid sizes");
        for (n, c) in cases.iter().enumerate() {
            let d = check(c, sizes, &mut seed);
            assert!(
                d <= 2e-6,
                "case {n}, tiles {sizes:?}: cpu kernel vs candle {d:e}"
            );
        }
    }
}

/// The AMX bf16 form (`bf16=1`: bf16 / int8 layers) against the candle path on the same
/// operands rounded to bf16: what remains is the rounding of the queries after their scale and
/// of the softmax weights, both to bf16 (`Tolerance::CPU_BF16_ATTENTION`). Head dims 32, 64,
/// 128 and 256 (whole 32-dim steps; other head dims take the f32 forms), causal prefills of
/// several key blocks, a scoring pass of 28 rows of 7 query heads per KV head, slots with left
/// padding, a packed tree over a long past; default and small blocks. Where AMX does not run,
/// `bf16=1` takes the f32 forms and the same bound holds a fortiori.
#[test]
fn amx_bf16_form_tracks_the_candle_path_on_rounded_operands() {
    use forkscore_testkit::tolerance::Tolerance;
    let case = |b, h, hkv, l, hd, slots, p, past_lens: Option<Vec<usize>>, tree| Case {
        b,
        h,
        hkv,
        l,
        hd,
        slots,
        p,
        past_lens,
        tree,
    };
    let cases = [
        case(1, 14, 2, 3 * 64 + 21, 64, 1, 0, None, None),
        case(28, 14, 2, 3, 64, 1, 300, None, None),
        case(1, 4, 2, 64 + 36, 32, 1, 70, None, None),
        case(
            6,
            4,
            2,
            3,
            128,
            2,
            257,
            Some(vec![257, 100, 3, 257, 1, 200]),
            None,
        ),
        case(1, 4, 1, 40, 256, 1, 30, None, None),
        case(
            2,
            6,
            3,
            6,
            64,
            1,
            190,
            None,
            Some(vec![None, Some(0), Some(0), Some(2), None, Some(4)]),
        ),
        case(6, 2, 2, 1, 64, 3, 5, Some(vec![5, 5, 1, 4, 0, 2]), None),
    ];
    let mut seed = 29u64;
    let mut worst = 0f32;
    for spec in [
        "bf16=1",
        "bf16=1,query_block=5,tile_rows=7,key_block=1",
        "bf16=1,key_block=100000",
    ] {
        let sizes = TileSizes::parse(spec).expect("valid sizes");
        for (n, c) in cases.iter().enumerate() {
            let d = check_rounded(c, sizes, &mut seed, true);
            worst = worst.max(d);
            assert!(
                d <= Tolerance::CPU_BF16_ATTENTION.abs,
                "case {n}, tiles {spec}: amx bf16 vs candle on rounded operands {d:e}"
            );
        }
    }
    eprintln!(
        "amx bf16 attention: worst {worst:e} (AMX here: {})",
        forkscore_kernels::cpu::amx::available()
    );
}

/// Tile sizes parse over the default; a wrong key, a zero or a non-count is an error that
/// names it.
#[test]
fn tile_sizes_parse_and_name_errors() {
    let d = TileSizes::default();
    assert_eq!(TileSizes::parse("").expect("empty"), d);
    let t = TileSizes::parse(" query_block = 16 ").expect("one key");
    assert_eq!((t.query_block, t.tile_rows), (16, d.tile_rows));
    assert_eq!(d.form, TileForm::Auto);
    let t = TileSizes::parse("form=products, tile_rows=9").expect("a form");
    assert_eq!((t.form, t.tile_rows), (TileForm::Products, 9));
    let t = TileSizes::parse("form=avx2").expect("a form");
    assert_eq!(t.form, TileForm::KeyMajorAvx2);
    assert!(!d.bf16 && TileSizes::parse("bf16=1").expect("bf16").bf16);
    for (spec, names) in [
        ("rows=4", "unknown key `rows`"),
        ("tile_rows=0", "`tile_rows=0`: must be at least 1"),
        ("query_block=x", "`x` is not a count"),
        ("query_block", "not key=value"),
        ("form=fast", "unknown form `fast`"),
        ("bf16=2", "bf16 is 0 or 1"),
    ] {
        let e = TileSizes::parse(spec).expect_err(spec);
        assert!(e.contains(names), "{spec}: {e}");
    }
}

/// Mismatched shapes are refused with an error naming the shapes, never a panic.
#[test]
fn mismatched_shapes_are_an_error() {
    let mut seed = 3u64;
    let q = rand(&[2, 4, 3, 8], &mut seed);
    let k = rand(&[2, 2, 4, 8], &mut seed);
    let e = attend(&q, &k, &k, None, None, None, false).expect_err("mismatch");
    assert!(e.to_string().contains("do not match"), "{e}");
    let k = rand(&[2, 2, 3, 8], &mut seed);
    let pk = rand(&[2, 3, 5, 8], &mut seed);
    let past = PastKv { k: &pk, v: &pk };
    let e = attend(&q, &k, &k, Some(&past), None, None, false).expect_err("3 slots for 2 rows");
    assert!(e.to_string().contains("does not fit"), "{e}");
}
