//! Attention of a few query positions (decode: one) over the KV cache, with AVX2.
//!
//! One task per (batch row, KV head, query position), or per part of its query heads when
//! there are fewer such tasks than threads. The query heads of a KV head (grouped-query
//! attention) share every cached row the task reads:
//! - scores: each key row is loaded once for four query heads (four dot products, reduced
//!   together with horizontal adds);
//! - a softmax per head with the vectorized `exp`;
//! - P V: each value row is loaded once for two heads, whose outputs stay in registers.
//!
//! `ops::attention` (the scalar reference) read each cached row once per query head and
//! called libm's `exp` per key: at 600 cached tokens it took ~10 % of a Qwen2.5-0.5B int4
//! decode step.

use super::gemv::{detect, Isa};
use super::ops::{self, V4};

/// Whether the SIMD kernel serves head dim `d` on this CPU (AVX2 + FMA; `d` a multiple of 8).
pub fn takes(d: usize) -> bool {
    cfg!(target_arch = "x86_64") && d > 0 && d.is_multiple_of(8) && matches!(detect(), Isa::Avx2 | Isa::Avx512 | Isa::Vnni)
}

/// `ops::attention`'s contract: `q` `[B, H, T, D]`, `k`/`v` `[B, KV, S, D]` (unit last
/// stride), `mask` `[B, T, S]` bytes 0/1, `out` contiguous `[B, H, T, D]`; rows that see no
/// key are zeros. Runs the SIMD kernel when `takes(D)`, else the scalar reference.
///
/// # Safety
/// As `ops::attention`.
pub unsafe fn attention(q: V4, k: V4, v: V4, mask: &[u8], scale: f32, softcap: Option<f32>, out: &mut [f32]) {
    let [b, h, t, d] = q.sizes;
    if !takes(d) {
        return ops::attention(q, k, v, mask, scale, softcap, out);
    }
    let (kvh, s) = (k.sizes[1], k.sizes[2]);
    if b * h * t == 0 {
        return;
    }
    let group = h / kvh;
    let rows = b * kvh * t;
    // fewer (row, KV head, position) tasks than threads: split each group's query heads
    let split = (crate::core::par::threads() / rows).clamp(1, group);
    let per = group.div_ceil(split);
    let parts = group.div_ceil(per);
    let optr = out.as_mut_ptr() as usize;
    let work = b * h * t * s * d;
    let task = |i: usize| unsafe {
        let (r, part) = (i / parts, i % parts);
        let (bi, kh, ti) = (r / (kvh * t), r / t % kvh, r % t);
        let h0 = kh * group + part * per;
        let h1 = (h0 + per).min((kh + 1) * group);
        let m = &mask[(bi * t + ti) * s..(bi * t + ti + 1) * s];
        let outs: Vec<*mut f32> = (h0..h1).map(|hq| (optr as *mut f32).add(((bi * h + hq) * t + ti) * d)).collect();
        let qs: Vec<*const f32> = (h0..h1).map(|hq| q.row(bi, hq, ti).as_ptr()).collect();
        // SAFETY: `takes` saw AVX2 and FMA; each task writes its own heads' output rows.
        heads(&qs, &k.at(bi, kh), &v.at(bi, kh), m, d, scale, softcap, &outs);
    };
    let n = rows * parts;
    if work < 1 << 15 {
        (0..n).for_each(task);
    } else {
        crate::core::par::for_each(n, task);
    }
}

/// The cached rows of one (batch row, KV head): row `si` starts at `ptr + si * stride`.
struct Rows {
    ptr: *const f32,
    stride: usize,
}

impl V4 {
    /// # Safety
    /// `a`, `b` within the first two sizes.
    unsafe fn at(&self, a: usize, b: usize) -> Rows {
        Rows { ptr: self.ptr.add(a * self.strides[0] + b * self.strides[1]), stride: self.strides[2] }
    }
}

