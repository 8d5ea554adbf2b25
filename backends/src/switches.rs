//! The switchboard: every `FORKSCORE_*` environment switch the library reads, in one table, read
//! from the environment once per process into one [`Switches`] value.
//!
//! No other module reads these variables: each asks [`Switches::current`] (or [`value`]) for its
//! switch's trimmed value, and the kernels crate (`forkscore-kernels`, which reads no
//! environment) gets the two switches that decide inside its kernels, `FORKSCORE_CPU_ISA` and
//! `FORKSCORE_CPU_QPREFETCH`, installed as its settings when [`Switches::current`] first reads
//! them. A backend load checks every set switch ([`Switches::validate`], with the value parsers
//! of the modules that use them) and refuses a misspelled value with an error naming the
//! variable and what it accepts, instead of silently running the default. The A/B-only switches
//! ([`Audience::Dev`]) are read only by builds with the `dev-switches` feature; elsewhere a load
//! refuses them when set. Results record the set switches that can change a result
//! ([`Switches::recorded`]) in their provenance. `docs/configuration.md` carries the same table
//! for users; a test holds the two together.
//!
//! This module is a leaf: it imports nothing from the crate, so every module may use it.

use std::collections::BTreeMap;
use std::sync::OnceLock;

/// What setting a switch can change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Which kernel or formulation computes a layer: results can differ in the last bits.
    ComputePath,
    /// Blocking, tiling or prefetch of a kernel: the same kernel, possibly a different
    /// summation order.
    Tuning,
    /// Timing or start-up behaviour only: results are unchanged.
    Diagnostic,
}

/// Who a switch is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Audience {
    /// Read by every build: reference paths, the instruction-level cap, kernel choices a user
    /// may want, diagnostics.
    User,
    /// An A/B switch for measurements (blockings, fusions, alternative launch forms): read only
    /// by builds with the `dev-switches` feature (the benches, `scripts/build-cuda.sh`); other
    /// builds refuse it when set, naming the feature, rather than ignore it.
    Dev,
}

/// What values a switch accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepts {
    /// One of these words (ASCII case ignored); the first is the default.
    OneOf(&'static [&'static str]),
    /// A specification parsed by the module that uses it (checked at load).
    Spec(&'static str),
}

/// One switch of the table.
#[derive(Debug, Clone, Copy)]
pub struct Switch {
    pub name: &'static str,
    pub audience: Audience,
    pub effect: Effect,
    pub accepts: Accepts,
    /// What it does, for the documentation table.
    pub doc: &'static str,
}

use Accepts::{OneOf, Spec};
use Audience::{Dev, User};
use Effect::{ComputePath, Diagnostic, Tuning};

