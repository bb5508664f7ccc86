//! Scaled dot-product attention, tiled by query blocks: each task takes one (batch, head,
//! 128-query block), computes its scores against the keys it may see with a packed GEMM,
//! applies the mask and the exponentials of a numerically stable softmax in place, multiplies
//! by V, and divides each output row by its sum (S / E times fewer multiplies than normalising
//! the scores). Only a 128×S tile of scores ever exists, never the L×S matrix; causal blocks skip
//! masked keys.

use crate::core::mem::{with_scratch, Mem, SPtr};
use std::cell::RefCell;
use crate::kernels::gemm::{sgemm, Mat};
use crate::core::math::scalar;
use crate::core::tensor::{DType, View};

/// Query rows per task: K and V are packed once per block, so 128 packs them half as often as
/// 64 did (no speed difference measurable above this machine's noise at T = 128..1024, D = 64);
/// the score tile is BQ × S.
const BQ: usize = 128;

thread_local! {
    /// A task's score tile and row reciprocals, kept per thread (a fresh zeroed vector per task
    /// cost an allocation and a memset each: 32 tasks of 65 × 65 per ViT attention call).
    static TILE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// # Safety
/// Every view must have been validated by its step builder against the buffers of `mem`. K and V
/// may have fewer heads than Q when that count divides Q's (grouped-query attention: query head
/// `hi` reads key/value head `hi / (H / Hkv)`). `bf16`: q, k and v are bfloat16 values (a
/// bfloat16 model's attention): both products may take bfloat16 operands, the probabilities
/// rounded to bfloat16 as eager's bfloat16 flash attention rounds them (`attention_pairs`,
/// where the CPU has AVX-512 BF16).
///
/// `nan_row_masked`: a query row whose every score is NaN is taken as fully masked (weights 0),
/// as eager's kernels of torch's AVX-512 capability do; otherwise its weights are NaN, as the
/// AVX2 and baseline ones give (`lowering/attention.py` `eager_nan_row_masked`).
#[allow(clippy::too_many_arguments)]
pub unsafe fn sdpa(mem: &Mem, q: &View, k: &View, v: &View, mask: Option<&View>, o: &View, lse: &View, causal: bool, scale: f32, bf16: bool, nan_row_masked: bool) {
    let (b, h, l, e) = (q.sizes[0], q.sizes[1], q.sizes[2], q.sizes[3]);
    let (s, ev) = (k.sizes[2], v.sizes[3]);
    if b * h * l == 0 {
        return;
    }
    let group = h / k.sizes[1];
    let (pq, pk, pv, po, pl) = (mem.ptr::<f32>(q), mem.ptr::<f32>(k), mem.ptr::<f32>(v), mem.ptr::<f32>(o), mem.ptr::<f32>(lse));
    let pm = mask.map(|m| (SPtr(mem.byte_ptr(m)), m));
    #[cfg(target_arch = "x86_64")]
    let pairs = bf16 && super::attention_pairs::available();
    #[cfg(not(target_arch = "x86_64"))]
    let pairs = { let _ = bf16; false };
    let qblocks = l.div_ceil(BQ);
    let tasks = b * h * qblocks;
    let task = |t: usize| {
        let (bh, qb) = (t / qblocks, t % qblocks);
        let (bi, hi) = (bh / h, bh % h);
        let hk = hi / group;
        let i0 = qb * BQ;
        let rows = BQ.min(l - i0);
        let nk = if causal { s.min(i0 + rows) } else { s };
        let qp = pq.add(bi * q.strides[0] + hi * q.strides[1] + i0 * q.strides[2]);
        let kp = pk.add(bi * k.strides[0] + hk * k.strides[1]);
        let vp = pv.add(bi * v.strides[0] + hk * v.strides[1]);
        let op = po.add(bi * o.strides[0] + hi * o.strides[1] + i0 * o.strides[2]);
        let lp = pl.add(bi * lse.strides[0] + hi * lse.strides[1] + i0 * lse.strides[2]);
        // (no keys: the float32 path writes the zero rows)
        let pairs = pairs && nk > 0;
        #[cfg(target_arch = "x86_64")]
        let pair_len = if pairs { super::attention_pairs::scratch_len(rows, nk, e, ev) } else { 0 };
        #[cfg(not(target_arch = "x86_64"))]
        let pair_len = 0;
        // short sequences, narrow heads, rows contiguous along the head: without the packed GEMM
        #[cfg(target_arch = "x86_64")]
        let small = !pairs
            && q.strides[3] == 1
            && k.strides[3] == 1
            && v.strides[3] == 1
            && o.strides[3] == 1
            && super::attention_small::available(e, ev, nk);
        #[cfg(not(target_arch = "x86_64"))]
        let small = false;
        #[cfg(target_arch = "x86_64")]
        let small_len = if small { super::attention_small::scratch_len(e, nk) } else { 0 };
        #[cfg(not(target_arch = "x86_64"))]
        let small_len = 0;
        let pair_len = pair_len.max(small_len);
        with_scratch(&TILE, rows * nk.max(1) + rows + pair_len, |tile| {
            let (sc, rest) = tile.split_at_mut(rows * nk.max(1));
            let (inv, pair_scratch) = rest.split_at_mut(rows);
            // (the pair operands' 32-bit words, in the tile's scratch)
            let pair_scratch = std::slice::from_raw_parts_mut(pair_scratch.as_mut_ptr() as *mut u32, pair_scratch.len());
            inv.fill(1.0);
            let scp = SPtr(sc.as_mut_ptr());
            #[cfg(target_arch = "x86_64")]
            if pairs {
                super::attention_pairs::scores(qp, q.strides[2], q.strides[3], kp, k.strides[2], k.strides[3], rows, nk, e, scale, scp.get(), pair_scratch);
            }
            #[cfg(target_arch = "x86_64")]
            if small {
                let kt = std::slice::from_raw_parts_mut(pair_scratch.as_mut_ptr() as *mut f32, pair_scratch.len());
                super::attention_small::scores(qp, q.strides[2], kp, k.strides[2], rows, nk, e, scale, scp.get(), kt);
            }
            if nk > 0 && !pairs && !small {
                sgemm(
                    rows,
                    nk,
                    e,
                    Mat { p: SPtr(qp), rs: q.strides[2] as isize, cs: q.strides[3] as isize },
                    Mat { p: SPtr(kp), rs: k.strides[3] as isize, cs: k.strides[2] as isize },
                    Mat { p: scp, rs: nk as isize, cs: 1 },
                    scale,
                    false,
                    1,
                );
            }
            for r in 0..rows {
                let row = &mut sc[r * nk..(r + 1) * nk];
                let qi = i0 + r;
                if let Some((mp, m)) = &pm {
                    apply_mask(row, mp.get().add((bi * m.strides[0] + hi * m.strides[1] + qi * m.strides[2]) * m.dtype.size()), m.strides[3], m.dtype);
                }
                // a causal row sees keys 0..=qi: only that prefix is exponentiated, the rest is 0
                let valid = if causal { nk.min(qi + 1) } else { nk };
                let (seen, hidden) = row.split_at_mut(valid);
                hidden.fill(0.0);
                let mut mx = row_max(seen);
                // every score NaN (a NaN in the query row): `row_max` skips NaN and says -inf.
                // Eager's AVX2 / baseline kernels give a row of NaN (NaN as the shift makes every
                // weight NaN); its AVX-512 ones a fully masked row, as -inf reads here.
                if mx == f32::NEG_INFINITY && !nan_row_masked && seen.iter().any(|v| v.is_nan()) {
                    mx = f32::NAN;
                }
                if mx == f32::NEG_INFINITY {
                    seen.fill(0.0);
                    *lp.add(r * lse.strides[2]) = f32::NEG_INFINITY;
                    continue;
                }
                let sum = exp_shift_sum(seen, mx);
                inv[r] = 1.0 / sum;
                *lp.add(r * lse.strides[2]) = mx + sum.ln();
            }
            #[cfg(target_arch = "x86_64")]
            if pairs {
                super::attention_pairs::output(scp.get(), rows, nk, vp, v.strides[2], v.strides[3], ev, op, o.strides[2], o.strides[3], pair_scratch);
            }
            #[cfg(target_arch = "x86_64")]
            if small {
                super::attention_small::output(scp.get(), rows, nk, vp, v.strides[2], ev, op, o.strides[2]);
            }
            if !pairs && !small {
                sgemm(
                    rows,
                    ev,
                    nk,
                    Mat { p: scp, rs: nk as isize, cs: 1 },
                    Mat { p: SPtr(vp), rs: v.strides[2] as isize, cs: v.strides[3] as isize },
                    Mat { p: SPtr(op), rs: o.strides[2] as isize, cs: o.strides[3] as isize },
                    1.0,
                    false,
                    1,
                );
            }
            for (r, &f) in inv.iter().enumerate() {
                if f != 1.0 {
                    let orow = op.add(r * o.strides[2]);
                    if o.strides[3] == 1 {
                        // contiguous: a loop the compiler vectorises
                        for x in std::slice::from_raw_parts_mut(orow, ev) {
                            *x *= f;
                        }
                    } else {
                        for j in 0..ev {
                            *orow.add(j * o.strides[3]) *= f;
                        }
                    }
                }
            }
        });
    };
    if tasks > 1 {
        crate::core::par::for_each(tasks, task);
    } else {
        task(0);
    }
}

/// Adds a float mask row (at `mp`, element stride `ms`) to the scores, or sets the scores a
/// boolean mask row hides to -inf.
///
/// # Safety
/// `mp` must be valid for `row.len()` elements of `dtype` at stride `ms`.
unsafe fn apply_mask(row: &mut [f32], mp: *const u8, ms: usize, dtype: DType) {
    if dtype == DType::Bool {
        for (j, x) in row.iter_mut().enumerate() {
            if *mp.add(j * ms) == 0 {
                *x = f32::NEG_INFINITY;
            }
        }
    } else if ms == 1 {
        let add = std::slice::from_raw_parts(mp as *const f32, row.len());
        for (x, a) in row.iter_mut().zip(add) {
            *x += a;
        }
    } else {
        let mp = mp as *const f32;
        for (j, x) in row.iter_mut().enumerate() {
            *x += *mp.add(j * ms);
        }
    }
}

/// Maximum of a row (NaN-propagating like `f32::max` folds are not: a NaN score row stays NaN
/// through the exponentials anyway). Lane-wise so it vectorises.
fn row_max(row: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; 16];
    let mut chunks = row.chunks_exact(16);
    for ch in &mut chunks {
        for l in 0..16 {
            m[l] = if ch[l] > m[l] { ch[l] } else { m[l] };
        }
    }
    let mut mx = chunks.remainder().iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    for v in m {
        mx = mx.max(v);
    }
    mx
}

