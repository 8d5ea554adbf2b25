//! With the `openblas` feature, links the system OpenBLAS for the CPU f32 linear layers. (The
//! CUDA kernels are compiled by the `forkscore-kernels` crate.)

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_OPENBLAS").is_some() {
        // the system OpenBLAS (Debian / Ubuntu: libopenblas-dev)
        println!("cargo:rustc-link-lib=openblas");
    }
}
