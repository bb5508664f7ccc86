//! Attention's two products for short sequences and narrow heads on AVX-512 (ViT, BERT-sized
//! layers: tens of keys, head width ≤ 64), without the packed GEMM.
//!
//! A task of `sdpa` there is a 65 × 65 × 32 score product and a 65 × 32 × 65 output product:
//! the packed GEMM's packing and edge tiles took ~2.5× the arithmetic (40 GFLOP/s of a ~100
//! GFLOP/s core, ViT at 1 thread). Here Kᵀ is copied once per task into whole 16-key vectors
//! (zero padded), a block of up to 4 query rows × 64 keys accumulates in 16 registers over the
//! head dimension (each Kᵀ vector loaded once per 4 rows, each query value broadcast once per
//! 64 keys), and the output product accumulates up to 4 rows × 64 output columns over the keys,
//! each V row loaded once per 4 rows. Tails are masked loads and stores: nothing outside the
//! operands is read or written. Float32 throughout; the sums run over the head dimension and
//! the keys in order, the order of a plain dot product.

use std::arch::x86_64::*;

/// Widest head (query/key and value) these kernels take.
pub const MAX_HEAD: usize = 64;
/// Most keys a task may have (one row of scores stays in L1).
pub const MAX_KEYS: usize = 512;

/// Whether the products of a task with these sizes run here: AVX-512 and small enough.
pub fn available(e: usize, ev: usize, nk: usize) -> bool {
    crate::core::isa::has_avx512() && e > 0 && e <= MAX_HEAD && ev > 0 && ev <= MAX_HEAD && nk > 0 && nk <= MAX_KEYS
}

/// Scratch floats `scores` needs: Kᵀ padded to whole vectors.
pub fn scratch_len(e: usize, nk: usize) -> usize {
    e * nk.next_multiple_of(16)
}

/// Calls `$f::<R, V>$args` for the block of `$rows` rows (1..=4) and `$vecs` 16-wide vectors
/// (1..=4): the register blocks are const generics, so each shape keeps its accumulators in
/// registers.
macro_rules! block {
    ($rows:expr, $vecs:expr, $f:ident $args:tt) => {
        block!(@ $rows, $vecs, $f $args; 1 1, 1 2, 1 3, 1 4, 2 1, 2 2, 2 3, 2 4, 3 1, 3 2, 3 3, 3 4, 4 1, 4 2, 4 3, 4 4)
    };
    (@ $rows:expr, $vecs:expr, $f:ident $args:tt; $($r:literal $v:literal),*) => {
        match ($rows, $vecs) {
            $(($r, $v) => $f::<$r, $v> $args,)*
            _ => unreachable!("blocks are 1..=4 rows by 1..=4 vectors"),
        }
    };
}

fn tail_mask(n: usize) -> __mmask16 {
    if n >= 16 {
        0xFFFF
    } else {
        ((1u32 << n) - 1) as __mmask16
    }
}

/// `out[r·nk + j] = scale · Σ_d q[r·q_rs + d] · k[j·k_rs + d]` for r < rows, j < nk (head
/// width e; q and k contiguous along d).
///
/// # Safety
/// `available(e, _, nk)`; q valid for `rows` rows of stride `q_rs`, k for `nk` rows of stride
/// `k_rs`, out for `rows · nk` floats; `kt` holds `scratch_len(e, nk)` floats.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn scores(q: *const f32, q_rs: usize, k: *const f32, k_rs: usize, rows: usize, nk: usize, e: usize, scale: f32, out: *mut f32, kt: &mut [f32]) {
    let nkp = nk.next_multiple_of(16);
    let kt = &mut kt[..e * nkp];
    for d in 0..e {
        let row = &mut kt[d * nkp..(d + 1) * nkp];
        for (j, x) in row[..nk].iter_mut().enumerate() {
            *x = *k.add(j * k_rs + d);
        }
        row[nk..].fill(0.0);
    }
    let kt = kt.as_ptr();
    let scale = _mm512_set1_ps(scale);
    let mut j0 = 0;
    while j0 < nkp {
        let nv = ((nkp - j0) / 16).min(4);
        let mut r = 0;
        while r < rows {
            let rr = (rows - r).min(4);
            let (qr, o) = (q.add(r * q_rs), out.add(r * nk));
            block!(rr, nv, score_block(qr, q_rs, kt, nkp, e, o, nk, j0, scale));
            r += rr;
        }
        j0 += 16 * nv;
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn score_block<const R: usize, const V: usize>(q: *const f32, q_rs: usize, kt: *const f32, nkp: usize, e: usize, out: *mut f32, nk: usize, j0: usize, scale: __m512) {
    let mut acc = [[_mm512_setzero_ps(); V]; R];
    for d in 0..e {
        let mut kv = [_mm512_setzero_ps(); V];
        for (w, x) in kv.iter_mut().enumerate() {
            *x = _mm512_loadu_ps(kt.add(d * nkp + j0 + 16 * w));
        }
        for (r, a) in acc.iter_mut().enumerate() {
            let qb = _mm512_set1_ps(*q.add(r * q_rs + d));
            for w in 0..V {
                a[w] = _mm512_fmadd_ps(qb, kv[w], a[w]);
            }
        }
    }
    for (r, a) in acc.iter().enumerate() {
        for (w, &x) in a.iter().enumerate() {
            let j = j0 + 16 * w;
            _mm512_mask_storeu_ps(out.add(r * nk + j), tail_mask(nk - j), _mm512_mul_ps(x, scale));
        }
    }
}

/// `o[r·o_rs + c] = Σ_j p[r·nk + j] · v[j·v_rs + c]` for r < rows, c < ev (v and o contiguous
/// along c).
///
/// # Safety
/// `available(_, ev, nk)`; p valid for `rows · nk` floats, v for `nk` rows of stride `v_rs`,
/// o for `rows` rows of stride `o_rs`.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn output(p: *const f32, rows: usize, nk: usize, v: *const f32, v_rs: usize, ev: usize, o: *mut f32, o_rs: usize) {
    let nv = ev.div_ceil(16);
    let mut r = 0;
    while r < rows {
        let rr = (rows - r).min(4);
        let (pr, or) = (p.add(r * nk), o.add(r * o_rs));
        block!(rr, nv, output_block(pr, nk, v, v_rs, ev, or, o_rs));
        r += rr;
    }
}

