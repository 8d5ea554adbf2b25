use std::arch::x86_64::*;
use std::time::Instant;
extern "C" { fn cblas_sgemm(o:i32,ta:i32,tb:i32,m:i32,n:i32,k:i32,al:f32,a:*const f32,lda:i32,b:*const f32,ldb:i32,be:f32,c:*mut f32,ldc:i32); fn openblas_set_num_threads(n:i32); }
const NR: usize = 16;
const MR: usize = 6;
static mut KC: usize = 256;
static mut MC: usize = 72;
const NCP: usize = 8;

fn pack(w: &[f32], n: usize, k: usize) -> Vec<f32> {
    let panels = n.div_ceil(NR);
    let mut p = vec![0f32; panels * NR * k];
    for pi in 0..panels { for kk in 0..k { for c in 0..NR { let col = pi*NR + c; if col < n { p[(pi*k + kk)*NR + c] = w[col*k + kk]; } } } }
    p
}

#[target_feature(enable = "avx2,fma")]
unsafe fn micro<const R: usize>(kc: usize, a: *const f32, lda: usize, b: *const f32, c: *mut f32, ldc: usize, first: bool) {
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    if !first { for r in 0..R { acc[r][0] = _mm256_loadu_ps(c.add(r*ldc)); acc[r][1] = _mm256_loadu_ps(c.add(r*ldc+8)); } }
    let mut bp = b;
    for kk in 0..kc {
        let b0 = _mm256_loadu_ps(bp); let b1 = _mm256_loadu_ps(bp.add(8));
        for r in 0..R { let av = _mm256_broadcast_ss(&*a.add(kk*lda + r)); acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]); acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]); }
        bp = bp.add(NR);
    }
    for r in 0..R { _mm256_storeu_ps(c.add(r*ldc), acc[r][0]); _mm256_storeu_ps(c.add(r*ldc+8), acc[r][1]); }
}

/// y (m, n) = x (m, k) · W^T with W packed; panels p0..p1 only. n multiple of 16 here.
unsafe fn gemm_packed(m: usize, n: usize, k: usize, x: &[f32], wp: &[f32], y: &[f32], p0: usize, p1: usize) {
    let groups = m.div_ceil(MR);
    let mut ap = vec![0f32; groups * MR * k];
    for g in 0..groups {
        let rows = MR.min(m - g*MR);
        let dst = &mut ap[g*MR*k..][..MR*k];
        for r in 0..rows { let src = &x[(g*MR + r)*k..][..k]; for kk in 0..k { dst[kk*MR + r] = src[kk]; } }
    }
    let tile = |jc: usize, ic: usize, pc: usize| {
        let je = (jc + NCP).min(p1);
        let mc = MC.min(m - ic);
        let kc = KC.min(k - pc);
                for pi in jc..je {
                    let b = wp.as_ptr().add((pi*k + pc)*NR);
                    let mut ir = 0;
                    while ir < mc {
                        let r = MR.min(mc - ir);
                        let a = ap.as_ptr().add((ic+ir)*k + pc*MR);
                        let c = (y.as_ptr() as *mut f32).add((ic+ir)*n + pi*NR);
                        match r { 6 => micro::<6>(kc,a,MR,b,c,n,pc==0), 5 => micro::<5>(kc,a,MR,b,c,n,pc==0), 4 => micro::<4>(kc,a,MR,b,c,n,pc==0), 3 => micro::<3>(kc,a,MR,b,c,n,pc==0), 2 => micro::<2>(kc,a,MR,b,c,n,pc==0), _ => micro::<1>(kc,a,MR,b,c,n,pc==0) }
                        ir += r;
                    }
                }
    };
    if k <= 1536 {
        for jc in (p0..p1).step_by(NCP) { for ic in (0..m).step_by(MC) { for pc in (0..k).step_by(KC) { tile(jc, ic, pc) } } }
    } else {
        for pc in (0..k).step_by(KC) { for ic in (0..m).step_by(MC) { for jc in (p0..p1).step_by(NCP) { tile(jc, ic, pc) } } }
    }
}

fn main() {
    unsafe { KC = std::env::var("KC").map(|v| v.parse().unwrap()).unwrap_or(256); MC = std::env::var("MC").map(|v| v.parse().unwrap()).unwrap_or(72); }
    unsafe { openblas_set_num_threads(1) };
    for &(m, n, k) in &[(480usize, 896usize, 4864usize), (480, 9728, 896)] {
        let x: Vec<f32> = (0..m*k).map(|i| ((i*7919 % 1000) as f32)/1000.0 - 0.5).collect();
        let w: Vec<f32> = (0..n*k).map(|i| ((i*104729 % 1000) as f32)/1000.0 - 0.5).collect();
        let wp = pack(&w, n, k);
        let mut y1 = vec![0f32; m*n]; let mut y2 = vec![0f32; m*n];
        let fl = 2.0*(m*n*k) as f64;
        let reps = 7;
        let mut best_b = f64::MAX; let mut best_o = f64::MAX;
        for _ in 0..reps {
            let t = Instant::now();
            unsafe { cblas_sgemm(101,111,112,m as i32,n as i32,k as i32,1.0,x.as_ptr(),k as i32,w.as_ptr(),k as i32,0.0,y1.as_mut_ptr(),n as i32) };
            best_b = best_b.min(t.elapsed().as_secs_f64());
            let t = Instant::now();
            unsafe { gemm_packed(m,n,k,&x,&wp,&y2,0,n/NR) };
            best_o = best_o.min(t.elapsed().as_secs_f64());
        }
        let d = y1.iter().zip(&y2).map(|(a,b)| (a-b).abs()).fold(0f32, f32::max);
        println!("{m}x{n}x{k}: openblas {:.1} GF/s, ours {:.1} GF/s, maxdiff {d:e}", fl/best_b/1e9, fl/best_o/1e9);
    }
}