/// Every switch the library reads.
pub const TABLE: &[Switch] = &[
    Switch {
        name: "FORKSCORE_ATTENTION",
        audience: User,
        effect: ComputePath,
        accepts: OneOf(&["fastest", "candle"]),
        doc: "`candle`: attention through candle's matmul + softmax everywhere (the reference), instead of the flash / CPU kernels",
    },
    Switch {
        name: "FORKSCORE_CAUSAL_BLOCKS",
        audience: Dev,
        effect: ComputePath,
        accepts: OneOf(&["1", "0"]),
        doc: "`0`: candle-path causal prefill attention over the full L × L scores instead of by query blocks",
    },
    Switch {
        name: "FORKSCORE_CPU_ISA",
        audience: User,
        effect: ComputePath,
        accepts: OneOf(&["avx512", "avxvnni", "avx2"]),
        doc: "caps the CPU kernels' instruction level (the highest the CPU has by default)",
    },
    Switch {
        name: "FORKSCORE_CPU_GEMM",
        audience: Dev,
        effect: ComputePath,
        accepts: OneOf(&["packed", "candle", "openblas", "amx"]),
        doc: "the f32 CPU GEMM: forkscore's packed kernel, candle's matmul, OpenBLAS (`--features openblas`) or the opt-in AMX bf16×6 kernel",
    },
    Switch {
        name: "FORKSCORE_CPU_BF16",
        audience: User,
        effect: ComputePath,
        accepts: OneOf(&["amx", "dot", "candle"]),
        doc: "the kernel for bf16 weights on the CPU: AMX tiles, AVX-512 BF16 dot products, or candle's matmul",
    },
    Switch {
        name: "FORKSCORE_CPU_Q8",
        audience: User,
        effect: ComputePath,
        accepts: OneOf(&["vnni", "amx"]),
        doc: "the kernel for q8_0 weights on the CPU: VNNI dot products or the opt-in AMX-INT8 tiles",
    },
    Switch {
        name: "FORKSCORE_CPU_GEMM_BLOCKING",
        audience: Dev,
        effect: Tuning,
        accepts: Spec("`key=value,…` over the f32 kernel's blocking (`mr`, `nr`, `mc`, `kc`, `pf`)"),
        doc: "the f32 CPU GEMM's blocking",
    },
    Switch {
        name: "FORKSCORE_CPU_AMX",
        audience: Dev,
        effect: Tuning,
        accepts: Spec("`key=value,…` over the AMX kernel's blocking (`mc`, `pf`)"),
        doc: "the AMX GEMM's blocking",
    },
    Switch {
        name: "FORKSCORE_CPU_ATTENTION",
        audience: Dev,
        effect: Tuning,
        accepts: Spec("`key=value,…` over the CPU attention kernel's tile sizes and form"),
        doc: "the CPU attention kernel's tiles",
    },
    Switch {
        name: "FORKSCORE_CPU_QPREFETCH",
        audience: Dev,
        effect: Tuning,
        accepts: Spec("a count of blocks to prefetch ahead (0: none)"),
        doc: "the quantized CPU GEMM's prefetch distance",
    },
    Switch {
        name: "FORKSCORE_MLP",
        audience: Dev,
        effect: ComputePath,
        accepts: OneOf(&["tiles", "stacked", "separate"]),
        doc: "MLP gate | up: one product with the SwiGLU inside the kernel's tiles, one stacked product then SwiGLU, or two products",
    },
    Switch {
        name: "FORKSCORE_GDN_PROJ",
        audience: Dev,
        effect: ComputePath,
        accepts: OneOf(&["separate", "stacked"]),
        doc: "`stacked`: Gated DeltaNet input projections (q|k|v, z, b, a) as one product cut into four (opt-in: ~10 % slower than four products for one Qwen3.5-4B decision on an H100)",
    },
    Switch {
        name: "FORKSCORE_QKV_HEADS",
        audience: Dev,
        effect: ComputePath,
        accepts: OneOf(&["candle", "fused", "bias-apart"]),
        doc: "`candle`: a stacked q|k|v product's heads through candle's bias add, copy and rope on CUDA bf16 instead of the fused heads kernel (the default, `fused`, which also adds the product's bias in the same pass); `bias-apart`: the fused heads kernel after candle's bias add over the whole product",
    },
    Switch {
        name: "FORKSCORE_ROW_SPLIT",
        audience: Dev,
        effect: Diagnostic,
        accepts: OneOf(&["gather", "rows"]),
        doc: "`rows`: a padded pass's per-row states cut one row and layer at a time (a narrow and an append each) instead of one gather per K and V per layer; bit-identical states",
    },
    Switch {
        name: "FORKSCORE_QKV",
        audience: Dev,
        effect: ComputePath,
        accepts: OneOf(&["stacked", "separate"]),
        doc: "attention q | k | v as one stacked product or three",
    },
    Switch {
        name: "FORKSCORE_HEADS",
        audience: Dev,
        effect: ComputePath,
        accepts: OneOf(&["fused", "candle"]),
        doc: "`candle`: attention heads on CUDA bf16 through candle's norm, transpose, rope and concatenation instead of the fused heads kernel",
    },
    Switch {
        name: "FORKSCORE_GDN",
        audience: User,
        effect: ComputePath,
        accepts: OneOf(&["fused", "candle"]),
        doc: "Gated DeltaNet layers through the fused CUDA kernels or candle's ops (the reference)",
    },
    Switch {
        name: "FORKSCORE_GDN_PACKED_CONV",
        audience: Dev,
        effect: Tuning,
        accepts: OneOf(&["in_place", "copy"]),
        doc: "`copy`: a packed prefill pass's Gated DeltaNet conv input is copied into a right-padded batch first, instead of read in place through row starts (bit-equal)",
    },
    Switch {
        name: "FORKSCORE_GDN_PREFILL",
        audience: User,
        effect: ComputePath,
        accepts: OneOf(&["auto", "chunked", "recurrent"]),
        doc: "the fused Gated DeltaNet prefill form: chosen by length, chunked, or recurrent",
    },
    Switch {
        name: "FORKSCORE_VOCAB_TOPK",
        audience: Dev,
        effect: ComputePath,
        accepts: OneOf(&["device", "host"]),
        doc: "whole-vocabulary top-K on the GPU or on the host",
    },
    Switch {
        name: "FORKSCORE_BRANCH_STATE",
        audience: Dev,
        effect: Diagnostic,
        accepts: OneOf(&["skip", "keep"]),
        doc: "`keep`: a scoring pass's fused Gated DeltaNet kernels on CUDA write each row's final recurrent state, which nobody reads, instead of skipping it (the default, `skip`; the outputs are bit-equal)",
    },
    Switch {
        name: "FORKSCORE_FLASH_BATCHED",
        audience: Dev,
        effect: ComputePath,
        accepts: OneOf(&["on", "off"]),
        doc: "`off`: one flash-attention launch per segment of a packed prefill and per slot of a merged scoring pass on CUDA bf16, instead of ONE launch for all (varlen form, per-slot past table; bit-equal)",
    },
    Switch {
        name: "FORKSCORE_CUDA_RUNTIME",
        audience: Dev,
        effect: Diagnostic,
        accepts: OneOf(&["tuned", "candle"]),
        doc: "`candle`: candle's default CUDA allocator and stream settings instead of stream-ordered allocation",
    },
    Switch {
        name: "FORKSCORE_SHARED_HEAD",
        audience: User,
        effect: ComputePath,
        accepts: OneOf(&["on", "off"]),
        doc: "`off`: every context of a group prefills its whole prompt, instead of continuing the cached state of the prompt head its group shares (f32 rounding)",
    },
    Switch {
        name: "FORKSCORE_QUANT_ACTIVATIONS",
        audience: User,
        effect: ComputePath,
        accepts: OneOf(&["8bit", "f32"]),
        doc: "`f32`: quantized layers (GGUF blocks, `--quantize q8_0 | q4k | int8`) multiply f32 activations by their weights dequantized for each call — the decisions of the same weights written out dense, slower — instead of rounding the activations to 8-bit blocks for the integer kernels",
    },
    Switch {
        name: "FORKSCORE_SERVE_PREPARE",
        audience: Dev,
        effect: Diagnostic,
        accepts: OneOf(&["handler", "model-thread"]),
        doc: "`model-thread`: `forkscore serve` prepares (renders, splits, tokenizes) each job's contexts on the model thread between passes, instead of in the request handlers before queuing (the same decisions)",
    },
    Switch {
        name: "FORKSCORE_TOKENIZER",
        audience: User,
        effect: Diagnostic,
        accepts: OneOf(&["fast", "reference"]),
        doc: "`reference`: every text is encoded by Hugging Face `tokenizers`, instead of the exact fast encoder of the Qwen byte-level BPE pipelines (the same ids)",
    },
    Switch {
        name: "FORKSCORE_PROFILE",
        audience: User,
        effect: Diagnostic,
        accepts: OneOf(&["0", "1"]),
        doc: "`1`: time each layer kind (device-synchronised) and print the totals at exit",
    },
];

