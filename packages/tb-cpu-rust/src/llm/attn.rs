//! Prefill attention: many query positions at once over the keys and values of this step
//! and the cache, with grouped-query heads.
//!
//! Per (batch row, KV head) the keys are laid out once as `NR`-key panels (`panel`'s GEMM
//! layout: `[D, NR]`) and the values as `NR`-dim panels (`[S, NR]`); then every block of query
//! rows (the KV head's query heads x a few positions, which share those keys) runs two of
//! the panel GEMM's register tiles: scores = Q K^T over the keys the block can see (causal
//! prefill: the keys past the block's last visible key are skipped), a masked softmax per
//! row, and P V. Blocks are spread over the kernel thread team.

use super::gemv::{detect, Isa};
use super::ops::V4;
use super::panel::{self, Out, NR};

/// From this many query positions on, `llm_attention` takes this kernel (fewer: `ops::attention`).
pub const MIN_QUERIES: usize = 16;

/// Query positions per block (times the group size: rows that share each key panel).
const QPOS: usize = 4;

/// Whether this kernel serves these shapes (AVX2; head dim a multiple of 8, no softcap).
pub fn takes(d: usize, softcap: Option<f32>) -> bool {
    softcap.is_none() && d.is_multiple_of(8) && d > 0 && matches!(detect(), Isa::Avx2 | Isa::Avx512 | Isa::Vnni) && cfg!(target_arch = "x86_64")
}

