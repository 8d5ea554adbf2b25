//! The staged engine for one backend: compile rows → prepare (render + split) → group →
//! prefill + score (fork) → assemble.
//!
//! Public verbs: [`Engine::compile`] (stage 1) and [`Engine::prepare`] (stage 2) build the typed
//! inputs; the `decide*` family answers them — [`Engine::decide`] (one context),
//! [`Engine::decide_prepared`] (one prepared context, optionally extending a [`SharedPrefix`]),
//! [`Engine::decide_many`] and [`Engine::decide_group`] (many contexts, see `many`). Every entry
//! point goes through the same stage functions, so modes and groupings differ only in how rows
//! are batched.

use crate::assemble::{Assembly, Decision};
use crate::calibration::{CalibrationRegistry, CheckpointIdentity, Temperature};
use crate::error::EngineError;
use crate::fork::{score_group, GroupLogits, GroupScores, SharedPrefix};
// defined in `options` (a leaf every stage reads); re-exported at their former path
use crate::head::{HeadCache, PROBES};
use crate::options::{Layout, Mode};
pub use crate::options::{ScoreOptions, DEFAULT_MAX_INPUT_TOKENS};
use crate::prepare::PreparedContext;
use crate::rows::CompiledSchema;
use crate::schema::Schema;
use crate::tokenizer::ChatTokenizer;
use forkscore_seam::{Backend, BackendError};
use std::sync::Arc;
use std::time::Instant;

/// An engine over one backend and its tokenizer.
pub struct Engine<B: Backend> {
    backend: B,
    tokenizer: ChatTokenizer,
    identity: CheckpointIdentity,
    registry: CalibrationRegistry,
    /// Whether special-token text inside a context is tokenized as control tokens (opt-out of
    /// the default, see [`crate::prepare::untrusted`]).
    context_special_tokens: bool,
    /// Whether grouped decisions continue a cached prompt head ([`crate::head`]).
    shared_head: bool,
    heads: HeadCache<B::State>,
}

impl<B: Backend> Engine<B> {
    /// Pair a backend with its tokenizer; refuses a tokenizer whose ids exceed the embedding.
    pub fn new(
        backend: B,
        tokenizer: ChatTokenizer,
        identity: CheckpointIdentity,
        registry: CalibrationRegistry,
    ) -> Result<Engine<B>, EngineError> {
        let (tokenizer_ids, embedding_rows) = (tokenizer.id_bound(), backend.facts().vocab_size);
        if tokenizer_ids > embedding_rows {
            return Err(EngineError::TokenizerLargerThanEmbedding {
                tokenizer_ids,
                embedding_rows,
            });
        }
        Ok(Engine {
            backend,
            tokenizer,
            identity,
            registry,
            context_special_tokens: false,
            shared_head: true,
            heads: HeadCache::default(),
        })
    }

    /// Whether grouped decisions (`decide_many`, `decide_group`) prefill the prompt head their
    /// contexts share once and continue its cached state ([`crate::head`]; on by default).
    /// `false`: every context prefills its whole prompt (the reference the head is tested
    /// against; results agree within f32 rounding).
    pub fn with_shared_head(mut self, on: bool) -> Self {
        self.shared_head = on;
        self
    }

    /// Whether grouped decisions continue a cached prompt head.
    pub fn shared_head(&self) -> bool {
        self.shared_head
    }

    /// How many prompt-head states are cached.
    pub fn cached_heads(&self) -> usize {
        self.heads.len()
    }

    /// The cached state of the prompt head that every context prepared for `compiled` starts
    /// with, prefilled now on a miss; None when the head is off, `opts.mode` prefills nothing
    /// (independent), the head is too short to pay, or its prefill failed.
    pub(crate) fn group_head(
        &self,
        compiled: &CompiledSchema,
        opts: &ScoreOptions,
    ) -> Option<Arc<SharedPrefix<B::State>>> {
        if !self.shared_head || opts.mode == Mode::Independent {
            return None;
        }
        // the first probe's prompt text names the head (rendering is cheap; tokenizing the
        // two probes' prompts is not, so it runs once per prompt)
        let key = crate::prepare::render::render_prefix(
            self.tokenizer.template(),
            PROBES[0],
            compiled.schema_fields(),
            opts.layout,
        )
        .ok()?;
        let ids = self.heads.ids_for(&key, || {
            let [a, b] = PROBES.map(|p| self.prepare_in(p, compiled, usize::MAX >> 1, opts.layout));
            HeadCache::<B::State>::head_ids([a.as_ref().ok()?, b.as_ref().ok()?])
        })?;
        self.heads.state(&self.backend, &ids)
    }