/// The table entry of `name`, if it is a switch.
pub fn switch(name: &str) -> Option<&'static Switch> {
    TABLE.iter().find(|s| s.name == name)
}

/// The set switches of one process: each table variable's trimmed value when set and not empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Switches {
    values: BTreeMap<&'static str, String>,
    /// Development switches set in the source that this build does not read (no
    /// `dev-switches` feature): [`Switches::validate`] refuses them.
    unread: BTreeMap<&'static str, String>,
}

/// A switch set to a value it does not accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}={value:?}: {reason}")]
pub struct SwitchError {
    pub name: &'static str,
    pub value: String,
    pub reason: String,
}

impl Switches {
    /// The table's switches as `get` gives them (a variable's value, if set).
    /// Development switches are read where this build has the `dev-switches` feature.
    pub fn from_source(get: impl Fn(&str) -> Option<String>) -> Switches {
        Switches::from_source_with(get, cfg!(feature = "dev-switches"))
    }

    /// [`Switches::from_source`] with the development switches read or not (`dev`).
    pub fn from_source_with(get: impl Fn(&str) -> Option<String>, dev: bool) -> Switches {
        let mut out = Switches::default();
        for s in TABLE {
            let Some(v) = get(s.name) else { continue };
            let v = v.trim();
            if v.is_empty() {
                continue;
            }
            match (s.audience, dev) {
                (Dev, false) => out.unread.insert(s.name, v.to_string()),
                _ => out.values.insert(s.name, v.to_string()),
            };
        }
        out
    }

