//! What a backend retains of a prefilled prefix, as the engine sees it: a length and a size.

/// A retained prefix state (attention K/V, and conv + recurrent state for linear-attention
/// layers). Produced by [`Backend::prefill`]; read-only afterwards.
pub trait PrefixState: Send + Sync {
    /// Number of prefix tokens this state covers.
    fn len(&self) -> usize;
    /// True when the state covers no token.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes held by the state (for memory budgets and telemetry).
    fn nbytes(&self) -> usize;
}
