//! 3×3 stride-1 convolutions by Winograd's minimal filtering F(2×2, 3×3) (Lavin & Gray, "Fast
//! Algorithms for Convolutional Neural Networks", 2015): each 2×2 block of outputs (a "tile")
//! is `Aᵀ [ Σ_c (G g Gᵀ) ⊙ (Bᵀ d B) ] A` over the 4×4 input windows `d` of its channels, so a
//! channel pair costs 16 products per 4 outputs instead of 36 (2.25× fewer multiply-adds; the
//! 3×3 convolutions of a ResNet run at the FMA peak either way, so this is the only way past
//! oneDNN's direct kernel there).
//!
//! The sum over input channels is 16 GEMMs, one per position ξ of the 4×4 transformed tile:
//! `M[ξ] (K × tiles) = U[ξ] (K × C) · V[ξ] (C × tiles)` on the own packed GEMM. U (the
//! transformed weights) is packed once per call; the input transform writes V straight into the
//! GEMM's packed panels; the output transform reads M a tile row at a time, applies the
//! convolution's epilogue (shift, activations, residual) on each output row and stores it.
//! Tiles are taken in chunks of whole tile rows sized so that a chunk's V and M stay in L2;
//! chunks are the parallel tasks.
//!
//! Accuracy: the transforms only add, subtract and halve, and the products sum over C as in
//! the direct GEMM; against a float64 reference the error is of the direct path's size
//! (measured 0.6-1.4× its largest error for C = 32..256, `tests/test_kernels_conv2d.py`).
//! Non-finite values: the transforms mix a window's inputs (an inf becomes inf - inf = NaN
//! where the direct sum gives ±inf), so every output the transforms leave non-finite is
//! recomputed as the direct sum before the epilogue; weights holding NaN / inf take im2col.

use crate::core::lanes::{Lanes, Y8, Z16};
use crate::core::mem::{with_scratch, SPtr};
use crate::kernels::gemm::own::{pack_a_slices, packed_a_len, packed_b_layout, sgemm_packed_ab};
use crate::kernels::gemm::epilogue::RegEpi;
use crate::kernels::gemm::{Epi, Mat};
use std::cell::RefCell;

/// Floats of V and M one chunk may hold (512 KiB: half of a Zen 4 core's L2).
const CHUNK_BUDGET: usize = 1 << 17;

/// One convolution as the Winograd path reads it: NCHW input and output (unit stride along
/// the output width), weights `oc × c × 3 × 3` contiguous (already scaled by a folded norm).
#[derive(Clone, Copy)]
pub(super) struct Args<'a> {
    pub x: *const f32,
    pub xs: [usize; 4],
    pub n: usize,
    pub c: usize,
    pub hh: usize,
    pub ww: usize,
    pub w: &'a [f32],
    pub oc: usize,
    pub y: *mut f32,
    pub ys: [usize; 4],
    pub oh: usize,
    pub ow: usize,
    pub ph: usize,
    pub pw: usize,
    /// y holds the 2×2 stride-2 max pool of the convolution's result (oh / 2 × ow / 2, after the
    /// epilogue, which is then relu / clamp / a shift only: those commute with the max)
    pub pool: bool,
    /// the convolution was bfloat16 in the model: its channel sums may take bfloat16 products of
    /// the transformed values (`winograd_pairs`, where the CPU has `vdpbf16ps`)
    pub bf16: bool,
}

// SAFETY: the pointers are only dereferenced at disjoint outputs / shared reads by the tasks
unsafe impl Sync for Args<'_> {}

/// Whether `TB_CONV_WINOGRAD=0` switched the path off (A / B measurement, tests).
fn disabled() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var("TB_CONV_WINOGRAD").is_ok_and(|v| v == "0"))
}

/// Whether a convolution of this shape takes the Winograd path: 3×3, stride 1, no dilation, one
/// group, enough channels on both sides for the GEMMs to dominate the transforms (16), at least
/// four tiles a row, output rows contiguous, and the own packed GEMM available.
#[allow(clippy::too_many_arguments)]
pub(super) fn applies(c: usize, oc: usize, kh: usize, kw: usize, strides: [usize; 2], dilation: [usize; 2], groups: usize, ow: usize, ys3: usize) -> bool {
    !disabled()
        && kh == 3
        && kw == 3
        && strides == [1, 1]
        && dilation == [1, 1]
        && groups == 1
        && c >= 16
        && oc >= 16
        && ow >= 7
        && ys3 == 1
        && packed_b_layout(c).is_some()
}