    /// This process's switches, read from the environment on first use. The first use also
    /// installs the kernels crate's settings (`FORKSCORE_CPU_ISA`, `FORKSCORE_CPU_QPREFETCH`:
    /// [`Switches::kernel_settings`]), so a backend load, which starts here, fixes them before
    /// any kernel runs.
    pub fn current() -> &'static Switches {
        static CURRENT: OnceLock<Switches> = OnceLock::new();
        CURRENT.get_or_init(|| {
            let s = Switches::from_source(|name| std::env::var(name).ok());
            forkscore_kernels::cpu::settings::install(s.kernel_settings());
            s
        })
    }

    /// The kernels crate's settings these switches ask for (a value the load refuses counts as
    /// unset here).
    pub fn kernel_settings(&self) -> forkscore_kernels::cpu::settings::Settings {
        use forkscore_kernels::cpu::{isa::Isa, qgemm::parse_prefetch};
        forkscore_kernels::cpu::settings::Settings {
            isa_cap: self
                .get("FORKSCORE_CPU_ISA")
                .and_then(|v| Isa::from_name(&v.to_ascii_lowercase())),
            q_prefetch: self
                .get("FORKSCORE_CPU_QPREFETCH")
                .and_then(|v| parse_prefetch(v).ok()),
        }
    }

    /// The trimmed value of switch `name`, when set.
    pub fn get(&self, name: &str) -> Option<&str> {
        debug_assert!(switch(name).is_some(), "{name} is not in the switch table");
        self.values.get(name).map(String::as_str)
    }

    /// Whether switch `name` is set to `word` (ASCII case ignored).
    pub fn is(&self, name: &str, word: &str) -> bool {
        self.get(name).is_some_and(|v| v.eq_ignore_ascii_case(word))
    }

    /// The first set switch whose value is wrong: a [`Accepts::OneOf`] word outside its list,
    /// or a [`Accepts::Spec`] that `spec` (the owning module's parser, given the name and the
    /// value) refuses.
    pub fn validate(
        &self,
        spec: impl Fn(&'static str, &str) -> Result<(), String>,
    ) -> Result<(), SwitchError> {
        if let Some((&name, value)) = self.unread.iter().next() {
            return Err(SwitchError {
                name,
                value: value.clone(),
                reason: "a development switch (A/B measurements) that this build does not read: \
                         unset it, or build with `--features dev-switches`"
                    .into(),
            });
        }
        for (&name, value) in &self.values {
            let Some(s) = switch(name) else { continue };
            let wrong = |reason: String| SwitchError {
                name,
                value: value.clone(),
                reason,
            };
            match s.accepts {
                OneOf(words) => {
                    if !words.iter().any(|w| w.eq_ignore_ascii_case(value)) {
                        return Err(wrong(format!("expected one of {}", words.join(", "))));
                    }
                }
                Spec(_) => spec(name, value).map_err(wrong)?,
            }
        }
        Ok(())
    }

    /// The set switches that can change a result (every effect but [`Effect::Diagnostic`]),
    /// name → value, for provenance. Empty when none is set.
    pub fn recorded(&self) -> BTreeMap<String, String> {
        self.values
            .iter()
            .filter(|(name, _)| switch(name).is_some_and(|s| s.effect != Diagnostic))
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }
}

/// The trimmed value of switch `name` in this process, when set.
pub fn value(name: &str) -> Option<&'static str> {
    Switches::current().get(name)
}

