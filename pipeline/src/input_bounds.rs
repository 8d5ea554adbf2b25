//! Bounds on what the command line and the input files can make forkscore allocate or read:
//! the front ends' shared bounds ([`forkscore_frontend::bounds`]: flag ranges, bounded texts and
//! lines) under the names the CLI has always used, and the output-path check the commands run
//! before a model loads. The per-command checks that need no model live with their commands
//! (`score_cmd::precheck_score`, `batch::precheck`).

pub use forkscore_frontend::batch::records::parse_bounded;
pub use forkscore_frontend::bounds::*;
use std::path::Path;

/// The folder `output` would be created in exists (checked before a model loads).
pub fn check_output_dir(flag: &str, output: &Path) -> anyhow::Result<()> {
    let parent = output
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !parent.is_dir() {
        anyhow::bail!(
            "{flag} {}: the directory {} does not exist",
            output.display(),
            parent.display()
        );
    }
    if output.is_dir() {
        anyhow::bail!("{flag} {} is a directory", output.display());
    }
    Ok(())
}