/// `out[b, h, t] = softmax(scale * q[b, h, t] . k[b, h / group, s] | mask[b, t, s]) . v[b, h / group, s]`;
/// `q` `[B, H, T, D]`, `k`/`v` `[B, KV, S, D]` (unit last stride), `mask` `[B, T, S]` bytes 0/1,
/// `out` contiguous `[B, H, T, D]`. Rows that see no key are zeros.
///
/// # Safety
/// As `ops::attention`; and `takes(D, None)` must hold.
pub unsafe fn prefill(q: V4, k: V4, v: V4, mask: &[u8], scale: f32, out: &mut [f32]) {
    let [b, h, t, d] = q.sizes;
    let (kvh, s) = (k.sizes[1], k.sizes[2]);
    let group = h / kvh;
    let s16 = s.div_ceil(NR) * NR;
    // key panels ([s16 / NR] x [D, NR]) and value panels ([D / NR] x [s16, NR]) per (b, kv head)
    let nkv = b * kvh;
    let kp_len = s16 * d;
    let vg = d.div_ceil(NR);
    let vp_len = vg * s16 * NR;
    let mut kpan = vec![0f32; nkv * kp_len];
    let mut vpan = vec![0f32; nkv * vp_len];
    let (kpp, vpp) = (kpan.as_mut_ptr() as usize, vpan.as_mut_ptr() as usize);
    crate::core::par::for_each(nkv, |bk| {
        let (bi, kh) = (bk / kvh, bk % kvh);
        // SAFETY: each (b, kv head) writes its own slices of the panels.
        let kp = std::slice::from_raw_parts_mut((kpp as *mut f32).add(bk * kp_len), kp_len);
        let vp = std::slice::from_raw_parts_mut((vpp as *mut f32).add(bk * vp_len), vp_len);
        let mut rows = vec![0f32; NR * d];
        for p in 0..s16 / NR {
            for j in 0..NR {
                let si = p * NR + j;
                let r = &mut rows[j * d..(j + 1) * d];
                if si < s {
                    r.copy_from_slice(k.row(bi, kh, si));
                } else {
                    r.fill(0.0);
                }
            }
            panel::transpose_into(&rows, d, &mut kp[p * d * NR..(p + 1) * d * NR]);
        }
        for si in 0..s {
            let vr = v.row(bi, kh, si);
            for g in 0..vg {
                let w = NR.min(d - g * NR);
                vp[(g * s16 + si) * NR..(g * s16 + si) * NR + w].copy_from_slice(&vr[g * NR..g * NR + w]);
            }
        }
    });
    let nblk = t.div_ceil(QPOS);
    let optr = out.as_mut_ptr() as usize;
    let (kpan, vpan) = (&kpan, &vpan);
    crate::core::par::for_each(nkv * nblk, |task| {
        let (bk, blk) = (task / nblk, task % nblk);
        let (bi, kh) = (bk / kvh, bk % kvh);
        let (t0, t1) = (blk * QPOS, ((blk + 1) * QPOS).min(t));
        let kp = &kpan[bk * kp_len..(bk + 1) * kp_len];
        let vp = &vpan[bk * vp_len..(bk + 1) * vp_len];
        // rows: (position, query head of this KV head)
        let rows: Vec<(usize, usize)> = (t0..t1).flat_map(|ti| (0..group).map(move |g| (ti, kh * group + g))).collect();
        let nr = rows.len();
        // the keys this block can see end at `hi` (mask rows scanned from the end)
        let vis_end = |ti: usize| {
            let m = &mask[(bi * t + ti) * s..(bi * t + ti + 1) * s];
            m.iter().rposition(|&x| x != 0).map_or(0, |p| p + 1)
        };
        let hi = (t0..t1).map(vis_end).max().unwrap_or(0);
        let o = optr as *mut f32;
        if hi == 0 {
            for &(ti, hq) in &rows {
                std::slice::from_raw_parts_mut(o.add(((bi * h + hq) * t + ti) * d), d).fill(0.0);
            }
            return;
        }
        let hi16 = hi.div_ceil(NR) * NR;
        let mut sc = vec![0f32; nr * hi16];
        let qrows: Vec<*const f32> = rows.iter().map(|&(ti, hq)| q.row(bi, hq, ti).as_ptr()).collect();
        // scores
        for (r0, xs) in qrows.chunks(panel::MR).enumerate() {
            let r0 = r0 * panel::MR;
            for p in 0..hi16 / NR {
                let out = Out { ptr: sc.as_mut_ptr().add(r0 * hi16 + p * NR), ld: hi16, add: false, bias: None };
                panel::kernel(xs, kp.as_ptr().add(p * d * NR), d, &out);
            }
        }
        // masked softmax (zeros where masked and past `hi`)
        for (ri, &(ti, _)) in rows.iter().enumerate() {
            let m = &mask[(bi * t + ti) * s..(bi * t + ti) * s + hi];
            let row = &mut sc[ri * hi16..(ri + 1) * hi16];
            let mut mx = f32::NEG_INFINITY;
            for (x, &mk) in row[..hi].iter_mut().zip(m) {
                *x = if mk != 0 { *x * scale } else { f32::NEG_INFINITY };
                mx = mx.max(*x);
            }
            if mx == f32::NEG_INFINITY {
                row.fill(0.0);
                continue;
            }
            // `takes` saw AVX2 and FMA; masked values (-inf) come out ~0 and are zeroed below
            crate::core::math::vector::exp_shift_sum_avx2(&mut row[..hi], mx);
            let mut total = 0f32;
            for (x, &mk) in row[..hi].iter_mut().zip(m) {
                if mk == 0 {
                    *x = 0.0;
                }
                total += *x;
            }
            let inv = 1.0 / total;
            for x in row[..hi].iter_mut() {
                *x *= inv;
            }
            row[hi..].fill(0.0);
        }
        // P V into a [rows, D] buffer, then out
        let mut ob = vec![0f32; nr * vg * NR];
        let prow: Vec<*const f32> = (0..nr).map(|ri| sc.as_ptr().add(ri * hi16)).collect();
        for (r0, xs) in prow.chunks(panel::MR).enumerate() {
            let r0 = r0 * panel::MR;
            for g in 0..vg {
                let out = Out { ptr: ob.as_mut_ptr().add(r0 * vg * NR + g * NR), ld: vg * NR, add: false, bias: None };
                panel::kernel(xs, vp.as_ptr().add(g * s16 * NR), hi16, &out);
            }
        }
        for (ri, &(ti, hq)) in rows.iter().enumerate() {
            let dst = std::slice::from_raw_parts_mut(o.add(((bi * h + hq) * t + ti) * d), d);
            dst.copy_from_slice(&ob[ri * vg * NR..ri * vg * NR + d]);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::super::ops::{attention, V4};
    use super::*;

    use super::super::test_util::{lcg, mask};

    fn v4(x: &[f32], sizes: [usize; 4]) -> V4 {
        let [_, b, c, d] = sizes;
        V4 { ptr: x.as_ptr(), sizes, strides: [b * c * d, c * d, d, 1] }
    }

    /// Against `ops::attention` (one query row at a time, scalar exp) for causal prefill after a
    /// cached prefix, padding masks and odd sizes.
    #[test]
    fn prefill_matches_row_by_row() {
        if !takes(64, None) {
            return;
        }
        let mut seed = 5u64;
        for &(b, h, kvh, t, past, d, pad) in &[
            (1usize, 14usize, 2usize, 37usize, 0usize, 64usize, false),
            (1, 4, 4, 16, 5, 64, false),
            (2, 6, 2, 21, 3, 40, true),
            (1, 2, 1, 130, 0, 8, false),
        ] {
            let s = past + t;
            let q: Vec<f32> = (0..b * h * t * d).map(|_| lcg(&mut seed) * 4.0).collect();
            let k: Vec<f32> = (0..b * kvh * s * d).map(|_| lcg(&mut seed) * 4.0).collect();
            let v: Vec<f32> = (0..b * kvh * s * d).map(|_| lcg(&mut seed)).collect();
            let mask = mask(b, t, s, pad, |ti, si| si <= past + ti); // causal
            let scale = 1.0 / (d as f32).sqrt();
            let (qv, kv, vv) = (v4(&q, [b, h, t, d]), v4(&k, [b, kvh, s, d]), v4(&v, [b, kvh, s, d]));
            let mut want = vec![0f32; b * h * t * d];
            let mut got = vec![f32::NAN; b * h * t * d];
            unsafe {
                attention(qv, kv, vv, &mask, scale, None, &mut want);
                prefill(qv, kv, vv, &mask, scale, &mut got);
            }
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!((g - w).abs() <= 2e-5 * (1.0 + w.abs()), "b={b} h={h} t={t} d={d} at {i}: {g} vs {w}");
            }
        }
    }
}