    /// Opt out of tokenizing contexts as text: with `true`, special-token text inside a
    /// context (e.g. `<|im_end|>`) becomes real control tokens, as in a plain tokenizer call.
    /// Only for trusted contexts; the default (`false`) encodes it as ordinary text.
    pub fn with_context_special_tokens(mut self, allow: bool) -> Self {
        self.context_special_tokens = allow;
        self
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }
    pub fn tokenizer(&self) -> &ChatTokenizer {
        &self.tokenizer
    }
    pub fn identity(&self) -> &CheckpointIdentity {
        &self.identity
    }
    /// Whether special-token text in contexts (and texts) becomes control tokens.
    pub fn context_special_tokens(&self) -> bool {
        self.context_special_tokens
    }

    /// Stage 1: compile rows (once per schema; reuse for every context). No token bound: see
    /// [`Engine::compile_within`] for untrusted schemas.
    pub fn compile(&self, schema: &Schema) -> Result<CompiledSchema, EngineError> {
        Ok(CompiledSchema::compile(schema, &self.tokenizer)?)
    }

    /// Stage 1 under a token bound: a schema whose prompt exceeds `max_input_tokens` whatever
    /// the context is refused ([`EngineError::TooManyTokens`] with `schema_only`) right after
    /// the probe prompt is tokenized once, before any per-field work. The compiled schema is
    /// the same as [`Engine::compile`]'s and serves any bound (each context is still checked
    /// exactly against its own request's bound).
    pub fn compile_within(
        &self,
        schema: &Schema,
        max_input_tokens: usize,
    ) -> Result<CompiledSchema, EngineError> {
        if max_input_tokens == 0 {
            return Err(EngineError::ZeroMaxInputTokens);
        }
        Ok(CompiledSchema::compile_within(
            schema,
            &self.tokenizer,
            Some(max_input_tokens),
        )?)
    }

    /// The temperature a request would use, and where it comes from.
    pub fn resolve_temperature(&self, opts: &ScoreOptions) -> Result<Temperature, EngineError> {
        Ok(self
            .registry
            .resolve(opts.temperature, opts.allow_uncalibrated, &self.identity)?)
    }

    /// Stage 2: render the prefix for `context` (context-first layout), split exactly, enforce
    /// the token bound.
    pub fn prepare(
        &self,
        context: &str,
        compiled: &CompiledSchema,
        max_input_tokens: usize,
    ) -> Result<PreparedContext, EngineError> {
        self.prepare_in(context, compiled, max_input_tokens, Layout::ContextFirst)
    }

    /// [`Engine::prepare`] in a given prompt layout (`ScoreOptions::layout`): a prepared
    /// context is decided only with options of its own layout.
    pub fn prepare_in(
        &self,
        context: &str,
        compiled: &CompiledSchema,
        max_input_tokens: usize,
        layout: Layout,
    ) -> Result<PreparedContext, EngineError> {
        crate::prepare::prepare(
            &self.tokenizer,
            context,
            compiled,
            max_input_tokens,
            self.context_special_tokens,
            layout,
        )
    }

    /// Validate `opts` once for a run of many decisions: the temperature every decision uses.
    pub fn check_request(&self, opts: &ScoreOptions) -> Result<Temperature, EngineError> {
        if opts.field_batch_size == Some(0) {
            return Err(EngineError::ZeroFieldBatch);
        }
        if let Some(k) = opts.allowed_mass {
            self.check_top_k(k)?;
        }
        self.resolve_temperature(opts)
    }

    /// K of a full-vocabulary diagnostic: at most `MAX_TOP_K` and the model's vocabulary.
    pub fn check_top_k(&self, top_k: usize) -> Result<(), EngineError> {
        let max = forkscore_seam::MAX_TOP_K.min(self.backend.facts().vocab_size);
        if top_k > max {
            return Err(EngineError::TopKTooLarge { top_k, max });
        }
        Ok(())
    }