thread_local! {
    pub(super) static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `U[ξ][o][ci] = (G g Gᵀ)[ξ / 4][ξ % 4]` for each 3×3 kernel g, G = [[1,0,0], [½,½,½], [½,-½,½],
/// [0,0,1]]; None when a weight is NaN / inf.
pub(super) fn transform_weights(w: &[f32], oc: usize, c: usize) -> Option<Vec<f32>> {
    if w.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let mut u = vec![0f32; 16 * oc * c];
    for o in 0..oc {
        for ci in 0..c {
            let g = &w[(o * c + ci) * 9..(o * c + ci) * 9 + 9];
            // G g: 4 rows of 3
            let mut t = [[0f32; 3]; 4];
            for j in 0..3 {
                let (g0, g1, g2) = (g[j], g[3 + j], g[6 + j]);
                t[0][j] = g0;
                t[1][j] = 0.5 * (g0 + g1 + g2);
                t[2][j] = 0.5 * (g0 - g1 + g2);
                t[3][j] = g2;
            }
            // (G g) Gᵀ: 4 × 4
            for (a, row) in t.iter().enumerate() {
                let v = [row[0], 0.5 * (row[0] + row[1] + row[2]), 0.5 * (row[0] - row[1] + row[2]), row[2]];
                for (b, x) in v.into_iter().enumerate() {
                    u[((a * 4 + b) * oc + o) * c + ci] = x;
                }
            }
        }
    }
    Some(u)
}

/// Tile rows per chunk: as many as the budget allows, preferring a count whose tiles fill the
/// GEMM's NR-column panels (a partial panel is computed whole).
pub(super) fn chunk_rows(tw: usize, nr: usize, c: usize, oc: usize) -> usize {
    let max_cols = (CHUNK_BUDGET / (16 * (c + oc))).max(nr);
    let rmax = (max_cols / tw).max(1);
    let fill = |r: usize| (r * tw) as f64 / ((r * tw).div_ceil(nr) * nr) as f64;
    let mut best = 1;
    for r in 1..=rmax {
        if fill(r) >= fill(best) - 1e-9 {
            best = r;
        }
    }
    best
}

/// The convolution (without its epilogue's shift / ops, which `epi_at(image, output row)`
/// supplies, applied per output row as `Epi::apply_row(row, channel, 0)`). False, touching
/// nothing, when a weight is NaN / inf (the caller takes im2col).
///
/// # Safety
/// The pointers valid for the sizes and strides of `a`; `applies` held for them.
pub(super) unsafe fn conv3x3(a: &Args, epi_at: &(dyn Fn(usize, usize) -> Epi + Sync), threads: usize) -> bool {
    if super::winograd_pairs::applies(a) {
        return super::winograd_pairs::conv3x3(a, epi_at, threads);
    }
    let Some((nr, kc)) = packed_b_layout(a.c) else { return false };
    let Some(u) = transform_weights(a.w, a.oc, a.c) else { return false };
    let (th, tw) = (a.oh.div_ceil(2), a.ow.div_ceil(2));
    if a.n * th == 0 {
        return true;
    }
    let pa_len = packed_a_len(a.oc, a.c);
    let mut pu = vec![0f32; 16 * pa_len];
    for xi in 0..16 {
        let m = Mat { p: SPtr(u.as_ptr().add(xi * a.oc * a.c) as *mut f32), rs: a.c as isize, cs: 1 };
        pack_a_slices(m, a.oc, a.c, pu.as_mut_ptr().add(xi * pa_len));
    }
    let pu = SPtr(pu.as_mut_ptr());
    let rows = chunk_rows(tw, nr, a.c, a.oc);
    let total = a.n * th;
    let chunks = total.div_ceil(rows);
    let geo = Tiles { th, tw, nr, kc };
    let task = |ch: usize| {
        let (g0, g1) = (ch * rows, ((ch + 1) * rows).min(total));
        let cols = (g1 - g0) * tw;
        // one cache line more than each V[ξ] / M[ξ] needs: the 16 of them a multiple of 4 KiB
        // apart would share L1 sets, and each transform touches all 16 at once
        let vlen = a.c * cols.div_ceil(nr) * nr + 16;
        let mlen = a.oc * cols + 16;
        with_scratch(&SCRATCH, 16 * (vlen + mlen) + 8 * span(tw), |s| {
            let (v, rest) = s.split_at_mut(16 * vlen);
            let (m, buf) = rest.split_at_mut(16 * mlen);
            // columns of the last panel past the chunk's tiles: read by the GEMM, never stored
            if vlen > a.c * cols + 16 {
                v.fill(0.0);
            }
            input_transform(a, &geo, g0, g1, v, vlen, buf);
            for xi in 0..16 {
                let cm = Mat { p: SPtr(m.as_mut_ptr().add(xi * mlen)), rs: cols as isize, cs: 1 };
                sgemm_packed_ab(a.oc, cols, a.c, pu.add(xi * pa_len), v.as_ptr().add(xi * vlen), cm, &Epi::default());
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

thread_local! {
    static NHWC_IN: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static NHWC_OUT: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `conv3x3` for a channels-last input (dense NHWC: channels contiguous, rows `ww · c` apart)
/// and an output either channels-last too or with contiguous rows: the input is transposed to
/// planes first and a channels-last output transposed back (8×8 register blocks, one pass each
/// way: ~5 % of a 64 → 64 convolution), as the transforms run along rows of a plane. The
/// epilogue's residual is read through its own strides. False, touching nothing of the output,
/// when a weight is NaN / inf.
///
/// # Safety
/// As `conv3x3`, with `a.xs` the input's NHWC strides and `a.ys` the output's.
pub(super) unsafe fn conv3x3_channels_last(a: &Args, epi_at: &(dyn Fn(usize, usize) -> Epi + Sync), threads: usize) -> bool {
    let (hw, ohw) = (a.hh * a.ww, a.oh * a.ow);
    let y_nhwc = a.ys[1] == 1 && a.ys[3] == a.oc && a.ys[2] == a.ow * a.oc;
    let each_image = |f: &(dyn Fn(usize) + Sync)| {
        if threads > 1 {
            crate::core::par::for_each(a.n, f);
        } else {
            (0..a.n).for_each(f);
        }
    };
    with_scratch(&NHWC_IN, a.n * a.c * hw, |xt| {
        let xt = xt.as_mut_ptr();
        let (xp, xtp) = (SPtr(a.x as *mut f32), SPtr(xt));
        each_image(&|ni| transpose(xp.add(ni * a.xs[0]), hw, a.c, a.xs[3], xtp.add(ni * a.c * hw), hw));
        let planes = Args { x: xt, xs: [a.c * hw, hw, a.ww, 1], w: a.w, ..*a };
        if !y_nhwc {
            return conv3x3(&planes, epi_at, threads);
        }
        with_scratch(&NHWC_OUT, a.n * a.oc * ohw, |yt| {
            let yt = yt.as_mut_ptr();
            let out = Args { y: yt, ys: [a.oc * ohw, ohw, a.ow, 1], ..planes };
            if !conv3x3(&out, epi_at, threads) {
                return false;
            }
            let (yp, ytp) = (SPtr(a.y), SPtr(yt));
            each_image(&|ni| transpose(ytp.add(ni * a.oc * ohw), a.oc, ohw, ohw, yp.add(ni * a.ys[0]), a.oc));
            true
        })
    })
}

/// dst[j · dst_rs + i] = src[i · src_rs + j] for i < rows, j < cols.
unsafe fn transpose(src: *const f32, rows: usize, cols: usize, src_rs: usize, dst: *mut f32, dst_rs: usize) {
    if crate::core::isa::has_avx2() {
        transpose_avx2(src, rows, cols, src_rs, dst, dst_rs)
    } else {
        transpose_scalar(src, 0, rows, 0, cols, src_rs, dst, dst_rs)
    }
}

#[target_feature(enable = "avx2")]
unsafe fn transpose_avx2(src: *const f32, rows: usize, cols: usize, src_rs: usize, dst: *mut f32, dst_rs: usize) {
    use std::arch::x86_64::*;
    let (r8, c8) = (rows / 8 * 8, cols / 8 * 8);
    for i0 in (0..r8).step_by(8) {
        for j0 in (0..c8).step_by(8) {
            let mut r = [_mm256_setzero_ps(); 8];
            for (k, v) in r.iter_mut().enumerate() {
                *v = _mm256_loadu_ps(src.add((i0 + k) * src_rs + j0));
            }
            let t = crate::core::transpose::transpose_8x8(&r);
            for (k, v) in t.iter().enumerate() {
                _mm256_storeu_ps(dst.add((j0 + k) * dst_rs + i0), *v);
            }
        }
    }
    transpose_scalar(src, 0, r8, c8, cols, src_rs, dst, dst_rs);
    transpose_scalar(src, r8, rows, 0, cols, src_rs, dst, dst_rs);
}

#[allow(clippy::too_many_arguments)]
unsafe fn transpose_scalar(src: *const f32, i0: usize, i1: usize, j0: usize, j1: usize, src_rs: usize, dst: *mut f32, dst_rs: usize) {
    for i in i0..i1 {
        for j in j0..j1 {
            *dst.add(j * dst_rs + i) = *src.add(i * src_rs + j);
        }
    }
}

/// Tile geometry and the GEMM's packed-panel layout.
#[derive(Clone, Copy)]
pub(super) struct Tiles {
    pub th: usize,
    pub tw: usize,
    pub nr: usize,
    pub kc: usize,
}

/// Where the input transform puts a block of transformed tiles of one channel: `out[ξ]` for
/// `len` tiles from column `col`.
pub(super) trait Sink<V: Lanes> {
    /// # Safety
    /// The destination holds those columns.
    unsafe fn put(&self, out: &[V; 16], col: usize, len: usize);
}

/// One channel's rows of V's float32 packed panels (`store_block`).
struct Panels {
    nr: usize,
    slot: (usize, usize),
    vp: *mut f32,
    vlen: usize,
}

impl<V: Lanes> Sink<V> for Panels {
    #[inline(always)]
    unsafe fn put(&self, out: &[V; 16], col: usize, len: usize) {
        store_block(out, col, len, self.nr, self.slot, self.vp, self.vlen)
    }
}

/// Bᵀ d B of every tile of tile rows g0..g1, every channel, into V's packed panels: V[ξ] is the
/// GEMM's B (C × tiles) in slices of kc channels, each NR-column panels of kc × NR floats.
unsafe fn input_transform(a: &Args, t: &Tiles, g0: usize, g1: usize, v: &mut [f32], vlen: usize, buf: &mut [f32]) {
    if crate::core::isa::has_avx512() && t.tw > 8 {
        input_transform_avx512(a, t, g0, g1, v, vlen, buf)
    } else {
        input_transform_avx2(a, t, g0, g1, v, vlen, buf)
    }
}

#[target_feature(enable = "avx512f")]
unsafe fn input_transform_avx512(a: &Args, t: &Tiles, g0: usize, g1: usize, v: &mut [f32], vlen: usize, buf: &mut [f32]) {
    input_transform_v::<Z16>(a, t, g0, g1, v, vlen, buf)
}

#[target_feature(enable = "avx2,fma")]
unsafe fn input_transform_avx2(a: &Args, t: &Tiles, g0: usize, g1: usize, v: &mut [f32], vlen: usize, buf: &mut [f32]) {
    input_transform_v::<Y8>(a, t, g0, g1, v, vlen, buf)
}

/// `input_transform` with V::N tiles in the lanes of a vector.
#[inline(always)]
unsafe fn input_transform_v<V: Lanes>(a: &Args, t: &Tiles, g0: usize, g1: usize, v: &mut [f32], vlen: usize, buf: &mut [f32]) {
    let Tiles { th, tw, nr, kc } = *t;
    let cols = (g1 - g0) * tw;
    let npan = cols.div_ceil(nr);
    // the even / odd columns of the window's 4 input rows, zero outside the input, a vector spare
    let span = span(tw);
    let (ev, od) = buf.split_at_mut(4 * span);
    let vp = v.as_mut_ptr();
    for gr in g0..g1 {
        let (ni, ty) = (gr / th, gr % th);
        let col0 = (gr - g0) * tw;
        for ci in 0..a.c {
            let xb = a.x.add(ni * a.xs[0] + ci * a.xs[1]);
            if a.xs[3] == 1 {
                transform_rows_unit::<V, _>(a, xb, ty, tw, col0, &Panels { nr, slot: kcl_base(a.c, kc, ci, npan, nr), vp, vlen });
                continue;
            }
            for i in 0..4 {
                let (e, o) = (ev.as_mut_ptr().add(i * span), od.as_mut_ptr().add(i * span));
                let yin = (2 * ty + i) as isize - a.ph as isize;
                if yin < 0 || yin >= a.hh as isize {
                    zero::<V>(e, span);
                    zero::<V>(o, span);
                } else {
                    deinterleave::<V>(xb.add(yin as usize * a.xs[2]), a.xs[3], a.ww, a.pw, tw + 1, span, e, o);
                }
            }
            let (kcl, base) = kcl_base(a.c, kc, ci, npan, nr);
            let mut t0 = 0;
            while t0 < tw {
                let len = V::N.min(tw - t0);
                let mut cr = [[V::zero(); 4]; 4];
                for (i, c) in cr.iter_mut().enumerate() {
                    let (e, o) = (ev.as_ptr().add(i * span + t0), od.as_ptr().add(i * span + t0));
                    let (d0, d1, d2, d3) = (V::load(e, V::N), V::load(o, V::N), V::load(e.add(1), V::N), V::load(o.add(1), V::N));
                    *c = row_transform(d0, d1, d2, d3);
                }
                store_block(&column_transform(&cr), col0 + t0, len, nr, (kcl, base), vp, vlen);
                t0 += V::N;
            }
        }
    }
}

/// Bᵀ along a window row (its columns d0..d3 of each tile): d0 − d2, d1 + d2, d2 − d1, d1 − d3.
#[inline(always)]
unsafe fn row_transform<V: Lanes>(d0: V, d1: V, d2: V, d3: V) -> [V; 4] {
    [d0.sub(d2), d1.add(d2), d2.sub(d1), d1.sub(d3)]
}

/// Bᵀ down the window's four transformed rows: V[ξ = 4a + j] of each tile.
#[inline(always)]
unsafe fn column_transform<V: Lanes>(cr: &[[V; 4]; 4]) -> [V; 16] {
    let mut out = [V::zero(); 16];
    for j in 0..4 {
        out[j] = cr[0][j].sub(cr[2][j]);
        out[4 + j] = cr[1][j].add(cr[2][j]);
        out[8 + j] = cr[2][j].sub(cr[1][j]);
        out[12 + j] = cr[1][j].sub(cr[3][j]);
    }
    out
}

/// Channel ci's slice depth (kc, or less in the last slice) and its first float in a V[ξ].
#[inline(always)]
pub(super) fn kcl_base(c: usize, kc: usize, ci: usize, npan: usize, nr: usize) -> (usize, usize) {
    let p0 = ci / kc * kc;
    (kc.min(c - p0), p0 * npan * nr + (ci - p0) * nr)
}

/// The transformed values of `len` tiles from column `col` (out[ξ]) into V's panels.
#[inline(always)]
unsafe fn store_block<V: Lanes>(out: &[V; 16], col: usize, len: usize, nr: usize, (kcl, base): (usize, usize), vp: *mut f32, vlen: usize) {
    let (jp, off) = (col / nr, col % nr);
    if off + len <= nr {
        let at = base + jp * kcl * nr + off;
        for (xi, x) in out.iter().enumerate() {
            x.store(vp.add(xi * vlen + at), len);
        }
    } else {
        // the run of tiles crosses into the next panel: through a buffer
        let mut tmp = [0f32; 16];
        for (xi, x) in out.iter().enumerate() {
            x.store(tmp.as_mut_ptr(), V::N);
            for (l, &val) in tmp[..len].iter().enumerate() {
                let (jq, oq) = ((col + l) / nr, (col + l) % nr);
                *vp.add(xi * vlen + base + jq * kcl * nr + oq) = val;
            }
        }
    }
}

/// Bᵀ d B of one tile row of one channel whose input rows are contiguous: each row's four
/// columns of every tile come from two pairs of vector loads split into even / odd lanes,
/// the padding as masked-off lanes.
#[inline(always)]
pub(super) unsafe fn transform_rows_unit<V: Lanes, S: Sink<V>>(a: &Args, xb: *const f32, ty: usize, tw: usize, col0: usize, sink: &S) {
    let n = V::N as isize;
    let ww = a.ww as isize;
    let mut t0 = 0;
    while t0 < tw {
        let len = V::N.min(tw - t0);
        let c0 = 2 * t0 as isize - a.pw as isize;
        let mut cr = [[V::zero(); 4]; 4];
        for (i, c) in cr.iter_mut().enumerate() {
            let yin = (2 * ty + i) as isize - a.ph as isize;
            if yin < 0 || yin >= a.hh as isize {
                continue;
            }
            let row = xb.add(yin as usize * a.xs[2]);
            let (d0, d1) = window::<V>(row, c0, ww).unzip(window::<V>(row, c0 + n, ww));
            let (d2, d3) = window::<V>(row, c0 + 2, ww).unzip(window::<V>(row, c0 + n + 2, ww));
            *c = row_transform(d0, d1, d2, d3);
        }
        sink.put(&column_transform(&cr), col0 + t0, len);
        t0 += V::N;
    }
}

/// N lanes from column c of a row of ww floats (0 outside 0..ww). A function, not a closure:
/// closures do not take the caller's target features and would not inline.
#[inline(always)]
unsafe fn window<V: Lanes>(row: *const f32, c: isize, ww: isize) -> V {
    let n = V::N as isize;
    if c >= 0 && c + n <= ww {
        V::load(row.offset(c), V::N)
    } else {
        let from = (-c).clamp(0, n) as usize;
        let to = (ww - c).clamp(0, n) as usize;
        if from >= to {
            V::zero()
        } else {
            V::load_range(row.wrapping_offset(c), from, to)
        }
    }
}

/// Floats of one deinterleaved row: tw + 1 tile columns and a vector's spare.
pub(super) fn span(tw: usize) -> usize {
    tw + 1 + 16
}

#[inline(always)]
unsafe fn zero<V: Lanes>(p: *mut f32, n: usize) {
    let mut q = 0;
    while q < n {
        V::zero().store(p.add(q), V::N.min(n - q));
        q += V::N;
    }
}

/// e[t] = row[2t - pw], o[t] = row[2t + 1 - pw] for t < count (0 outside 0..ww), and 0 from
/// count to span.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn deinterleave<V: Lanes>(row: *const f32, xs: usize, ww: usize, pw: usize, count: usize, span: usize, e: *mut f32, o: *mut f32) {
    let get = |x: isize| if x >= 0 && (x as usize) < ww { *row.add(x as usize * xs) } else { 0.0 };
    // t whose both columns lie inside: 2t ≥ pw and 2t + 1 - pw < ww, i.e. t < (ww + pw) / 2
    let lo = pw.div_ceil(2).min(count);
    let hi = ((ww + pw) / 2).min(count).max(lo);
    for t in 0..lo {
        *e.add(t) = get(2 * t as isize - pw as isize);
        *o.add(t) = get(2 * t as isize + 1 - pw as isize);
    }
    let mut t = lo;
    if xs == 1 {
        while t + V::N <= hi {
            let p = row.add(2 * t - pw);
            let (ee, oo) = V::load(p, V::N).unzip(V::load(p.add(V::N), V::N));
            ee.store(e.add(t), V::N);
            oo.store(o.add(t), V::N);
            t += V::N;
        }
    }
    while t < hi {
        *e.add(t) = *row.add((2 * t - pw) * xs);
        *o.add(t) = *row.add((2 * t + 1 - pw) * xs);
        t += 1;
    }
    for t in hi..count {
        *e.add(t) = get(2 * t as isize - pw as isize);
        *o.add(t) = get(2 * t as isize + 1 - pw as isize);
    }
    zero::<V>(e.add(count), span - count);
    zero::<V>(o.add(count), span - count);
}

/// Aᵀ M A of every tile of tile rows g0..g1 and every output channel, two output rows at a
/// time, with the epilogue on the sums in registers; a block of tiles the transforms left
/// NaN / inf is stored, its non-finite outputs recomputed directly, then given the epilogue.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn output_transform(a: &Args, t: &Tiles, g0: usize, g1: usize, m: &[f32], mlen: usize, epi_at: &(dyn Fn(usize, usize) -> Epi + Sync)) {
    if crate::core::isa::has_avx512() && t.tw > 8 {
        output_transform_avx512(a, t, g0, g1, m, mlen, epi_at)
    } else {
        output_transform_avx2(a, t, g0, g1, m, mlen, epi_at)
    }
}

#[target_feature(enable = "avx512f")]
unsafe fn output_transform_avx512(a: &Args, t: &Tiles, g0: usize, g1: usize, m: &[f32], mlen: usize, epi_at: &(dyn Fn(usize, usize) -> Epi + Sync)) {
    output_transform_v::<Z16>(a, t, g0, g1, m, mlen, epi_at)
}

#[target_feature(enable = "avx2,fma")]
unsafe fn output_transform_avx2(a: &Args, t: &Tiles, g0: usize, g1: usize, m: &[f32], mlen: usize, epi_at: &(dyn Fn(usize, usize) -> Epi + Sync)) {
    output_transform_v::<Y8>(a, t, g0, g1, m, mlen, epi_at)
}

#[inline(always)]
unsafe fn output_transform_v<V: Lanes>(a: &Args, t: &Tiles, g0: usize, g1: usize, m: &[f32], mlen: usize, epi_at: &(dyn Fn(usize, usize) -> Epi + Sync)) {
    let Tiles { th, tw, .. } = *t;
    let cols = (g1 - g0) * tw;
    let mp = m.as_ptr();
    for gr in g0..g1 {
        let (ni, ty) = (gr / th, gr % th);
        let col0 = (gr - g0) * tw;
        // each of the two output rows: its epilogue (built at channel 0, column 0) and that
        // epilogue in register form where it has one
        let rows: [Option<(Epi, Option<RegEpi>)>; 2] = std::array::from_fn(|r| {
            (2 * ty + r < a.oh).then(|| {
                let e = epi_at(ni, 2 * ty + r);
                (e, e.in_registers(0, 0))
            })
        });
        if a.pool {
            if ty < a.oh / 2 {
                pooled_row::<V>(a, t, ni, ty, col0, cols, mp, mlen, rows[0].as_ref().expect("a pooled row's first output row exists"));
            }
            continue;
        }
        let mut spare = [0f32; 2 * 16];
        for o in 0..a.oc {
            // the two rows' outputs, raw (a missing second row into `spare`, block by block)
            let dst: [*mut f32; 2] = std::array::from_fn(|r| match rows[r] {
                Some(_) => a.y.add(ni * a.ys[0] + o * a.ys[1] + (2 * ty + r) * a.ys[2]),
                None => spare.as_mut_ptr(),
            });
            let mut bad = false;
            let mut t0 = 0;
            while t0 < tw {
                let len = V::N.min(tw - t0);
                let y = tile_outputs::<V>(mp.add(o * cols + col0 + t0), mlen, len);
                // the two output columns of each tile, side by side
                let x0 = 2 * t0;
                let n_out = (2 * len).min(a.ow - x0);
                let (live_lo, live_hi) = (n_out.min(V::N), n_out.saturating_sub(V::N));
                for (r, &d) in dst.iter().enumerate() {
                    let (c0, c1) = (y[2 * r], y[2 * r + 1]);
                    bad |= c0.any_nonfinite() | c1.any_nonfinite();
                    let (lo, hi) = c0.zip(c1);
                    let d = if d == spare.as_mut_ptr() { d } else { d.add(x0) };
                    lo.store(d, live_lo);
                    if live_hi > 0 {
                        hi.store(d.add(V::N), live_hi);
                    }
                }
                t0 += V::N;
            }
            for (r, row) in rows.iter().enumerate() {
                let Some((epi, reg)) = row else { continue };
                let out = std::slice::from_raw_parts_mut(dst[r], a.ow);
                if bad {
                    for (xo, x) in out.iter_mut().enumerate() {
                        if !x.is_finite() {
                            *x = direct(a, ni, o, 2 * ty + r, xo);
                        }
                    }
                }
                match reg {
                    _ if epi.is_empty() => {}
                    Some(e) => {
                        let mut x0 = 0;
                        while x0 < a.ow {
                            let live = V::N.min(a.ow - x0);
                            let p = dst[r].add(x0);
                            e.apply(o, x0, live, V::load(p, live)).store(p, live);
                            x0 += V::N;
                        }
                    }
                    None => epi.apply_row(out, o, 0),
                }
            }
        }
    }
}

/// Aᵀ M A for `len` tiles (lanes) whose 16 transformed sums lie at `m + ξ · mlen`: the outputs
/// (row 0 col 0, row 0 col 1, row 1 col 0, row 1 col 1) of each tile — Aᵀ over the rows
/// (s0 = m0 + m1 + m2, s1 = m1 − m2 − m3 per column), then along them.
#[inline(always)]
unsafe fn tile_outputs<V: Lanes>(m: *const f32, mlen: usize, len: usize) -> [V; 4] {
    let mut q = [V::zero(); 16];
    for (xi, qx) in q.iter_mut().enumerate() {
        *qx = V::load(m.add(xi * mlen), len);
    }
    let mut y = [V::zero(); 4];
    for r in 0..2 {
        let mut s = [V::zero(); 4];
        for (j, sj) in s.iter_mut().enumerate() {
            *sj = if r == 0 { q[j].add(q[4 + j]).add(q[8 + j]) } else { q[4 + j].sub(q[8 + j]).sub(q[12 + j]) };
        }
        y[2 * r] = s[0].add(s[1]).add(s[2]);
        y[2 * r + 1] = s[1].sub(s[2]).sub(s[3]);
    }
    y
}

/// One row of the pooled output (tile row `ty`) for every channel: the max of each tile's four
/// outputs, NaN where one is, then the epilogue. A block whose outputs the transforms left
/// non-finite takes them as the direct sum first.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pooled_row<V: Lanes>(a: &Args, t: &Tiles, ni: usize, ty: usize, col0: usize, cols: usize, mp: *const f32, mlen: usize, (epi, reg): &(Epi, Option<RegEpi>)) {
    let pw = a.ow / 2;
    for o in 0..a.oc {
        let row = a.y.add(ni * a.ys[0] + o * a.ys[1] + ty * a.ys[2]);
        let mut t0 = 0;
        while t0 < pw {
            let len = V::N.min(t.tw - t0);
            let live = len.min(pw - t0);
            let y = tile_outputs::<V>(mp.add(o * cols + col0 + t0), mlen, len);
            let mut bad = false;
            for v in &y {
                bad |= v.any_nonfinite();
            }
            if bad {
                let mut vals = [[0f32; 16]; 4];
                for (v, dst) in y.iter().zip(vals.iter_mut()) {
                    v.store(dst.as_mut_ptr(), V::N);
                }
                for l in 0..live {
                    let mut m = f32::NEG_INFINITY;
                    for (k, vk) in vals.iter().enumerate() {
                        let mut v = vk[l];
                        if !v.is_finite() {
                            v = direct(a, ni, o, 2 * ty + k / 2, 2 * (t0 + l) + k % 2);
                        }
                        m = if m.is_nan() || v.is_nan() { f32::NAN } else { m.max(v) };
                    }
                    *row.add(t0 + l) = m;
                }
            } else {
                y[0].max_nan(y[1]).max_nan(y[2].max_nan(y[3])).store(row.add(t0), live);
            }
            t0 += V::N;
        }
        let out = std::slice::from_raw_parts_mut(row, pw);
        match reg {
            _ if epi.is_empty() => {}
            Some(e) => {
                let mut x0 = 0;
                while x0 < pw {
                    let live = V::N.min(pw - x0);
                    e.apply(o, x0, live, V::load(row.add(x0), live)).store(row.add(x0), live);
                    x0 += V::N;
                }
            }
            None => epi.apply_row(out, o, 0),
        }
    }
}

/// The direct sum of one output (an output the transforms left NaN / inf).
unsafe fn direct(a: &Args, ni: usize, o: usize, yo: usize, xo: usize) -> f32 {
    let mut acc = 0f32;
    for ci in 0..a.c {
        let xb = a.x.add(ni * a.xs[0] + ci * a.xs[1]);
        let wk = &a.w[(o * a.c + ci) * 9..(o * a.c + ci) * 9 + 9];
        for i in 0..3 {
            let yi = (yo + i) as isize - a.ph as isize;
            if yi < 0 || yi >= a.hh as isize {
                continue;
            }
            for j in 0..3 {
                let xi = (xo + j) as isize - a.pw as isize;
                if xi < 0 || xi >= a.ww as isize {
                    continue;
                }
                acc += wk[i * 3 + j] * *xb.add(yi as usize * a.xs[2] + xi as usize * a.xs[3]);
            }
        }
    }
    acc
}
