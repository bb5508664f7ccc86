//! Prefill GEMM for bf16, int8 and int4 weights on AMX tiles: `Y = X @ W^T` over many activation rows, where
//! the CPU has AMX-BF16 and Linux grants the tile state (`kernels::gemm::bf16::amx::available`).
//!
//! The tiles compute `Y^T = W · X^T`, as the engine's bfloat16 GEMM does (`amx::gemm`): the
//! weight rows are the tiles' A operand and are read in place, 16 rows of 32 bf16 values per
//! `tileloadd`, never copied; the activation rows, rounded once to bf16 (to nearest even, as
//! eager PyTorch rounds a bfloat16 model's activations), are packed per call into 32-row
//! panels of k pairs (`XTiles`), the tiles' B operand. Products of two bf16 values are exact in
//! float32 and `tdpbf16ps` sums them into float32 accumulators, so against the f32-activation
//! panel path (`panel`) the only difference is the rounding of the activations.
//!
//! int8 weights (`q` with a scale per row) go through the same tiles: each block of 32 rows is
//! widened once per call to the bf16 values `q - 128` (exact: at most 8 significant bits) in a
//! scratch block, and the row's scale multiplies the tile's float32 sums on the way out. int4
//! blocks are dequantized as `Packed::rows` does and rounded to bf16 (nearest even).
//!
//! Taken from `panel::MIN_ROWS` activation rows on (prefill; decode keeps the f32 GEMV) and
//! when K is a multiple of 32 (whole tiles along K).

use super::gemv::{Act, Isa, Job};
use super::half::f16_to_f32;
use super::packed::{Packed, INT4_BLOCK_BYTES, INT4_ROWS};
use std::sync::atomic::{AtomicBool, Ordering};

/// Weight rows (and activation rows) per block: two 16-row tiles each.
const NB: usize = 32;

/// On unless a benchmark turns it off (old / new paths interleaved in one run).
static ENABLED: AtomicBool = AtomicBool::new(true);

pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether the CPU runs the tiles (CPUID and the kernel's permission, asked once).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::kernels::gemm::bf16::amx::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether `m` activation rows for weights `p` (bf16, int8 or int4, K a multiple of 32) take
/// the tiles (then `gemv::prepare_rows` packs them into `XTiles`).
pub fn takes(p: &Packed, m: usize, isa: Isa) -> bool {
    matches!(p, Packed::Bf16 { k, .. } | Packed::Int8 { k, .. } | Packed::Int4 { k, .. } if k.is_multiple_of(NB))
        && m >= super::panel::MIN_ROWS
        && matches!(isa, Isa::Avx512 | Isa::Vnni)
        && enabled()
        && available()
}

/// Activation rows as the tiles' B operand: panel `q` (rows `32q .. 32q + 32`, zero past `m`)
/// is `k2 × 32` 32-bit words, word `(p, c)` holding the bf16 values `2p` (low half) and
/// `2p + 1` (high half) of row `32q + c`.
pub struct XTiles {
    pub m: usize,
    pub k2: usize,
    words: Vec<u32>,
}

impl XTiles {
    /// `x` is `[m, k]` row-major f32, `k` a multiple of 32: rounded to bf16 in one pass, then
    /// packed as the engine's tiles pack activations (`amx::pack_t`), on the calling thread.
    #[cfg(target_arch = "x86_64")]
    pub fn pack(x: &[f32], m: usize, k: usize) -> XTiles {
        use crate::core::mem::SPtr;
        use crate::kernels::gemm::Mat;
        assert!(k.is_multiple_of(NB) && x.len() == m * k && available());
        let k2 = k / 2;
        let mut rounded = vec![0u32; m * k2];
        let round = crate::kernels::cast::vector_cast(crate::core::tensor::DType::F32, crate::core::tensor::DType::BF16).expect("f32 -> bf16 cast");
        // SAFETY: `x` holds m * k floats, `rounded` m * k2 words = m * k bf16 values
        unsafe { round(x.as_ptr() as *const u8, rounded.as_mut_ptr() as *mut u8, m * k) };
        let a = Mat { p: SPtr(rounded.as_mut_ptr() as *mut f32), rs: k2 as isize, cs: 1 };
        // SAFETY: `a` is m × k2 words; `available()` (asserted) implies AVX-512
        let words = unsafe { crate::kernels::gemm::bf16::amx::pack_t(a, m, k2, 1) };
        XTiles { m, k2, words }
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub fn pack(_x: &[f32], _m: usize, _k: usize) -> XTiles {
        unreachable!("AMX tiles are x86-64 only (`takes`)")
    }

    fn panel(&self, q: usize) -> &[u32] {
        &self.words[q * self.k2 * NB..(q + 1) * self.k2 * NB]
    }
}

/// Weight rows `r0 .. r0 + nrows` of `job` for every activation row; false when the job is
/// not for the tiles.
pub fn chunk(job: &Job, r0: usize, nrows: usize) -> bool {
    let Some(Act::Tiles(t)) = job.acts.first() else {
        return false;
    };
    #[cfg(target_arch = "x86_64")]
    {
        let k = job.p.shape().1;
        assert_eq!(t.k2 * 2, k);
        assert!(r0 + nrows <= job.p.shape().0);
        let m = t.m;
        let ldw = 2 * k;
        let mut out = [0f32; NB * NB];
        WROWS.with(|cell| {
            let mut scratch = cell.borrow_mut();
            let mut j = r0;
            while j < r0 + nrows {
                let nv = NB.min(r0 + nrows - j);
                // the block's weight rows as bf16 (`ldw` bytes apart) and the factor of each row
                let (rows, scale): (*const u16, Option<&[f32]>) = match job.p {
                    Packed::Bf16 { w, .. } => (w[j * k..].as_ptr(), None),
                    Packed::Int8 { kp, w, scale, .. } => {
                        if scratch.len() < NB * k {
                            scratch.resize(NB * k, 0);
                        }
                        for r in 0..nv {
                            int8_row_bf16(&w[(j + r) * kp..(j + r) * kp + k], &mut scratch[r * k..(r + 1) * k]);
                        }
                        (scratch.as_ptr(), Some(&scale[j..j + nv]))
                    }
                    Packed::Int4 { .. } => {
                        if scratch.len() < NB * k {
                            scratch.resize(NB * k, 0);
                        }
                        int4_rows_bf16(job.p, j, nv, &mut scratch[..nv * k]);
                        (scratch.as_ptr(), None)
                    }
                    _ => unreachable!("tiles are prepared for bf16, int8 and int4 weights only (`takes`)"),
                };
                let bias = job.bias.map(|b| &b[j..j + nv]);
                for q in 0..m.div_ceil(NB) {
                    let mv = NB.min(m - q * NB);
                    // SAFETY: `rows` holds nv rows of k bf16 values `ldw` bytes apart, panel q
                    // k2 × 32 words; `available()` held when the tiles were prepared (`takes`).
                    unsafe {
                        crate::kernels::gemm::bf16::amx::block(rows as *const u8, ldw, nv, t.panel(q).as_ptr(), t.k2, out.as_mut_ptr(), mv > 16);
                    }
                    // SAFETY: the caller of `gemv::run` promised rows q*32 .. q*32 + mv, columns
                    // j .. j + nv of the output are ours.
                    unsafe { store_t(&out, nv, mv, job.out.add(q * NB * job.ld + j), job.ld, scale, bias) };
                }
                j += nv;
            }
        });
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (t, r0, nrows);
        false
    }
}

/// Rows `r0 .. r0 + nv` (`r0` a multiple of `INT4_ROWS`) of int4 weights dequantized as
/// `Packed::rows` does (`(q - 8) * s + z` in f32) and rounded to bf16 (nearest even) into
/// `out` (`nv` rows of K).
pub(super) fn int4_rows_bf16(p: &Packed, r0: usize, nv: usize, out: &mut [u16]) {
    let Packed::Int4 { n, k, group, w, scale, zero, .. } = p else { unreachable!("int4 weights") };
    let (n, k, group) = (*n, *k, *group);
    assert!(r0.is_multiple_of(INT4_ROWS) && r0 + nv <= n && out.len() >= nv * k && k.is_multiple_of(NB));
    let ng = k / group;
    for t in r0 / INT4_ROWS..(r0 + nv).div_ceil(INT4_ROWS) {
        let rows = INT4_ROWS.min(r0 + nv - t * INT4_ROWS);
        for b in 0..k / NB {
            let block = &w[(t * (k / NB) + b) * INT4_BLOCK_BYTES..(t * (k / NB) + b + 1) * INT4_BLOCK_BYTES];
            let gi = (t * ng + b * NB / group) * INT4_ROWS;
            for l in 0..rows {
                let (s, z) = (f16_to_f32(scale[gi + l]), f16_to_f32(zero[gi + l]));
                let dst = &mut out[(t * INT4_ROWS + l - r0) * k + b * NB..][..NB];
                #[cfg(target_arch = "x86_64")]
                if crate::core::isa::has_avx512() {
                    // SAFETY: AVX-512 checked; the block holds 128 bytes, `dst` 32 values.
                    unsafe { x86::int4_block_row_bf16(block.as_ptr(), l, s, z, dst.as_mut_ptr()) };
                    continue;
                }
                for (c, d) in dst.iter_mut().enumerate() {
                    let (m, i) = (c / 8, c % 4);
                    let byte = block[m * 32 + l * 4 + i];
                    let q = if c % 8 >= 4 { byte >> 4 } else { byte & 15 };
                    *d = crate::core::element::f32_to_bf16((q as f32 - 8.0) * s + z);
                }
            }
        }
    }
}

thread_local! {
    /// A block of int8 weight rows widened to bf16 (kept: one per thread, reused per block).
    static WROWS: std::cell::RefCell<Vec<u16>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// An int8 weight row (`+128`-biased bytes) as bf16 values `q - 128`: integers of at most 8
/// significant bits, so exact; the row's scale is applied to the tile's output.
pub(super) fn int8_row_bf16(w: &[u8], out: &mut [u16]) {
    assert_eq!(w.len(), out.len());
    let mut c0 = 0;
    #[cfg(target_arch = "x86_64")]
    if crate::core::isa::has_avx512() {
        c0 = w.len() / 16 * 16;
        // SAFETY: AVX-512 checked; c0 values in both slices.
        unsafe { x86::int8_bf16(w.as_ptr(), c0, out.as_mut_ptr()) };
    }
    for (d, &v) in out[c0..].iter_mut().zip(&w[c0..]) {
        *d = ((v as i16 - 128) as f32).to_bits().wrapping_shr(16) as u16;
    }
}

/// `y[c * ld + r] = out[r * 32 + c] (* scale[r]) (+ bias[r])` for `r < nv`, `c < mv`: the
/// transposed tile into the output rows, 8 × 8 blocks through registers when the tile is whole.
///
/// # Safety
/// `y` valid for `mv` rows of `nv` at stride `ld`; AVX-512 (the tiles ran).
#[cfg(target_arch = "x86_64")]
unsafe fn store_t(out: &[f32; NB * NB], nv: usize, mv: usize, y: *mut f32, ld: usize, scale: Option<&[f32]>, bias: Option<&[f32]>) {
    if nv == NB && mv == NB {
        return x86::store_t_full(out, y, ld, scale, bias);
    }
    for c in 0..mv {
        for r in 0..nv {
            let v = out[r * NB + c] * scale.map_or(1.0, |s| s[r]);
            *y.add(c * ld + r) = v + bias.map_or(0.0, |b| b[r]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::NB;
    use std::arch::x86_64::*;

    /// `super::int8_row_bf16` of the first `n` (a multiple of 16) values.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn int8_bf16(w: *const u8, n: usize, out: *mut u16) {
        let bias = _mm512_set1_epi32(128);
        let mut c = 0;
        while c < n {
            let q = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(w.add(c) as *const __m128i)), bias);
            let hi = _mm512_srli_epi32::<16>(_mm512_castps_si512(_mm512_cvtepi32_ps(q)));
            _mm256_storeu_si256(out.add(c) as *mut __m256i, _mm512_cvtepi32_epi16(hi));
            c += 16;
        }
    }

    /// Row `l` (< 8) of one 32-column int4 block (`packed`'s layout: byte `m * 32 + l * 4 + i`
    /// holds column `8m + i` low and `8m + 4 + i` high) as bf16 of `(q - 8) * s + z`, rounded
    /// to nearest even; the same f32 operations as the scalar loop (a multiply, then an add).
    #[target_feature(enable = "avx512f")]
    pub unsafe fn int4_block_row_bf16(block: *const u8, l: usize, s: f32, z: f32, out: *mut u16) {
        // the row's 16 bytes: 4 per group of 8 columns
        let words: [u32; 4] = std::array::from_fn(|m| (block.add(m * 32 + l * 4) as *const u32).read_unaligned());
        let bytes = _mm_loadu_si128(words.as_ptr() as *const __m128i);
        let lo = _mm_and_si128(bytes, _mm_set1_epi8(15));
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(bytes), _mm_set1_epi8(15));
        // columns 0..16: groups 0, 1 (low nibbles then high), 16..32: groups 2, 3
        let halves = [_mm_unpacklo_epi32(lo, hi), _mm_unpackhi_epi32(lo, hi)];
        let (vs, vz, eight) = (_mm512_set1_ps(s), _mm512_set1_ps(z), _mm512_set1_ps(8.0));
        for (h, q) in halves.iter().enumerate() {
            let f = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(*q));
            let v = _mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(f, eight), vs), vz);
            let b = _mm512_castps_si512(v);
            let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
            let r = _mm512_srli_epi32::<16>(_mm512_add_epi32(b, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))));
            _mm256_storeu_si256(out.add(16 * h) as *mut __m256i, _mm512_cvtepi32_epi16(r));
        }
    }

    /// `super::store_t` of a whole 32 × 32 tile.
    #[target_feature(enable = "avx")]
    pub unsafe fn store_t_full(out: &[f32; NB * NB], y: *mut f32, ld: usize, scale: Option<&[f32]>, bias: Option<&[f32]>) {
        let o = out.as_ptr();
        for rb in 0..NB / 8 {
            let b = match bias {
                Some(b) => _mm256_loadu_ps(b.as_ptr().add(rb * 8)),
                None => _mm256_setzero_ps(),
            };
            let s = match scale {
                Some(s) => _mm256_loadu_ps(s.as_ptr().add(rb * 8)),
                None => _mm256_set1_ps(1.0),
            };
            for cb in 0..NB / 8 {
                let r: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(o.add((rb * 8 + i) * NB + cb * 8)));
                let t = crate::core::transpose::transpose_8x8(&r);
                for (i, v) in t.iter().enumerate() {
                    _mm256_storeu_ps(y.add((cb * 8 + i) * ld + rb * 8), _mm256_add_ps(_mm256_mul_ps(*v, s), b));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::gemv::{detect, linear, prepare_rows};
    use super::super::half::round_f16;
    use super::super::test_util::lcg;
    use super::*;

    fn bf16_round(v: f32) -> f32 {
        let mut h = 0u16;
        let f = crate::kernels::cast::vector_cast(crate::core::tensor::DType::F32, crate::core::tensor::DType::BF16).unwrap();
        // SAFETY: one value each way
        unsafe { f(&v as *const f32 as *const u8, &mut h as *mut u16 as *mut u8, 1) };
        f32::from_bits((h as u32) << 16)
    }

    /// Against the f64 sum of bf16(x) · W (W: the bf16 weights, or an int8 row's `q - 128`
    /// times its scale): the products are exact, so only the float32 accumulation (and, int8,
    /// the scale applied to the sum) separates them. Shapes cover partial row blocks (m = 16,
    /// 17, 33), partial weight blocks (n = 1, 17, 40, 130), long K and a bias.
    #[test]
    fn tiles_match_bf16_rounded_activations() {
        let probe = Packed::bf16(1, 32, &[0u16; 32]).unwrap();
        if !takes(&probe, 16, detect()) {
            eprintln!("no AMX tiles on this CPU: nothing to compare");
            return;
        }
        let mut s = 11u64;
        for &(n, k) in &[(1usize, 32usize), (17, 64), (40, 896), (130, 256), (33, 4864)] {
            let w: Vec<f32> = (0..n * k).map(|_| lcg(&mut s)).collect();
            let wb: Vec<u16> = w.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
            let q: Vec<i8> = w.iter().map(|v| (v * 254.0).clamp(-127.0, 127.0) as i8).collect();
            let qs: Vec<f32> = (0..n).map(|r| 0.003 + r as f32 * 1e-4).collect();
            let g = if k.is_multiple_of(128) { 128 } else { 32 };
            let nib: Vec<u8> = w.iter().map(|v| ((v + 0.5) * 15.99).clamp(0.0, 15.0) as u8).collect();
            let packed4: Vec<u8> = (0..n * k / 2).map(|j| nib[2 * j] | (nib[2 * j + 1] << 4)).collect();
            let sc: Vec<f32> = (0..n * k / g).map(|i| round_f16(0.01 + (i % 7) as f32 * 0.003)).collect();
            let ze: Vec<f32> = (0..n * k / g).map(|i| round_f16((i % 5) as f32 * 0.002 - 0.004)).collect();
            let kinds = [Packed::bf16(n, k, &wb).unwrap(), Packed::int8(n, k, &q, &qs).unwrap(), Packed::int4(n, k, g, &packed4, &sc, &ze).unwrap()];
            let bias: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 3.0).collect();
            for p in &kinds {
                // the weights the tiles multiply: bf16 as stored, int8 exact, int4 rounded to bf16
                let mut wd = vec![0f32; n * k];
                p.rows(&(0..n).collect::<Vec<_>>(), &mut wd).unwrap();
                if let Packed::Int4 { .. } = p {
                    wd.iter_mut().for_each(|v| *v = bf16_round(*v));
                }
                let wr = |r: usize, c: usize| wd[r * k + c] as f64;
                for m in [16usize, 17, 33, 64, 100] {
                    let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut s) * 3.0).collect();
                    assert!(matches!(prepare_rows(p, &x, m, detect())[0], Act::Tiles(_)));
                    let mut y = vec![f32::NAN; m * n];
                    linear(p, &x, m, Some(&bias), &mut y, detect());
                    for i in 0..m {
                        for r in 0..n {
                            let xr = |c: usize| bf16_round(x[i * k + c]) as f64;
                            let exact: f64 = (0..k).map(|c| wr(r, c) * xr(c)).sum::<f64>() + bias[r] as f64;
                            let mag: f64 = (0..k).map(|c| (wr(r, c) * xr(c)).abs()).sum::<f64>() + bias[r].abs() as f64;
                            let got = y[i * n + r] as f64;
                            assert!((got - exact).abs() <= 1e-5 * mag + 1e-7, "{} n={n} k={k} m={m} ({i},{r}): {got} vs {exact}", p.kind());
                        }
                    }
                }
            }
        }
    }

    /// The int4 widening gives the bits of `Packed::rows` rounded to bf16, for every nibble,
    /// row of a tile (a partial last tile too) and group size.
    #[test]
    fn int4_rows_widen_like_rows_rounded() {
        let mut s = 5u64;
        for &(n, k, g) in &[(8usize, 32usize, 32usize), (21, 256, 64), (16, 384, 128)] {
            let nib: Vec<u8> = (0..n * k).map(|i| (i % 16) as u8).collect();
            let packed4: Vec<u8> = (0..n * k / 2).map(|j| nib[2 * j] | (nib[2 * j + 1] << 4)).collect();
            let sc: Vec<f32> = (0..n * k / g).map(|_| round_f16(lcg(&mut s) * 0.1)).collect();
            let ze: Vec<f32> = (0..n * k / g).map(|_| round_f16(lcg(&mut s) * 0.01)).collect();
            let p = Packed::int4(n, k, g, &packed4, &sc, &ze).unwrap();
            let mut wd = vec![0f32; n * k];
            p.rows(&(0..n).collect::<Vec<_>>(), &mut wd).unwrap();
            for r0 in (0..n).step_by(INT4_ROWS) {
                let nv = (n - r0).min(NB);
                let mut got = vec![0u16; nv * k];
                int4_rows_bf16(&p, r0, nv, &mut got);
                for (i, &b) in got.iter().enumerate() {
                    assert_eq!(f32::from_bits((b as u32) << 16).to_bits(), bf16_round(wd[r0 * k + i]).to_bits(), "n={n} k={k} g={g} r0={r0} i={i}");
                }
            }
        }
    }

    /// Every int8 value widens to the bf16 of `q - 128` (the vector loop and its scalar tail).
    #[test]
    fn int8_rows_widen_exactly() {
        let w: Vec<u8> = (0..=255u8).chain(0..37).collect();
        let mut out = vec![0u16; w.len()];
        int8_row_bf16(&w, &mut out);
        for (&v, &b) in w.iter().zip(&out) {
            assert_eq!(f32::from_bits((b as u32) << 16), v as f32 - 128.0);
        }
    }

    /// NaN and infinity in an activation row reach exactly that row's outputs; the other rows
    /// stay finite.
    #[test]
    fn tiles_propagate_nan_and_inf_per_row() {
        let (n, k, m) = (48usize, 64usize, 40usize);
        let wb = vec![0x3f80u16; n * k]; // 1.0
        let p = Packed::bf16(n, k, &wb).unwrap();
        if !takes(&p, m, detect()) {
            return;
        }
        let mut x = vec![0.5f32; m * k];
        x[3 * k + 7] = f32::NAN;
        x[35 * k] = f32::INFINITY;
        let mut y = vec![0f32; m * n];
        linear(&p, &x, m, None, &mut y, detect());
        for i in 0..m {
            for r in 0..n {
                let v = y[i * n + r];
                match i {
                    3 => assert!(v.is_nan()),
                    35 => assert_eq!(v, f32::INFINITY),
                    _ => assert_eq!(v, 32.0),
                }
            }
        }
    }

    #[test]
    fn k_not_a_multiple_of_32_keeps_the_panel_path() {
        let p = Packed::bf16(4, 48, &[0u16; 4 * 48]).unwrap();
        assert!(!takes(&p, 64, detect()));
    }
}
