//! The Winograd F(2×2, 3×3) convolution of a bfloat16 model with its channel sums on
//! `vdpbf16ps` (AVX-512 BF16): the transformed weights U and inputs V are rounded to bfloat16
//! and packed in pairs of channels, and each of the 16 GEMMs `M[ξ] = U[ξ] · V[ξ]` runs on the
//! pair micro-kernel (`gemm::bf16::x86::Pairs`: two bfloat16 products per float32 lane and
//! instruction, float32 sums) — twice the float32 kernel's multiply-adds per cycle, on top of
//! Winograd's 2.25× fewer. The output transform and the epilogue are the float32 path's.
//!
//! Only for convolutions the model computes in bfloat16 (`Args::bf16`, set by the lowering when
//! the input and weights are bfloat16 values widened by `torchburn.low_precision`): eager
//! PyTorch multiplies bfloat16 values there too. The extra rounding is of the transformed
//! values (sums of up to four inputs, of a kernel's taps by ½): of the size of the input's own
//! rounding, so the result stays within bfloat16's tolerance of eager's (tested against a
//! float64 reference, next to eager's bfloat16 error). `vcvtneps2bf16` rounds to nearest even
//! and flushes subnormals to zero; NaN / inf stay NaN / inf, and a transformed value past
//! bfloat16's range becomes inf: such outputs are recomputed as the direct float32 sum, as on
//! the float32 path.

use super::winograd::{chunk_rows, kcl_base, output_transform, transform_rows_unit, transform_weights, Args, Sink, Tiles, SCRATCH};
use crate::core::element::f32_to_bf16;
use crate::core::lanes::Z16;
use crate::core::mem::{with_scratch, SPtr};
use crate::kernels::gemm::bf16::x86::{bf16_lanes, Pairs};
use crate::kernels::gemm::own::{drive_packed_ab, pack_a_slices_for, packed_layout, Isa};
use crate::kernels::gemm::{Epi, Mat};
use std::arch::x86_64::*;

/// Whether `conv3x3` takes this path: asked for, an even channel count (whole pairs), input
/// rows contiguous, and the pair kernel available (AVX-512 BF16, own GEMM backend).
pub(super) fn applies(a: &Args) -> bool {
    a.bf16 && a.c.is_multiple_of(2) && a.xs[3] == 1 && crate::kernels::gemm::bf16::pairs_available()
}

/// The float32 Winograd convolution (`winograd::conv3x3`) with bfloat16 products. False,
/// touching nothing, when a weight is NaN / inf.
///
/// # Safety
/// As `winograd::conv3x3`; `applies(a)` held.
pub(super) unsafe fn conv3x3(a: &Args, epi_at: &(dyn Fn(usize, usize) -> Epi + Sync), threads: usize) -> bool {
    let Some(u) = transform_weights(a.w, a.oc, a.c) else { return false };
    let k2 = a.c / 2;
    let (nr, kc) = packed_layout::<Pairs>(k2);
    let (th, tw) = (a.oh.div_ceil(2), a.ow.div_ceil(2));
    if a.n * th == 0 {
        return true;
    }
    // U[ξ] (oc × c) as oc × k2 pairs of bfloat16 (channel 2p low, 2p + 1 high), packed once
    let pairs: Vec<u32> = u.chunks_exact(2).map(|p| u32::from(f32_to_bf16(p[0])) | (u32::from(f32_to_bf16(p[1])) << 16)).collect();
    let pa_len = a.oc.div_ceil(Pairs::MR) * Pairs::MR * k2;
    let mut pu = vec![0f32; 16 * pa_len];
    for xi in 0..16 {
        let m = Mat { p: SPtr(pairs.as_ptr().add(xi * a.oc * k2) as *mut f32), rs: k2 as isize, cs: 1 };
        pack_a_slices_for::<Pairs>(m, a.oc, k2, pu.as_mut_ptr().add(xi * pa_len));
    }
    let pu = SPtr(pu.as_mut_ptr());
    let rows = chunk_rows(tw, nr, a.c, a.oc);
    let total = a.n * th;
    let chunks = total.div_ceil(rows);
    let geo = Tiles { th, tw, nr, kc };
    let task = |ch: usize| {
        let (g0, g1) = (ch * rows, ((ch + 1) * rows).min(total));
        let cols = (g1 - g0) * tw;
        // V[ξ] in 32-bit pairs, a cache line more than it needs (as the float32 path's)
        let vlen = k2 * cols.div_ceil(nr) * nr + 16;
        let mlen = a.oc * cols + 16;
        with_scratch(&SCRATCH, 16 * (vlen + mlen), |s| {
            let (v, m) = s.split_at_mut(16 * vlen);
            if vlen > k2 * cols + 16 {
                v.fill(0.0); // the last panel's columns past the chunk: read, never stored
            }
            input_transform(a, &geo, g0, g1, v.as_mut_ptr() as *mut u32, vlen);
            for xi in 0..16 {
                let cm = Mat { p: SPtr(m.as_mut_ptr().add(xi * mlen)), rs: cols as isize, cs: 1 };
                drive_packed_ab::<Pairs>(a.oc, cols, k2, pu.add(xi * pa_len), v.as_ptr().add(xi * vlen), cm, 1.0, &Epi::default());
            }
            output_transform(a, &geo, g0, g1, m, mlen, epi_at);
        })
    };
    if threads > 1 {
        crate::core::par::for_each(chunks, task);
    } else {
        (0..chunks).for_each(task);
    }
    true
}

