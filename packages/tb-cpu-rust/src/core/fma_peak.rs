//! The machine's float32 FMA peak, measured: `threads` OS threads each run a loop of independent
//! fused multiply-adds on the widest vectors the CPU has (12 accumulators, more than the FMA
//! latency × issue width of any current x86 core) for a fixed count, and the total FLOP over the
//! wall time is the peak the GEMM rows report their fraction of. A measurement, not a formula:
//! clocks under turbo, FMA ports per core (Zen 4 splits 512-bit ops, server Intel parts have two
//! 512-bit FMA units) and logical CPUs that share a core all show in it.

use std::time::Instant;

use crate::core::isa;

const ACCUMULATORS: usize = 12;

/// GFLOP/s of `threads` threads running FMAs at once for about `seconds`.
pub fn fma_peak_gflops(threads: usize, seconds: f64) -> Result<f64, String> {
    if threads == 0 || threads > 1024 {
        return Err(format!("threads must be in 1..=1024, not {threads}"));
    }
    if !(seconds.is_finite() && seconds > 0.0 && seconds <= 10.0) {
        return Err(format!("seconds must be in (0, 10], not {seconds}"));
    }
    // calibrate one thread's iteration count to the requested time, then run every thread at once
    let probe = 20_000u64;
    let start = Instant::now();
    std::hint::black_box(run(probe));
    let per_iter = start.elapsed().as_secs_f64() / probe as f64;
    let iters = ((seconds / per_iter.max(1e-12)) as u64).clamp(probe, 1 << 36);
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| std::hint::black_box(run(iters)));
        }
    });
    let elapsed = start.elapsed().as_secs_f64();
    let flop = 2.0 * (ACCUMULATORS * lanes()) as f64 * iters as f64 * threads as f64;
    Ok(flop / elapsed / 1e9)
}

/// float32 lanes of the vectors `run` uses.
pub fn lanes() -> usize {
    if isa::has_avx512() {
        16
    } else if isa::has_avx2() {
        8
    } else {
        1
    }
}

fn run(iters: u64) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if isa::has_avx512() {
            // SAFETY: AVX-512 F was detected at run time.
            return unsafe { run_avx512(iters) };
        }
        if isa::has_avx2() {
            // SAFETY: AVX2 and FMA were detected at run time.
            return unsafe { run_avx2(iters) };
        }
    }
    run_scalar(iters)
}

fn run_scalar(iters: u64) -> f32 {
    let mut acc = [0.0f32; ACCUMULATORS];
    let (a, b) = (
        std::hint::black_box(0.999_999f32),
        std::hint::black_box(1e-7f32),
    );
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = x.mul_add(a, b);
        }
    }
    acc.iter().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn run_avx512(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    let a = _mm512_set1_ps(std::hint::black_box(0.999_999));
    let b = _mm512_set1_ps(std::hint::black_box(1e-7));
    let mut acc = [_mm512_setzero_ps(); ACCUMULATORS];
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm512_fmadd_ps(*x, a, b);
        }
    }
    let mut total = _mm512_setzero_ps();
    for x in acc {
        total = _mm512_add_ps(total, x);
    }
    _mm512_reduce_add_ps(total)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_avx2(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    let a = _mm256_set1_ps(std::hint::black_box(0.999_999));
    let b = _mm256_set1_ps(std::hint::black_box(1e-7));
    let mut acc = [_mm256_setzero_ps(); ACCUMULATORS];
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm256_fmadd_ps(*x, a, b);
        }
    }
    let mut out = [0.0f32; 8];
    let mut total = _mm256_setzero_ps();
    for x in acc {
        total = _mm256_add_ps(total, x);
    }
    _mm256_storeu_ps(out.as_mut_ptr(), total);
    out.iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_arguments() {
        assert!(fma_peak_gflops(0, 0.01).is_err());
        assert!(fma_peak_gflops(1, 0.0).is_err());
        assert!(fma_peak_gflops(1, f64::NAN).is_err());
        assert!(fma_peak_gflops(1, 11.0).is_err());
    }

    #[test]
    fn accumulators_converge_to_the_fixed_point() {
        // x <- x*a + b converges to b / (1 - a): every path computes the same recurrence
        let expected = ACCUMULATORS as f32 * lanes() as f32 * (1e-7 / (1.0 - 0.999_999f32));
        let got = run(5_000_000);
        assert!(
            (got - expected).abs() / expected < 0.05,
            "{got} vs {expected}"
        );
        let scalar = run_scalar(5_000_000) * lanes() as f32;
        assert!(
            (scalar - expected).abs() / expected < 0.05,
            "{scalar} vs {expected}"
        );
    }

    #[test]
    fn reports_a_positive_rate() {
        let g = fma_peak_gflops(1, 0.005).unwrap();
        assert!(g.is_finite() && g > 0.0);
    }
}
