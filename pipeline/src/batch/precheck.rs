//! The checks of `forkscore batch` (and `eval`, which runs a batch job) that need no model, run
//! before loading one: a large checkpoint takes minutes to load; a typo in the output path
//! should not cost them.

use super::{is_stdio, same_file, BatchArgs, BatchMode};
use crate::input_bounds::{check_flags, check_float_flag, check_output_dir};
use anyhow::{bail, Result};

/// Argument checks that need no model, run before loading one (a large checkpoint takes
/// minutes to load; a typo in the output path should not).
pub fn precheck(args: &BatchArgs) -> Result<()> {
    if is_stdio(&args.output) && args.resume {
        bail!("--resume needs an output file: with --output - the records go to stdout, which cannot be continued (write to a file to be able to resume)");
    }
    precheck_batch(args)?;
    if same_file(&args.input, &args.output) {
        bail!(
            "--output {} is the input file: choose another output path",
            args.output.display()
        );
    }
    let non_empty = std::fs::metadata(&args.output)
        .map(|m| m.len() > 0)
        .unwrap_or(false);
    if non_empty && !args.resume && !args.force {
        return Err(super::resume::ResumeError::Exists {
            path: args.output.clone(),
        }
        .into());
    }
    let has_context = args.context.context.is_some() || args.context.context_file.is_some();
    match (args.batch_mode(), has_context) {
        (BatchMode::Shared, false) => {
            bail!("--batch-mode shared needs --context or --context-file")
        }
        (m, true) if m != BatchMode::Shared => {
            bail!("--context/--context-file is for --batch-mode shared")
        }
        _ => Ok(()),
    }
}

/// Checks of `forkscore batch` arguments that need no model: flag ranges, the input exists and
/// is not a directory (a FIFO is not opened here, so its writer is not cut off), the output's
/// folder exists and no other job holds the output, a shared context is not empty.
pub fn precheck_batch(args: &BatchArgs) -> Result<()> {
    check_flags(&[
        ("--max-input-tokens", Some(args.scoring.max_input_tokens)),
        ("--field-batch-size", args.scoring.field_batch_size),
        ("--prefill-chunk", args.model.prefill_chunk),
        ("--top-k", Some(args.scoring.top_k)),
        ("--window", Some(args.window)),
        ("--group-max-rows", args.group.group_max_rows),
        (
            "--group-max-prefix-tokens",
            args.group.group_max_prefix_tokens,
        ),
        ("--group-max-mib", args.group.group_max_mib),
    ])?;
    check_float_flag("--temperature", args.scoring.temperature, 1e6)?;
    check_float_flag(
        "--device-memory-gib",
        args.group.device_memory_gib,
        (1u64 << 20) as f64,
    )?;
    match std::fs::metadata(&args.input) {
        _ if is_stdio(&args.input) => {}
        Ok(m) if m.is_dir() => bail!("--input {} is a directory", args.input.display()),
        Ok(m) if m.is_file() => {
            std::fs::File::open(&args.input)
                .map_err(|e| anyhow::anyhow!("cannot open input {}: {e}", args.input.display()))?;
        }
        Ok(_) => {}
        Err(e) => bail!("cannot open input {}: {e}", args.input.display()),
    }
    if !is_stdio(&args.output) {
        check_output_dir("--output", &args.output)?;
        super::lock::OutputLock::probe(&args.output)?;
    }
    if args
        .context
        .context
        .as_deref()
        .is_some_and(|c| c.trim().is_empty())
    {
        bail!("--context is empty: a shared context must have text");
    }
    Ok(())
}
