//! The backend seam: the only interface between the staged engine and a model.
//!
//! This crate has no tensor library in it. The engine hands a backend token ids and gets back
//! retained prefix states and f32 logits over a candidate-id list; everything about devices,
//! dtypes, layer types and checkpoint layouts lives below this seam, in `forkscore-backends`.
//!
//! - [`Backend`] and [`PrefixState`]: the five verbs and the retained state;
//! - [`ScoreRequest`]: rows, states and candidates checked once, in one constructor, and
//!   accepted by every backend as is;
//! - [`TokenTree`] and [`TreeRequest`]: a forest of suffix tokens (a choice trie, or flat rows
//!   as chains) with the nodes to project, scored by [`Backend::score_tree`];
//! - [`ModelFacts`]: typed facts about a loaded model (family, architecture, dtype, device,
//!   sizes and attention head counts);
//! - [`vocab`] and [`topk`]: opt-in full-vocabulary summaries (one f32 logsumexp and the exact
//!   top-K per position, block-max prefiltered, bitwise equal to a full log-softmax + sort);
//! - [`files`]: bounded reads of untrusted checkpoint files (regular files only, size-capped);
//! - [`BackendError`]: what a run-time call can fail with, independent of any backend's types.

pub mod backend;
pub mod error;
pub mod facts;
pub mod files;
pub mod request;
pub mod state;
pub mod topk;
pub mod tree;
pub mod vocab;

pub use backend::{score_tree_by_rows, Backend, DecodeStep, PrefixState, TreePacking};
pub use error::BackendError;
pub use facts::{Architecture, DType, Device, Family, ModelFacts, Quantization, UnknownName};
pub use request::{CandidateLogits, ScoreRequest, ScoreRow};
pub use topk::NonFiniteLogit;
pub use tree::{TokenTree, TreeNode, TreeRequest};
pub use vocab::{PositionVocab, TokenLogprob, VocabRequest, VocabRow, MAX_TOP_K};