/// row[i] = exp(row[i] - shift), returning their sum.
fn exp_shift_sum(row: &mut [f32], shift: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::core::isa::has_avx512() {
            // SAFETY: the CPU has AVX-512F
            return unsafe { crate::core::math::vector::exp_shift_sum_avx512(row, shift) };
        }
        if crate::core::isa::has_avx2() {
            // SAFETY: the CPU has AVX2 and FMA
            return unsafe { crate::core::math::vector::exp_shift_sum_avx2(row, shift) };
        }
    }
    let mut sum = 0f32;
    for x in row.iter_mut() {
        *x = scalar::exp(*x - shift);
        sum += *x;
    }
    sum
}

pub use steps::STEPS;

/// The step kinds of this family: sdpa.
mod steps {
    use super::*;
    use crate::core::tensor::need;
    use crate::kernels::registry::{f32s, infallible, Args, Built, StepDef};

    pub const STEPS: &[StepDef] = &[StepDef::core("sdpa", sdpa_step)];

    crate::step_params!(struct SdpaParams { causal: bool, scale: f64, bf16: Option<bool>, nan_row_masked: Option<bool> });

    /// q, k, v, mask? -> out, lse (the logsumexp of each query row); `bf16`: q, k and v are
    /// bfloat16 values widened (a bfloat16 model's attention)
    fn sdpa_step(a: &Args) -> Built {
        let p: SdpaParams = a.params()?;
        let (q, k, v, o, lse) = (a.take(0)?, a.take(1)?, a.take(2)?, a.out(0)?, a.out(1)?);
        f32s(&[&q, &k, &v, &o, &lse])?;
        need(q.rank() == 4 && k.rank() == 4 && v.rank() == 4 && o.rank() == 4 && lse.rank() == 3, "sdpa needs 4-d q/k/v")?;
        let (b, h, l, e) = (q.sizes[0], q.sizes[1], q.sizes[2], q.sizes[3]);
        let s = k.sizes[2];
        let hk = k.sizes[1];
        need((hk > 0 && h % hk == 0) || (h == 0 && hk == 0), "sdpa: the key/value heads must divide the query heads")?;
        need(k.sizes == [b, hk, s, e] && v.sizes[..3] == [b, hk, s] && o.sizes == [b, h, l, v.sizes[3]], "sdpa shapes")?;
        need(lse.sizes == [b, h, l], "sdpa logsumexp shape")?;
        let mask = a.opt(3);
        if let Some(m) = &mask {
            need(m.sizes == [b, h, l, s], "sdpa mask must be broadcast to (B, H, L, S)")?;
        }
        let (causal, scale) = (p.causal, p.scale as f32);
        // the model computes it in bfloat16: bfloat16 products allowed (`attention_pairs`)
        let bf16 = p.bf16.unwrap_or(false);
        let nan_row_masked = p.nan_row_masked.unwrap_or(false);
        infallible(move |mem| unsafe { sdpa(mem, &q, &k, &v, mask.as_ref(), &o, &lse, causal, scale, bf16, nan_row_masked) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::element::{bf16_to_f32, f32_to_bf16};

    /// Both products on bfloat16 pairs (`bf16`, where the CPU has them) and in float32, against
    /// a float64 attention of the same (bfloat16-valued) q, k, v: odd depths and key counts (a
    /// last pair half empty), several query blocks, causal, one key, strided q. The pair path's
    /// error within 2^-7 of the output's magnitude Σ p·|v| (the probabilities' rounding);
    /// pairs in the wrong halves miss by far more.
    #[test]
    fn bfloat16_products_match_a_float64_attention() {
        let _g = crate::kernels::gemm::tests::LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let val = |i: usize, m: usize| bf16_to_f32(f32_to_bf16(((i * m % 29) as f32 - 14.0) / 9.0));
        for &(b, h, l, s, e, ev, causal, strided) in &[
            (1, 2, 65, 65, 32, 32, false, false),
            (2, 1, 7, 131, 17, 5, false, true),
            (1, 1, 200, 200, 64, 64, true, false),
            (1, 1, 3, 1, 2, 3, false, false),
        ] {
            // q laid out (b, l, h, e) when strided: a transposed view, as a projection leaves it
            let qs = if strided { [l * h * e, e, h * e, 1] } else { [h * l * e, l * e, e, 1] };
            let mut q: Vec<f32> = (0..b * h * l * e).map(|i| val(i, 7)).collect();
            let mut k: Vec<f32> = (0..b * h * s * e).map(|i| val(i, 11)).collect();
            let mut v: Vec<f32> = (0..b * h * s * ev).map(|i| val(i, 5)).collect();
            let scale = 1.0 / (e as f32).sqrt();
            let mut want = vec![0f64; b * h * l * ev];
            let mut magnitude = vec![0f64; b * h * l * ev];
            for bh in 0..b * h {
                let (bi, hi) = (bh / h, bh % h);
                for i in 0..l {
                    let qrow = |d: usize| q[bi * qs[0] + hi * qs[1] + i * qs[2] + d] as f64;
                    let seen = if causal { (i + 1).min(s) } else { s };
                    let sc: Vec<f64> = (0..seen).map(|j| (0..e).map(|d| qrow(d) * k[(bh * s + j) * e + d] as f64).sum::<f64>() * scale as f64).collect();
                    let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let ex: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
                    let sum: f64 = ex.iter().sum();
                    for c in 0..ev {
                        let at = (bh * l + i) * ev + c;
                        want[at] = (0..seen).map(|j| ex[j] / sum * v[(bh * s + j) * ev + c] as f64).sum();
                        magnitude[at] = (0..seen).map(|j| ex[j] / sum * (v[(bh * s + j) * ev + c] as f64).abs()).sum();
                    }
                }
            }
            let mut o = vec![f32::NAN; b * h * l * ev];
            let mut lse = vec![0f32; b * h * l];
            let mem = Mem {
                ptrs: vec![q.as_mut_ptr() as *mut u8, k.as_mut_ptr() as *mut u8, v.as_mut_ptr() as *mut u8, o.as_mut_ptr() as *mut u8, lse.as_mut_ptr() as *mut u8],
            };
            let qv = View::new(0, &[b, h, l, e], &qs, DType::F32);
            let kv = View::new(1, &[b, h, s, e], &[h * s * e, s * e, e, 1], DType::F32);
            let vv = View::new(2, &[b, h, s, ev], &[h * s * ev, s * ev, ev, 1], DType::F32);
            let ov = View::new(3, &[b, h, l, ev], &[h * l * ev, l * ev, ev, 1], DType::F32);
            let lv = View::new(4, &[b, h, l], &[h * l, l, 1], DType::F32);
            let pairs = crate::kernels::gemm::bf16::pairs_available();
            for bf16 in [false, true] {
                o.fill(f32::NAN);
                unsafe { sdpa(&mem, &qv, &kv, &vv, None, &ov, &lv, causal, scale, bf16, false) };
                for (i, (&got, &w)) in o.iter().zip(&want).enumerate() {
                    let tol = if bf16 && pairs { 2f64.powi(-7) * magnitude[i] + 1e-6 } else { 1e-5 * (1.0 + w.abs()) };
                    assert!((got as f64 - w).abs() <= tol, "case l{l} s{s} e{e} ev{ev} causal {causal} bf16 {bf16} [{i}]: {got} vs {w}");
                }
            }
        }
    }
}
