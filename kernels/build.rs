//! Compiles the CUDA kernels under `cuda/` with nvcc when the `cuda` feature is on, into one
//! fat binary per source (machine code for `CUDA_COMPUTE_CAP`, default 90 → sm_90a, plus
//! compute_80 PTX that the driver can compile for any other GPU from Ampere on), embedded in the
//! library with `include_bytes!` (see `src/lib.rs`). Without the feature nothing is compiled and
//! nothing is needed.

use std::path::PathBuf;
use std::process::Command;

const KERNELS: &[&str] = &[
    "gdn_recurrent",
    "gdn_pointwise",
    "flash_attn",
    "vocab_topk",
    "swiglu",
    "gdn_chunked",
    "add_rms_norm",
    "heads_norm_rope",
];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    for k in KERNELS {
        println!("cargo:rerun-if-changed=cuda/{k}.cu");
    }
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let nvcc = std::env::var_os("CUDA_HOME")
        .map(|h| PathBuf::from(h).join("bin").join("nvcc"))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("nvcc"));
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    let cap: String = cap.chars().filter(|c| c.is_ascii_digit()).collect();
    // Hopper's architecture-specific features need the `a` target (sm_90a).
    let arch = if cap == "90" {
        "90a".to_string()
    } else {
        cap.clone()
    };
    for k in KERNELS {
        let src = format!("cuda/{k}.cu");
        let dst = out.join(format!("{k}.fatbin"));
        let status = Command::new(&nvcc)
            .args(["--fatbin", "-O3", "-std=c++17"])
            .arg(format!("-gencode=arch=compute_{arch},code=sm_{arch}"))
            .arg("-gencode=arch=compute_80,code=compute_80")
            .arg("-o")
            .arg(&dst)
            .arg(&src)
            .status()
            .unwrap_or_else(|e| {
                panic!(
                    "the `cuda` feature needs nvcc to build {src}: running {} failed: {e} \
                     (set CUDA_HOME, or run scripts/cuda-toolchain.sh)",
                    nvcc.display()
                )
            });
        assert!(status.success(), "nvcc failed on {src} ({status})");
    }
}
