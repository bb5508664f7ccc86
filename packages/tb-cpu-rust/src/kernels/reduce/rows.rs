//! Vectorised passes over one contiguous float32 row: its sum (and sums of a function of its
//! elements), and the layer / RMS normalisation of a row.
//!
//! Sums run in `LANES` float32 lanes (several independent vector registers, so the adds do not
//! wait on each other) over blocks of `BLOCK` elements; each block's lanes are folded into a
//! float64 total, so the rounding error grows with the block, not with the row (a row of a million
//! elements is summed as accurately as PyTorch's cascade sum). Each pass is one generic function,
//! compiled three times (AVX-512, AVX2 + FMA, the portable baseline) and chosen at run time.

const LANES: usize = 32;
const BLOCK: usize = 1024;

/// `sum(f(v) for v in row)`, float32 lanes per block, float64 across blocks.
#[inline(always)]
fn sum_by(row: &[f32], f: impl Fn(f32) -> f32) -> f64 {
    let mut total = 0f64;
    for block in row.chunks(BLOCK) {
        let mut acc = [0f32; LANES];
        let mut chunks = block.chunks_exact(LANES);
        for ch in &mut chunks {
            for l in 0..LANES {
                acc[l] += f(ch[l]);
            }
        }
        let mut s = 0f64;
        for a in acc {
            s += a as f64;
        }
        for &v in chunks.remainder() {
            s += f(v) as f64;
        }
        total += s;
    }
    total
}

#[inline(always)]
fn sum_impl(row: &[f32]) -> f64 {
    sum_by(row, |v| v)
}

#[inline(always)]
fn sum_sq_dev_impl(row: &[f32], mu: f32) -> f64 {
    sum_by(row, |v| (v - mu) * (v - mu))
}

/// Mean, then the mean square deviation from it (two passes: no cancellation), then
/// `y = (x - mean) * rstd * w + b`; returns (mean, rstd).
#[inline(always)]
fn layer_norm_impl(x: &[f32], y: &mut [f32], w: Option<&[f32]>, b: Option<&[f32]>, eps: f32) -> (f32, f32) {
    let n = x.len();
    let mu = (sum_by(x, |v| v) / n as f64) as f32;
    let var = sum_sq_dev_impl(x, mu) / n as f64;
    let rs = (1.0 / (var + eps as f64).sqrt()) as f32;
    let y = &mut y[..n];
    match (w, b) {
        (Some(w), Some(b)) => {
            let (w, b) = (&w[..n], &b[..n]);
            for i in 0..n {
                y[i] = (x[i] - mu) * rs * w[i] + b[i];
            }
        }
        (Some(w), None) => {
            let w = &w[..n];
            for i in 0..n {
                y[i] = (x[i] - mu) * rs * w[i];
            }
        }
        (None, Some(b)) => {
            let b = &b[..n];
            for i in 0..n {
                y[i] = (x[i] - mu) * rs + b[i];
            }
        }
        (None, None) => {
            for i in 0..n {
                y[i] = (x[i] - mu) * rs;
            }
        }
    }
    (mu, rs)
}

/// `y = x * rsqrt(mean(x²) + eps) * w`; returns the rstd.
#[inline(always)]
fn rms_norm_impl(x: &[f32], y: &mut [f32], w: Option<&[f32]>, eps: f32) -> f32 {
    let n = x.len();
    let ms = sum_by(x, |v| v * v) / n as f64;
    let rs = (1.0 / (ms + eps as f64).sqrt()) as f32;
    let y = &mut y[..n];
    match w {
        Some(w) => {
            let w = &w[..n];
            for i in 0..n {
                y[i] = x[i] * rs * w[i];
            }
        }
        None => {
            for i in 0..n {
                y[i] = x[i] * rs;
            }
        }
    }
    rs
}