/// Attention of query rows `qs` (each `d` long) over the keys and values `m` lets them see.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn heads(qs: &[*const f32], k: &Rows, v: &Rows, m: &[u8], d: usize, scale: f32, softcap: Option<f32>, outs: &[*mut f32]) {
    let n = qs.len();
    // keys past the last visible one are never read
    let hi = m.iter().rposition(|&x| x != 0).map_or(0, |p| p + 1);
    if hi == 0 {
        for &o in outs {
            std::slice::from_raw_parts_mut(o, d).fill(0.0);
        }
        return;
    }
    let dense = m[..hi].iter().all(|&x| x != 0);
    let mut p = vec![0f32; n * hi];
    scores(qs, k, hi, d, &mut p);
    let mut inv = vec![0f32; n];
    for (g, row) in p.chunks_exact_mut(hi).enumerate() {
        let mut mx = f32::NEG_INFINITY;
        for (si, x) in row.iter_mut().enumerate() {
            let mut sc = *x * scale;
            if let Some(cap) = softcap {
                sc = cap * (sc / cap).tanh();
            }
            *x = if m[si] != 0 { sc } else { f32::NEG_INFINITY };
            mx = mx.max(*x);
        }
        if mx == f32::NEG_INFINITY {
            // every visible score NaN: a zero row, as the reference
            row.fill(0.0);
            continue;
        }
        let mut total = crate::core::math::vector::exp_shift_sum_avx2(row, mx);
        if !dense {
            // masked keys come out of the clamped exp as ~0, not 0
            total = 0.0;
            for (x, &mk) in row.iter_mut().zip(m) {
                if mk == 0 {
                    *x = 0.0;
                }
                total += *x;
            }
        }
        inv[g] = 1.0 / total;
    }
    pv(&p, hi, v, d, &inv, outs);
}

/// `p[g * hi + si] = q_g . k_si` for the first `hi` keys, four query rows at a time.
#[target_feature(enable = "avx2,fma")]
unsafe fn scores(qs: &[*const f32], k: &Rows, hi: usize, d: usize, p: &mut [f32]) {
    use std::arch::x86_64::*;
    let zero = vec![0f32; d];
    for (c, chunk) in qs.chunks(4).enumerate() {
        let mut rows = [zero.as_ptr(); 4];
        rows[..chunk.len()].copy_from_slice(chunk);
        for si in 0..hi {
            let kr = k.ptr.add(si * k.stride);
            let mut a = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i < d {
                let kv = _mm256_loadu_ps(kr.add(i));
                for (acc, r) in a.iter_mut().zip(&rows) {
                    *acc = _mm256_fmadd_ps(_mm256_loadu_ps(r.add(i)), kv, *acc);
                }
                i += 8;
            }
            // lane g of `s` = the sum of a[g]
            let s = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
            let s = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
            let mut lanes = [0f32; 4];
            _mm_storeu_ps(lanes.as_mut_ptr(), s);
            for (g, &x) in lanes.iter().enumerate().take(chunk.len()) {
                p[(c * 4 + g) * hi + si] = x;
            }
        }
    }
}

/// `outs[g] = inv[g] * sum_si p[g * hi + si] v_si`, two heads at a time, 32 dims per pass.
#[target_feature(enable = "avx2,fma")]
unsafe fn pv(p: &[f32], hi: usize, v: &Rows, d: usize, inv: &[f32], outs: &[*mut f32]) {
    let n = outs.len();
    let mut g = 0;
    while g < n {
        let two = g + 1 < n;
        let p0 = p.as_ptr().add(g * hi);
        let p1 = if two { p0.add(hi) } else { p0 };
        let o1 = if two { outs[g + 1] } else { std::ptr::null_mut() };
        let i1 = if two { inv[g + 1] } else { 0.0 };
        let mut i = 0;
        while i < d {
            let w = ((d - i) / 8).min(4);
            let a = PvArgs { p0, p1, v, hi, col: i, inv0: inv[g], inv1: i1, o0: outs[g], o1 };
            match w {
                4 => pv_cols::<4>(&a),
                3 => pv_cols::<3>(&a),
                2 => pv_cols::<2>(&a),
                _ => pv_cols::<1>(&a),
            }
            i += w * 8;
        }
        g += 2;
    }
}

