//! The GEMM of a bfloat16 model's convolution (1×1, or any kernel through im2col) on
//! `vdpbf16ps`: the weights rounded to bfloat16 and packed in pairs along K once per call, each
//! block of B (the input plane itself for a 1×1 convolution, or the im2col rows) rounded and
//! packed in pairs of rows for the pair micro-kernel (`gemm::bf16::x86::Pairs`), float32 sums,
//! the convolution's epilogue on the float32 result. Half the float32 kernel's cycles per
//! multiply-add, for one extra pass over B (K × N elements against the product's M × K × N).
//!
//! Only for convolutions the model computes in bfloat16 (the step's `bf16`): the inputs are
//! bfloat16 values already; the weights are rounded where a folded batch norm scaled them (a
//! rounding eager makes of the convolution's result instead). `vcvtneps2bf16` rounds to nearest
//! even and flushes subnormals; NaN and ±inf stay NaN and ±inf.

use crate::core::element::f32_to_bf16;
use crate::kernels::gemm::bf16::x86::{bf16_lanes, Pairs};
use crate::kernels::gemm::own::{drive_packed_ab, pack_a_slices_for, packed_layout, Isa};
use crate::kernels::gemm::{Epi, Mat};
use crate::core::mem::SPtr;
use std::arch::x86_64::*;

/// Whether the pair GEMM runs here (AVX-512 BF16, own GEMM backend).
pub(super) fn available() -> bool {
    crate::kernels::gemm::bf16::pairs_available()
}

/// K pairs of a K-deep product (an odd K's last pair has a zero high half).
pub(super) fn pairs_of(k: usize) -> usize {
    k.div_ceil(2)
}

/// Floats (32-bit pairs) `pack_weights` writes per group of m rows.
pub(super) fn packed_weights_len(m: usize, k: usize) -> usize {
    m.div_ceil(Pairs::MR) * Pairs::MR * pairs_of(k)
}

/// `groups` blocks of m × k row-major weights (`w`, rows k apart, blocks m · k apart) rounded
/// to bfloat16 and packed for `gemm` (`packed_weights_len(m, k)` per block).
pub(super) fn pack_weights(w: &[f32], groups: usize, m: usize, k: usize) -> Vec<f32> {
    let k2 = pairs_of(k);
    let len = packed_weights_len(m, k);
    let mut out = vec![0f32; groups * len];
    let mut pairs = vec![0u32; m * k2];
    for gi in 0..groups {
        for r in 0..m {
            let row = &w[(gi * m + r) * k..(gi * m + r + 1) * k];
            for p in 0..k2 {
                let hi = row.get(2 * p + 1).map_or(0, |&v| u32::from(f32_to_bf16(v)));
                pairs[r * k2 + p] = u32::from(f32_to_bf16(row[2 * p])) | (hi << 16);
            }
        }
        let a = Mat { p: SPtr(pairs.as_mut_ptr() as *mut f32), rs: k2 as isize, cs: 1 };
        // SAFETY: `pairs` holds m × k2 values, `out` len per group
        unsafe { pack_a_slices_for::<Pairs>(a, m, k2, out.as_mut_ptr().add(gi * len)) };
    }
    out
}

/// 32-bit values `gemm` needs for B's pair panels (k × n).
pub(super) fn b_panels_len(k: usize, n: usize) -> usize {
    let (nr, _) = packed_layout::<Pairs>(pairs_of(k));
    pairs_of(k) * n.div_ceil(nr) * nr
}

/// c (m × n) = A · B, then `epi`, single-threaded: A packed by `pack_weights`, B k × n float32
/// (rows `rs` apart, unit column stride) rounded and packed into `panels`
/// (`b_panels_len(k, n)` values).
///
/// # Safety
/// The pointers valid for those sizes; `available()`.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm(m: usize, n: usize, k: usize, pa: *const f32, b: *const f32, rs: usize, panels: &mut [f32], c: Mat, epi: &Epi) {
    let k2 = pairs_of(k);
    pack_b(b, rs, k, n, panels.as_mut_ptr() as *mut u32);
    drive_packed_ab::<Pairs>(m, n, k2, pa, panels.as_ptr(), c, 1.0, epi);
}

/// B's pair panels as `drive_packed_ab::<Pairs>` reads them: slices of kc pairs, each
/// NR-column panels of kc × NR pairs (row 2p in the low half, 2p + 1 in the high half; columns
/// past n and a missing last row zero).
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn pack_b(b: *const f32, rs: usize, k: usize, n: usize, dst: *mut u32) {
    let k2 = pairs_of(k);
    let (nr, kc) = packed_layout::<Pairs>(k2);
    debug_assert_eq!(nr, 32);
    let npan = n.div_ceil(nr);
    let mut p0 = 0;
    while p0 < k2 {
        let kcl = kc.min(k2 - p0);
        let slice = dst.add(p0 * npan * nr);
        for jp in 0..npan {
            let j0 = jp * nr;
            let panel = slice.add(jp * kcl * nr);
            for p in p0..p0 + kcl {
                let (lo, hi) = (b.add(2 * p * rs + j0), (2 * p + 1 < k).then(|| b.add((2 * p + 1) * rs + j0)));
                let out = panel.add((p - p0) * nr);
                for half in 0..2 {
                    let live = 16usize.min(n.saturating_sub(j0 + 16 * half));
                    let pair = pair16(lo.add(16 * half), hi.map(|h| h.add(16 * half)), live);
                    _mm512_storeu_si512(out.add(16 * half) as *mut _, pair);
                }
            }
        }
        p0 += kcl;
    }
}

/// 16 pairs (lo[i], hi[i]) of bfloat16, the first `live` from memory, the rest zero.
#[inline(always)]
unsafe fn pair16(lo: *const f32, hi: Option<*const f32>, live: usize) -> __m512i {
    if live == 0 {
        return _mm512_setzero_si512();
    }
    let mask: __mmask16 = if live >= 16 { 0xFFFF } else { ((1u32 << live) - 1) as __mmask16 };
    let l = bf16_lanes(_mm512_maskz_loadu_ps(mask, lo));
    match hi {
        Some(h) => _mm512_or_si512(l, _mm512_slli_epi32::<16>(bf16_lanes(_mm512_maskz_loadu_ps(mask, h)))),
        None => l,
    }
}