/// Defines `pub fn $name` that runs `$imp` compiled for the best ISA the CPU has.
macro_rules! dispatched {
    ($(#[$m:meta])* fn $name:ident($($a:ident: $t:ty),*) -> $r:ty = $imp:ident) => {
        $(#[$m])*
        pub fn $name($($a: $t),*) -> $r {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                unsafe fn avx512($($a: $t),*) -> $r {
                    $imp($($a),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($a: $t),*) -> $r {
                    $imp($($a),*)
                }
                if crate::core::isa::has_avx512() {
                    // SAFETY: the CPU has AVX-512F
                    return unsafe { avx512($($a),*) };
                }
                if crate::core::isa::has_avx2() {
                    // SAFETY: the CPU has AVX2 and FMA
                    return unsafe { avx2($($a),*) };
                }
            }
            $imp($($a),*)
        }
    };
}

dispatched!(
    /// The sum of a row, in float64.
    fn sum(row: &[f32]) -> f64 = sum_impl
);
dispatched!(
    /// The sum of the squared deviations of a row from `mu`, in float64 across blocks.
    fn sum_sq_dev(row: &[f32], mu: f32) -> f64 = sum_sq_dev_impl
);
dispatched!(
    /// Layer norm of the row `x` into `y` (at least as long), with optional weight and bias of
    /// the row's length; returns (mean, rstd).
    fn layer_norm(x: &[f32], y: &mut [f32], w: Option<&[f32]>, b: Option<&[f32]>, eps: f32) -> (f32, f32) = layer_norm_impl
);
dispatched!(
    /// RMS norm of the row `x` into `y` (at least as long), with an optional weight of the row's
    /// length; returns the rstd.
    fn rms_norm(x: &[f32], y: &mut [f32], w: Option<&[f32]>, eps: f32) -> f32 = rms_norm_impl
);

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> Vec<Vec<f32>> {
        let mut out = vec![vec![], vec![1.5], vec![3.0; 31], vec![-2.0; 33]];
        let mut s = 7u32;
        for n in [64, 255, 1024, 1025, 5000, 100_000] {
            out.push(
                (0..n)
                    .map(|_| {
                        s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                        (s >> 8) as f32 / (1u32 << 24) as f32 * 8.0 - 3.0
                    })
                    .collect(),
            );
        }
        out
    }

    #[test]
    fn sums_match_a_float64_sum_on_every_isa_path() {
        for row in rows() {
            let want: f64 = row.iter().map(|&v| v as f64).sum();
            let tol = 1e-5 * (1.0 + row.iter().map(|v| v.abs() as f64).sum::<f64>());
            assert!((sum(&row) - want).abs() <= tol, "n={} {} vs {want}", row.len(), sum(&row));
            assert!((sum_impl(&row) - want).abs() <= tol);
        }
    }

    #[test]
    fn norms_match_float64_references() {
        for row in rows().into_iter().filter(|r| !r.is_empty()) {
            let n = row.len();
            let w: Vec<f32> = (0..n).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
            let b: Vec<f32> = (0..n).map(|i| (i % 5) as f32 - 2.0).collect();
            let mu = row.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
            let var = row.iter().map(|&v| (v as f64 - mu).powi(2)).sum::<f64>() / n as f64;
            let rs = 1.0 / (var + 1e-5).sqrt();
            let mut y = vec![0f32; n];
            let (m, r) = layer_norm(&row, &mut y, Some(&w), Some(&b), 1e-5);
            assert!((m as f64 - mu).abs() < 1e-5 && (r as f64 - rs).abs() <= 1e-4 * rs);
            for i in 0..n {
                let want = (row[i] as f64 - mu) * rs * w[i] as f64 + b[i] as f64;
                assert!((y[i] as f64 - want).abs() < 1e-4 * (1.0 + want.abs()), "layer norm n={n} i={i}");
            }
            let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / n as f64;
            let rs = 1.0 / (ms + 1e-6).sqrt();
            let r = rms_norm(&row, &mut y, None, 1e-6);
            assert!((r as f64 - rs).abs() <= 1e-5 * rs);
            for i in 0..n {
                assert!((y[i] as f64 - row[i] as f64 * rs).abs() < 1e-4 * (1.0 + (row[i] as f64 * rs).abs()));
            }
        }
    }

    #[test]
    fn nan_and_infinity_propagate() {
        let mut row = vec![1.0f32; 100];
        row[37] = f32::NAN;
        assert!(sum(&row).is_nan());
        let mut y = vec![0f32; 100];
        let (m, _) = layer_norm(&row, &mut y, None, None, 1e-5);
        assert!(m.is_nan() && y.iter().all(|v| v.is_nan()));
        row[37] = f32::INFINITY;
        assert!(sum(&row).is_infinite());
        rms_norm(&row, &mut y, None, 1e-6);
        assert!(y[37].is_nan() && y[0] == 0.0, "inf / sqrt(inf) is NaN and 1 / inf is 0, as in PyTorch");
    }
}
