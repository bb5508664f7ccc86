//! Prefill: `Y = X @ W^T` for many activation rows at once over int8 weights (AVX2).
//!
//! The GEMV loops of `gemv` compute one activation row against a tile of weight rows, so each
//! weight vector is loaded once per activation row. Here a register tile of `R` activation
//! rows x `C` weight rows shares both: each weight vector is loaded once for `R` rows, each
//! activation vector once for `C` weight rows, and the `R * C` accumulators stay in registers.
//! (int4 weights do the same inside `gemv::int4_chunk`: four activation rows per pass over a
//! tile's unpacked nibbles.)
//!
//! Every accumulator goes through exactly the same sequence of f32 operations as the GEMV
//! kernel (`gemv::x86::int8_avx2_t`) for its (activation row, weight row) pair, so the results
//! are bit-identical to the GEMV path; the tests check that (for int4 too: its batched and
//! one-row passes must agree bit for bit as well).

use super::gemv::{Act, Isa, Job};
use super::packed::Packed;
use std::sync::atomic::{AtomicBool, Ordering};

/// Fewer activation rows than this take the GEMV loops (decode and tiny batches).
pub const MIN_ROWS: usize = 4;

/// On unless a benchmark turns it off (`set_enabled`: old / new paths interleaved in one run).
static ENABLED: AtomicBool = AtomicBool::new(true);

pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Activation rows per pass over a chunk's weights (their quantized values stay in L1/L2
/// while the chunk's weight rows stream past them in pairs).
const ACT_BLOCK: usize = 32;

/// Weight rows `r0 .. r0 + nrows` of `job` for every activation row, when this path takes the
/// job (AVX2 int8 / int4 with at least `MIN_ROWS` activation rows); false otherwise.
pub fn chunk(job: &Job, r0: usize, nrows: usize, isa: Isa) -> bool {
    if job.acts.len() < MIN_ROWS || !matches!(isa, Isa::Avx2 | Isa::Avx512) || !cfg!(target_arch = "x86_64") || !enabled() {
        return false;
    }
    match job.p {
        // int4: `gemv::int4_chunk` shares each unpacked weight tile among 4 activation rows
        Packed::Int8 { .. } => {}
        _ => return false,
    }
    #[cfg(target_arch = "x86_64")]
    for (bi, block) in job.acts.chunks(ACT_BLOCK).enumerate() {
        let mut r = 0;
        while r < nrows {
            let c = if nrows - r >= 2 { 2 } else { 1 };
            let mut i = 0;
            while i < block.len() {
                let rr = (block.len() - i).min(4);
                let mut res = [[0f32; 2]; 4];
                // SAFETY: `detect` saw AVX2 and FMA; rows r0 + r .. + c exist; acts are prepared
                // for this weight (checked by the match inside).
                unsafe { x86::tile(job.p, &block[i..i + rr], r0 + r, c, &mut res) };
                for (ii, row) in res.iter().enumerate().take(rr) {
                    let ai = bi * ACT_BLOCK + i + ii;
                    for (j, v) in row.iter().enumerate().take(c) {
                        let b = job.bias.map_or(0.0, |b| b[r0 + r + j]);
                        // SAFETY: the caller of `gemv::run` promised this element is ours.
                        unsafe { *job.out.add(ai * job.ld + r0 + r + j) = v + b };
                    }
                }
                i += rr;
            }
            r += c;
        }
    }
    true
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::act_quant::QuantRow;
    use super::{Act, Packed};
    use std::arch::x86_64::*;

    /// `res[i][j]` = activation row `i` of `acts` times weight row `r + j`, `j < c`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn tile(p: &Packed, acts: &[Act], r: usize, c: usize, res: &mut [[f32; 2]; 4]) {
        match p {
            Packed::Int8 { kp, w, scale, .. } => {
                assert!((r + c) * kp <= w.len());
                let mut rows: [Option<&QuantRow>; 4] = [None; 4];
                for (d, act) in rows.iter_mut().zip(acts) {
                    match act {
                        Act::Q8(q, _) => {
                            assert!(q.q.len() == *kp);
                            *d = Some(q);
                        }
                        _ => unreachable!("activation prepared for another weight kind"),
                    }
                }
                let wp = w.as_ptr().add(r * kp);
                match (acts.len(), c) {
                    (4, 2) => int8_t::<4, 2>(wp, *kp, &rows, res),
                    (3, 2) => int8_t::<3, 2>(wp, *kp, &rows, res),
                    (2, 2) => int8_t::<2, 2>(wp, *kp, &rows, res),
                    (1, 2) => int8_t::<1, 2>(wp, *kp, &rows, res),
                    (4, _) => int8_t::<4, 1>(wp, *kp, &rows, res),
                    (3, _) => int8_t::<3, 1>(wp, *kp, &rows, res),
                    (2, _) => int8_t::<2, 1>(wp, *kp, &rows, res),
                    _ => int8_t::<1, 1>(wp, *kp, &rows, res),
                }
                // as `gemv::tile` does for AVX2: scale * (dot + 0)
                for row in res.iter_mut().take(acts.len()) {
                    for (j, v) in row.iter_mut().enumerate().take(c) {
                        *v = scale[r + j] * (*v + 0.0);
                    }
                }
            }
            _ => unreachable!("gemm takes int8 weights"),
        }
    }

    /// The `R x C` tile of `gemv::x86::int8_avx2_t`, op for op per accumulator.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn int8_t<const R: usize, const C: usize>(w: *const u8, kp: usize, rows: &[Option<&QuantRow>; 4], res: &mut [[f32; 2]; 4]) {
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let ones = _mm256_set1_epi16(1);
        let bias = _mm256_set1_epi8(-128);
        let mut qp = [std::ptr::null::<i8>(); R];
        let mut qs = [std::ptr::null::<f32>(); R];
        for i in 0..R {
            let q = rows[i].unwrap_unchecked();
            qp[i] = q.q.as_ptr();
            qs[i] = q.scale.as_ptr();
        }
        for b in 0..kp / 32 {
            let mut wv = [_mm256_setzero_si256(); C];
            for j in 0..C {
                wv[j] = _mm256_xor_si256(_mm256_loadu_si256(w.add(j * kp + b * 32) as *const _), bias);
            }
            for i in 0..R {
                let xv = _mm256_loadu_si256(qp[i].add(b * 32) as *const _);
                let ax = _mm256_abs_epi8(xv);
                let sv = _mm256_set1_ps(*qs[i].add(b));
                for j in 0..C {
                    let d = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(wv[j], xv)), ones);
                    acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), sv, acc[i][j]);
                }
            }
        }
        for i in 0..R {
            for j in 0..C {
                res[i][j] = hsum256(acc[i][j]);
            }
        }
    }

    use crate::core::math::vector::hsum256;
}