/// Whether switch `name` is set to `word` in this process (ASCII case ignored).
pub fn is(name: &str, word: &str) -> bool {
    Switches::current().is(name, word)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Switches from `pairs`, development switches read.
    fn with(pairs: &[(&str, &str)]) -> Switches {
        Switches::from_source_with(
            |name| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            },
            true,
        )
    }

    fn no_spec(_: &'static str, _: &str) -> Result<(), String> {
        Ok(())
    }

    /// The kernels' settings come from their two switches; wrong values count as unset.
    #[test]
    fn kernel_settings_follow_their_switches() {
        use forkscore_kernels::cpu::isa::Isa;
        let s = with(&[
            ("FORKSCORE_CPU_ISA", "AVX2"),
            ("FORKSCORE_CPU_QPREFETCH", "3"),
        ]);
        let k = s.kernel_settings();
        assert_eq!(k.isa_cap, Some(Isa::Avx2));
        assert_eq!(k.q_prefetch, Some(3));
        let k = with(&[("FORKSCORE_CPU_ISA", "avx3")]).kernel_settings();
        assert_eq!(k, Default::default());
    }

    /// Without the development switches, a set one is refused by name with the feature to build
    /// with, and not read; with them it is read as any other.
    #[test]
    fn development_switches_need_their_feature() {
        let source = |name: &str| (name == "FORKSCORE_MLP").then(|| "separate".to_string());
        let off = Switches::from_source_with(source, false);
        assert_eq!(off.get("FORKSCORE_MLP"), None);
        assert!(off.recorded().is_empty());
        let e = off
            .validate(no_spec)
            .expect_err("a dev switch without the feature");
        assert_eq!(e.name, "FORKSCORE_MLP");
        assert!(e.to_string().contains("--features dev-switches"), "{e}");
        let on = Switches::from_source_with(source, true);
        assert_eq!(on.get("FORKSCORE_MLP"), Some("separate"));
        assert_eq!(on.validate(no_spec), Ok(()));
        // user switches are read either way
        let user = |name: &str| (name == "FORKSCORE_GDN").then(|| "candle".to_string());
        assert!(Switches::from_source_with(user, false).is("FORKSCORE_GDN", "candle"));
    }

    /// The development switches are the A/B ones: every tuning switch is one, and the reference
    /// paths, the level cap and the diagnostics are for users.
    #[test]
    fn tuning_switches_are_development_switches() {
        for s in TABLE {
            if s.effect == Tuning {
                assert_eq!(s.audience, Dev, "{}", s.name);
            }
        }
        for name in [
            "FORKSCORE_ATTENTION",
            "FORKSCORE_GDN",
            "FORKSCORE_CPU_ISA",
            "FORKSCORE_PROFILE",
        ] {
            assert_eq!(switch(name).map(|s| s.audience), Some(User), "{name}");
        }
    }

    #[test]
    fn names_are_unique_and_prefixed() {
        let mut names: Vec<_> = TABLE.iter().map(|s| s.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), TABLE.len());
        assert!(names.iter().all(|n| n.starts_with("FORKSCORE_")));
    }

    /// Unset and empty switches are absent; values are trimmed; other variables are ignored.
    #[test]
    fn only_table_switches_are_read() {
        let s = with(&[
            ("FORKSCORE_ATTENTION", " candle "),
            ("FORKSCORE_GDN", "  "),
            ("FORKSCORE_BENCH_MODEL", "x"),
        ]);
        assert_eq!(s.get("FORKSCORE_ATTENTION"), Some("candle"));
        assert!(s.is("FORKSCORE_ATTENTION", "CANDLE"));
        assert_eq!(s.get("FORKSCORE_GDN"), None);
        assert_eq!(s.values.len(), 1);
    }

    /// A word outside the list is refused by name with the accepted words; the default word is
    /// accepted; a spec goes to its parser.
    #[test]
    fn wrong_values_are_named() {
        assert_eq!(with(&[]).validate(no_spec), Ok(()));
        assert_eq!(
            with(&[
                ("FORKSCORE_GDN_PREFILL", "Auto"),
                ("FORKSCORE_MLP", "tiles")
            ])
            .validate(no_spec),
            Ok(())
        );
        let e = with(&[("FORKSCORE_ATTENTION", "flash")])
            .validate(no_spec)
            .expect_err("flash");
        assert_eq!(e.name, "FORKSCORE_ATTENTION");
        assert!(e.to_string().contains("\"flash\""), "{e}");
        assert!(e.to_string().contains("fastest, candle"), "{e}");
        let e = with(&[("FORKSCORE_CPU_QPREFETCH", "far")])
            .validate(|name, v| Err(format!("{name} got {v}")))
            .expect_err("far");
        assert_eq!(e.reason, "FORKSCORE_CPU_QPREFETCH got far");
    }

    /// Provenance records result-changing switches only.
    #[test]
    fn diagnostics_are_not_recorded() {
        let s = with(&[("FORKSCORE_PROFILE", "1"), ("FORKSCORE_QKV", "separate")]);
        let r = s.recorded();
        assert_eq!(r.len(), 1);
        assert_eq!(r["FORKSCORE_QKV"], "separate");
    }

    /// docs/configuration.md names every switch of the table.
    #[test]
    fn the_documentation_names_every_switch() {
        let doc = include_str!("../../docs/configuration.md");
        for s in TABLE {
            let row = format!("| `{}` | ", s.name);
            let line = doc.lines().find(|l| l.starts_with(&row));
            let Some(line) = line else {
                panic!("{} has no row in the table", s.name)
            };
            // the build column says who reads it
            let build = line[row.len()..].split(" | ").next();
            let want = match s.audience {
                User => "every",
                Dev => "`dev-switches`",
            };
            assert_eq!(build, Some(want), "{}", s.name);
        }
    }
}
