//! The group-budget flags shared by `forkscore batch` and `forkscore serve`, and the budget they
//! give for a device and a memory model.

use anyhow::{bail, Context, Result};
use forkscore_backends::candle::DeviceSpec;
use forkscore_engine::{GroupBudget, MemoryModel};

#[derive(Debug, Clone, clap::Args)]
pub struct GroupBudgetArgs {
    /// Group budget: most rows (fields × contexts) in one scoring pass.
    #[arg(long)]
    pub group_max_rows: Option<usize>,
    /// Group budget: most prefix tokens (summed over the group's contexts).
    #[arg(long)]
    pub group_max_prefix_tokens: Option<usize>,
    /// Group budget: most estimated state + activation MiB.
    #[arg(long)]
    pub group_max_mib: Option<usize>,
    /// Accelerator memory to derive the default group budget from (default: asked from the
    /// CUDA driver on cuda; on cpu and metal the fixed CPU budget).
    #[arg(long)]
    pub device_memory_gib: Option<f64>,
}

impl GroupBudgetArgs {
    /// The default budget for `device` (or `--device-memory-gib`), with each flag given
    /// overriding its part.
    pub fn budget(&self, device: DeviceSpec, memory: &MemoryModel) -> Result<GroupBudget> {
        let device_bytes = match self.device_memory_gib {
            Some(g) if g.is_finite() && g > 0.0 => Some((g * (1u64 << 30) as f64) as u64),
            Some(g) => bail!("--device-memory-gib must be a positive number, got {g}"),
            None => forkscore_frontend::device_memory::cuda_memory_bytes(device),
        };
        let mut budget = GroupBudget::for_device(device_bytes, memory);
        if let Some(r) = self.group_max_rows {
            budget.max_rows = r;
        }
        if let Some(t) = self.group_max_prefix_tokens {
            budget.max_prefix_tokens = t;
        }
        if let Some(m) = self.group_max_mib {
            budget.max_state_bytes = m
                .checked_mul(1 << 20)
                .with_context(|| format!("--group-max-mib {m} is too large"))?;
        }
        Ok(budget)
    }
}