#[cfg(test)]
mod tests {
    use super::super::gemv::{detect, linear, prepare_rows, run, Job};
    use super::*;

    use super::super::half::round_f16;
    use super::super::test_util::lcg;

    fn weights(kind: &str, n: usize, k: usize, g: usize, s: &mut u64) -> (Packed, Vec<f32>) {
        if kind == "int8" {
            let q: Vec<i8> = (0..n * k).map(|_| (lcg(s) * 254.0) as i8).collect();
            let sc: Vec<f32> = (0..n).map(|_| 0.01 + lcg(s).abs() * 0.01).collect();
            let w = (0..n * k).map(|i| q[i] as f32 * sc[i / k]).collect();
            (Packed::int8(n, k, &q, &sc).unwrap(), w)
        } else {
            let nib: Vec<u8> = (0..n * k).map(|_| ((lcg(s) + 0.5) * 15.99) as u8).collect();
            let packed: Vec<u8> = (0..n * k / 2).map(|j| nib[2 * j] | (nib[2 * j + 1] << 4)).collect();
            let ng = n * k / g;
            let sc: Vec<f32> = (0..ng).map(|_| round_f16(0.01 + lcg(s).abs() * 0.01)).collect();
            let ze: Vec<f32> = (0..ng).map(|_| round_f16(lcg(s) * 0.01)).collect();
            let w = (0..n * k).map(|i| (nib[i] as f32 - 8.0) * sc[i / g] + ze[i / g]).collect();
            (Packed::int4(n, k, g, &packed, &sc, &ze).unwrap(), w)
        }
    }