    /// Decide one context against a compiled schema.
    pub fn decide(
        &self,
        context: &str,
        compiled: &CompiledSchema,
        opts: &ScoreOptions,
    ) -> Result<Decision, EngineError> {
        let start = Instant::now();
        let temperature = self.check_request(opts)?;
        let prepared = self.prepare_in(context, compiled, opts.max_input_tokens, opts.layout)?;
        self.decide_one(None, compiled, &prepared, opts, temperature, start)
    }

    /// Decide one prepared context, extending the retained `shared` prefix state when the
    /// context's prefix strictly extends it (e.g. a context shared by many schemas); otherwise
    /// exactly like [`Engine::decide`]. Same tokens, same result.
    pub fn decide_prepared(
        &self,
        shared: Option<&SharedPrefix<B::State>>,
        compiled: &CompiledSchema,
        prepared: &PreparedContext,
        opts: &ScoreOptions,
        temperature: &Temperature,
    ) -> Result<Decision, EngineError> {
        let start = Instant::now();
        self.decide_one(shared, compiled, prepared, opts, temperature.clone(), start)
    }

    /// Prefill `ids` once as a prefix that several prepared contexts extend
    /// ([`Engine::decide_prepared`]).
    pub fn share_prefix(&self, ids: &[u32]) -> Result<SharedPrefix<B::State>, BackendError> {
        SharedPrefix::prefill(&self.backend, ids)
    }

    fn decide_one(
        &self,
        shared: Option<&SharedPrefix<B::State>>,
        compiled: &CompiledSchema,
        prepared: &PreparedContext,
        opts: &ScoreOptions,
        temperature: Temperature,
        start: Instant,
    ) -> Result<Decision, EngineError> {
        // without a shared prefix of the caller's, the cached prompt head: the same state a
        // grouped decision of this context continues, so `decide` equals `decide_many`
        let head = match shared {
            Some(_) => None,
            None => self.group_head(compiled, opts),
        };
        let shared = shared.or(head.as_deref());
        let GroupScores {
            logits,
            vocab,
            literal,
            stats,
        } = self.fork(shared, compiled, &[prepared], opts)?;
        let [rows]: [Vec<Vec<f32>>; 1] =
            logits
                .try_into()
                .map_err(|l: GroupLogits| BackendError::InvalidRequest {
                    reason: format!("{} contexts of logits for one context", l.len()),
                })?;
        let literal = literal.into_iter().next().unwrap_or_default();
        crate::finite::check_rows(compiled, &rows)?;
        crate::finite::check_literal(compiled, &literal)?;
        Ok(Assembly {
            compiled,
            prepared,
            rows,
            literal,
            vocab: vocab.into_iter().next().unwrap_or_default(),
            tokenizer: &self.tokenizer,
            stats: &stats,
            temperature,
            opts,
            start,
        }
        .decision()?)
    }

    /// Stages 4 + 5 for `members` (each prepared for `compiled`): prefill, then score every row.
    pub(crate) fn fork(
        &self,
        shared: Option<&SharedPrefix<B::State>>,
        compiled: &CompiledSchema,
        members: &[&PreparedContext],
        opts: &ScoreOptions,
    ) -> Result<GroupScores, EngineError> {
        if compiled.tokenizer_identity() != self.tokenizer.identity() {
            return Err(EngineError::ForeignSchema);
        }
        if !members
            .iter()
            .all(|p| p.belongs_to(compiled) && p.layout() == opts.layout)
        {
            return Err(EngineError::ForeignPrepared);
        }
        let splits: Vec<_> = members.iter().map(|p| p.split()).collect();
        let scores = score_group(
            &self.backend,
            shared,
            &splits,
            compiled.candidates(),
            &compiled.tree_plan(),
            opts.mode,
            opts.field_batch_size,
            opts.allowed_mass,
        )?;
        if scores.logits.len() != members.len()
            || scores.vocab.len() != members.len()
            || scores.literal.len() != members.len()
        {
            return Err(BackendError::InvalidRequest {
                reason: format!(
                    "{} contexts of logits ({} of summaries) for {}",
                    scores.logits.len(),
                    scores.vocab.len(),
                    members.len()
                ),
            }
            .into());
        }
        Ok(scores)
    }
}