struct PvArgs<'a> {
    p0: *const f32,
    p1: *const f32,
    v: &'a Rows,
    hi: usize,
    col: usize,
    inv0: f32,
    inv1: f32,
    o0: *mut f32,
    /// null: one head only
    o1: *mut f32,
}

/// Columns `col .. col + 8W` of two heads' outputs.
#[target_feature(enable = "avx2,fma")]
unsafe fn pv_cols<const W: usize>(a: &PvArgs) {
    use std::arch::x86_64::*;
    let mut a0 = [_mm256_setzero_ps(); W];
    let mut a1 = [_mm256_setzero_ps(); W];
    let base = a.v.ptr.add(a.col);
    for si in 0..a.hi {
        let vr = base.add(si * a.v.stride);
        let (b0, b1) = (_mm256_broadcast_ss(&*a.p0.add(si)), _mm256_broadcast_ss(&*a.p1.add(si)));
        for w in 0..W {
            let x = _mm256_loadu_ps(vr.add(w * 8));
            a0[w] = _mm256_fmadd_ps(b0, x, a0[w]);
            a1[w] = _mm256_fmadd_ps(b1, x, a1[w]);
        }
    }
    let (s0, s1) = (_mm256_set1_ps(a.inv0), _mm256_set1_ps(a.inv1));
    for w in 0..W {
        _mm256_storeu_ps(a.o0.add(a.col + w * 8), _mm256_mul_ps(a0[w], s0));
        if !a.o1.is_null() {
            _mm256_storeu_ps(a.o1.add(a.col + w * 8), _mm256_mul_ps(a1[w], s1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::test_util::{lcg, mask};

    /// Against the scalar reference: decode over a cache with room to spare (strided K/V
    /// views), GQA groups of 7 (two chunks of four query heads, three pairs and a single in
    /// P V), MHA, several positions, padding masks, a query that sees nothing, head dims
    /// that leave 1-3 column groups after the 32-wide passes, and a softcap.
    #[test]
    fn matches_scalar_reference() {
        if !takes(64) {
            return;
        }
        let mut seed = 11u64;
        for &(b, h, kvh, t, s, cap, d, pad, softcap) in &[
            (1usize, 14usize, 2usize, 1usize, 600usize, 640usize, 64usize, false, None),
            (1, 14, 2, 1, 1, 8, 64, false, None),
            (2, 4, 4, 3, 37, 40, 40, true, None),
            (1, 8, 1, 2, 19, 19, 8, false, Some(5.0f32)),
            (3, 6, 2, 1, 70, 75, 24, true, None),
            (1, 2, 2, 5, 33, 33, 128, false, None),
        ] {
            let q: Vec<f32> = (0..b * h * t * d).map(|_| lcg(&mut seed) * 4.0).collect();
            let k: Vec<f32> = (0..b * kvh * cap * d).map(|_| lcg(&mut seed) * 4.0).collect();
            let v: Vec<f32> = (0..b * kvh * cap * d).map(|_| lcg(&mut seed)).collect();
            let mask = mask(b, t, s, pad, |ti, si| si + t <= s + ti); // causal over the last t slots
            let scale = 1.0 / (d as f32).sqrt();
            let qv = V4 { ptr: q.as_ptr(), sizes: [b, h, t, d], strides: [h * t * d, t * d, d, 1] };
            let kv = |x: &Vec<f32>| V4 { ptr: x.as_ptr(), sizes: [b, kvh, s, d], strides: [kvh * cap * d, cap * d, d, 1] };
            let mut want = vec![0f32; b * h * t * d];
            let mut got = vec![f32::NAN; b * h * t * d];
            unsafe {
                ops::attention(qv, kv(&k), kv(&v), &mask, scale, softcap, &mut want);
                attention(qv, kv(&k), kv(&v), &mask, scale, softcap, &mut got);
            }
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!((g - w).abs() <= 2e-5 * (1.0 + w.abs()), "b={b} h={h} kv={kvh} t={t} s={s} d={d} at {i}: {g} vs {w}");
            }
        }
    }
}