/// Bᵀ d B of every tile of tile rows g0..g1, every channel, rounded to bfloat16 into V's pair
/// panels: V[ξ] is the pair GEMM's B (k2 × tiles) in slices of kc pairs, each NR-column panels
/// of kc × NR pairs; channel 2p in the low half of pair p, 2p + 1 in the high half.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn input_transform(a: &Args, t: &Tiles, g0: usize, g1: usize, v: *mut u32, vlen: usize) {
    let Tiles { th, tw, nr, kc } = *t;
    let npan = ((g1 - g0) * tw).div_ceil(nr);
    for gr in g0..g1 {
        let (ni, ty) = (gr / th, gr % th);
        let col0 = (gr - g0) * tw;
        for ci in 0..a.c {
            let xb = a.x.add(ni * a.xs[0] + ci * a.xs[1]);
            let sink = PairPanels { nr, slot: kcl_base(a.c / 2, kc, ci / 2, npan, nr), high: ci % 2 == 1, vp: v, vlen };
            transform_rows_unit::<Z16, _>(a, xb, ty, tw, col0, &sink);
        }
    }
}

/// One channel's half of its pair slot in V's pair panels.
struct PairPanels {
    nr: usize,
    slot: (usize, usize),
    high: bool,
    vp: *mut u32,
    vlen: usize,
}

impl Sink<Z16> for PairPanels {
    #[inline(always)]
    unsafe fn put(&self, out: &[Z16; 16], col: usize, len: usize) {
        let (kcl, base) = self.slot;
        let (jp, off) = (col / self.nr, col % self.nr);
        // the 16-bit halves this channel owns: the low or high one of each of `len` pairs
        let live: u32 = if len >= 16 { u32::MAX } else { (1u32 << (2 * len)) - 1 };
        let mask = live & if self.high { 0xAAAA_AAAA } else { 0x5555_5555 };
        for (xi, x) in out.iter().enumerate() {
            let h = bf16_lanes(x.0);
            let h = if self.high { _mm512_slli_epi32::<16>(h) } else { h };
            let dst = self.vp.add(xi * self.vlen + base);
            if off + len <= self.nr {
                _mm512_mask_storeu_epi16(dst.add(jp * kcl * self.nr + off) as *mut i16, mask, h);
            } else {
                // the run of tiles crosses into the next panel: pair by pair
                let mut tmp = [0u32; 16];
                _mm512_storeu_si512(tmp.as_mut_ptr() as *mut _, h);
                for (l, &w) in tmp[..len].iter().enumerate() {
                    let (jq, oq) = ((col + l) / self.nr, (col + l) % self.nr);
                    let half = (dst.add(jq * kcl * self.nr + oq) as *mut u16).add(usize::from(self.high));
                    *half = if self.high { (w >> 16) as u16 } else { w as u16 };
                }
            }
        }
    }
}