#[inline(always)]
unsafe fn output_block<const R: usize, const V: usize>(p: *const f32, nk: usize, v: *const f32, v_rs: usize, ev: usize, o: *mut f32, o_rs: usize) {
    let mut masks = [0 as __mmask16; V];
    for (w, m) in masks.iter_mut().enumerate() {
        *m = tail_mask(ev - 16 * w);
    }
    let mut acc = [[_mm512_setzero_ps(); V]; R];
    for j in 0..nk {
        let mut vv = [_mm512_setzero_ps(); V];
        for (w, x) in vv.iter_mut().enumerate() {
            *x = _mm512_maskz_loadu_ps(masks[w], v.add(j * v_rs + 16 * w));
        }
        for (r, a) in acc.iter_mut().enumerate() {
            let pb = _mm512_set1_ps(*p.add(r * nk + j));
            for w in 0..V {
                a[w] = _mm512_fmadd_ps(pb, vv[w], a[w]);
            }
        }
    }
    for (r, a) in acc.iter().enumerate() {
        for (w, &x) in a.iter().enumerate() {
            _mm512_mask_storeu_ps(o.add(r * o_rs + 16 * w), masks[w], x);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn products_match_float64_at_every_edge() {
        if !crate::core::isa::has_avx512() {
            return;
        }
        for &(rows, nk, e, ev) in &[
            (1, 1, 1, 1),
            (3, 15, 16, 17),
            (4, 16, 32, 32),
            (5, 17, 33, 64),
            (65, 65, 32, 32),
            (7, 130, 64, 48),
            (9, 512, 8, 3),
        ] {
            // row strides wider than the rows: nothing between rows may be read or written
            let (q_rs, k_rs, v_rs, o_rs) = (e + 3, e + 1, ev + 2, ev + 5);
            let q = values(rows * q_rs, 1);
            let k = values(nk * k_rs, 2);
            let v = values(nk * v_rs, 3);
            let mut s = vec![f32::NAN; rows * nk];
            let mut kt = vec![0f32; scratch_len(e, nk)];
            unsafe { scores(q.as_ptr(), q_rs, k.as_ptr(), k_rs, rows, nk, e, 0.25, s.as_mut_ptr(), &mut kt) };
            for r in 0..rows {
                for j in 0..nk {
                    let want: f64 = (0..e).map(|d| q[r * q_rs + d] as f64 * k[j * k_rs + d] as f64).sum::<f64>() * 0.25;
                    assert!((s[r * nk + j] as f64 - want).abs() < 1e-5, "scores {rows}x{nk}x{e} at {r},{j}");
                }
            }
            let mut o = vec![7.0f32; rows * o_rs];
            unsafe { output(s.as_ptr(), rows, nk, v.as_ptr(), v_rs, ev, o.as_mut_ptr(), o_rs) };
            for r in 0..rows {
                for c in 0..o_rs {
                    let got = o[r * o_rs + c];
                    if c >= ev {
                        assert_eq!(got, 7.0, "wrote past the row at {r},{c}");
                        continue;
                    }
                    let want: f64 = (0..nk).map(|j| s[r * nk + j] as f64 * v[j * v_rs + c] as f64).sum();
                    assert!((got as f64 - want).abs() < 1e-4 * (1.0 + want.abs()), "output {rows}x{nk}x{ev} at {r},{c}");
                }
            }
        }
    }
}