    /// Bit-identical to the GEMV path (which this path replaces for M >= MIN_ROWS) and close to
    /// the dequantized f32 product, for odd row counts, odd N and K not a multiple of 128.
    #[test]
    fn gemm_matches_gemv_bit_for_bit() {
        if detect() != Isa::Avx2 && detect() != Isa::Avx512 {
            return;
        }
        let mut s = 17u64;
        for kind in ["int8", "int4"] {
            for &(n, k, g) in &[
                (1, 64, 32),
                (5, 96, 32),
                (33, 896, 32),
                (7, 192, 64),
                (130, 896, 128),
                (3, 4864, 32),
                (17, 200, 32),
            ] {
                if kind == "int4" && k % g != 0 {
                    continue;
                }
                let (p, wd) = weights(kind, n, k, g, &mut s);
                let bias: Vec<f32> = (0..n).map(|i| i as f32 * 0.1).collect();
                for m in [1usize, 3, 4, 5, 7, 9, 15] {
                    let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut s)).collect();
                    let acts = prepare_rows(&p, &x, m, detect());
                    let mut want = vec![0f32; m * n];
                    let mut got = vec![1f32; m * n];
                    // GEMV loops, one activation row at a time
                    for i in 0..m {
                        let job = Job {
                            p: &p,
                            acts: &acts[i..i + 1],
                            out: unsafe { want.as_mut_ptr().add(i * n) },
                            ld: n,
                            bias: Some(&bias),
                        };
                        unsafe { run(&[job], detect()) };
                    }
                    let job = Job {
                        p: &p,
                        acts: &acts,
                        out: got.as_mut_ptr(),
                        ld: n,
                        bias: Some(&bias),
                    };
                    unsafe { run(&[job], detect()) };
                    assert_eq!(got, want, "{kind} n={n} k={k} g={g} m={m}");
                    // and near the f32 product (int8 activations: ~1% of the row's scale)
                    let mut y = vec![0f32; m * n];
                    linear(&p, &x, m, Some(&bias), &mut y, detect());
                    assert_eq!(y, want);
                    for i in 0..m {
                        for r in 0..n {
                            let exact: f32 = (0..k).map(|c| wd[r * k + c] * x[i * k + c]).sum::<f32>() + bias[r];
                            let mag: f32 = (0..k).map(|c| (wd[r * k + c] * x[i * k + c]).abs()).sum::<f32>();
                            assert!(
                                (y[i * n + r] - exact).abs() <= 1e-2 * mag + 1e-5,
                                "{kind} {} vs {exact}",
                                y[i * n + r]
                            );
                        }
                    }
                }
            }
        }
    }
}

/// `RAYON_NUM_THREADS=1 cargo test --release --lib gemm_throughput -- --ignored --nocapture`:
/// prefill-shaped products (512 rows) through the tiled path and through the GEMV loops.
#[cfg(test)]
pub(in crate::llm) mod bench {
    use super::super::gemv::{detect, linear};
    use super::*;

    /// CPU time of the process (single-threaded runs: the machine is shared, wall time is not
    /// this code's). The panel probe uses it too.
    pub(in crate::llm) fn cpu_time() -> f64 {
        #[repr(C)]
        struct Ts {
            s: i64,
            ns: i64,
        }
        extern "C" {
            fn clock_gettime(clk: i32, ts: *mut Ts) -> i32;
        }
        let mut t = Ts { s: 0, ns: 0 };
        // SAFETY: CLOCK_PROCESS_CPUTIME_ID (2) writes one timespec.
        unsafe { clock_gettime(2, &mut t) };
        t.s as f64 + t.ns as f64 * 1e-9
    }

    #[test]
    #[ignore]
    fn gemm_throughput() {
        let m = 512;
        for kind in ["bf16", "int4", "int8"] {
            for &(n, k) in &[(1152, 896), (9728, 896), (896, 4864)] {
                let p = if kind == "bf16" {
                    Packed::bf16(n, k, &(0..n * k).map(|i| 0x3c00 | (i * 7919 % 128) as u16).collect::<Vec<u16>>()).unwrap()
                } else if kind == "int8" {
                    let q: Vec<i8> = (0..n * k).map(|i| ((i * 7919 % 255) as i32 - 127) as i8).collect();
                    Packed::int8(n, k, &q, &vec![0.01; n]).unwrap()
                } else {
                    let q: Vec<u8> = (0..n * k / 2).map(|i| (i * 7919 % 256) as u8).collect();
                    let g = n * k / 32;
                    Packed::int4(n, k, 32, &q, &vec![1.0 / 128.0; g], &vec![1.0 / 1024.0; g]).unwrap()
                };
                let x: Vec<f32> = (0..m * k).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01).collect();
                let mut y = vec![0f32; m * n];
                // (qgemm, panel)
                let modes = [(false, false), (true, false), (true, true)];
                let mut best = [f64::MAX; 3];
                for _ in 0..3 {
                    for (mi, &(on, panel)) in modes.iter().enumerate() {
                        set_enabled(on);
                        super::super::panel::set_enabled(panel);
                        let t0 = cpu_time();
                        linear(&p, &x, m, None, &mut y, detect());
                        best[mi] = best[mi].min(cpu_time() - t0);
                    }
                }
                for (mi, &(on, panel)) in modes.iter().enumerate() {
                    let s = best[mi];
                    println!(
                        "{kind} {n}x{k} m={m} qgemm={on} panel={panel}: {:7.1} ms CPU  {:5.1} GMAC/s",
                        s * 1e3,
                        (m * n * k) as f64 / s / 1e9
                    );
                }
            }
        }
    }
}
