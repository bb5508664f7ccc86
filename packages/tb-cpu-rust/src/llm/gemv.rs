//! `y = x @ W^T (+ bias)` for packed weights: matrix-vector products for decode, and the same
//! loops over a few rows of `x` for small batches (int4: at any row count).
//!
//! Output rows are split into tiles of weight rows that share every activation load (`TILE`
//! rows; int4: the layout's 8-row tiles); tiles are spread over rayon's pool when the matrix
//! is big enough to pay for it. int8 and int4 weights meet block-quantized int8 activations in
//! integer dot products (int8: AVX-512 VNNI `vpdpbusd` or AVX2 `vpmaddubsw` + `vpmaddwd`; int4:
//! AVX2 `vpmaddubsw` giving eight weight rows per register), with the block and group scales
//! applied per 32 values in f32. Every SIMD path has a scalar twin that the tests compare against.

use super::act_quant::{quantize_row, QuantRow, QBLOCK};
use super::half::f16_to_f32;
use super::packed::{Packed, INT4_BLOCK_BYTES, INT4_ROWS};
use rayon::prelude::*;
use std::sync::OnceLock;

const TILE: usize = 4;
/// AVX2 kernels prefetch the weights this many tiles ahead of the one they read.
const PF_TILES: usize = 2;
/// Below this many weights (per activation row) a GEMV runs on the calling thread.
const PAR_MIN: usize = 1 << 16;

pub use crate::core::isa::Isa;

/// The level the LLM kernels run at: the CPU's best, or the portable loops under
/// `TORCHBURN_LLM_ISA=scalar` (read once).
pub fn detect() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| if std::env::var("TORCHBURN_LLM_ISA").as_deref() == Ok("scalar") { Isa::Scalar } else { Isa::best() })
}

pub fn isa_name() -> &'static str {
    detect().name()
}

/// What one activation row becomes before it meets the weights.
pub enum Act<'a> {
    Dense(&'a [f32]),
    /// bf16 weights on AVX2: the row with each full block of 16 values reordered to its 8 even
    /// then 8 odd values (`pair_order`); a tail of `K % 16` values stays in place
    Pairs(Vec<f32>),
    /// int8 weights: quantized row and `-128 × Σ_b scale_b qsum_b` (undoes the `+128` bias)
    Q8(QuantRow, f32),
    /// int4 weights: quantized row, per group `C_g = -8 Σ_{b∈g} scale_b qsum_b` and `X_g = Σ x`
    Q4(QuantRow, Vec<f32>, Vec<f32>),
    /// bf16 / int8 / int4 weights on AMX tiles (`tiles`): all the job's rows packed once, shared by every row
    Tiles(std::sync::Arc<super::tiles::XTiles>),
}

/// One weight matrix applied to prepared activation rows: `out[i * ld + r] = W[r] · x_i (+ bias[r])`
/// for every activation row `i` and weight row `r`. Several jobs run in one parallel region.
pub struct Job<'a> {
    pub p: &'a Packed,
    pub acts: &'a [Act<'a>],
    pub out: *mut f32,
    pub ld: usize,
    pub bias: Option<&'a [f32]>,
}
// SAFETY: jobs write disjoint output rows (checked by the callers that build them); the
// pointer stays valid for the call.
unsafe impl Send for Job<'_> {}
unsafe impl Sync for Job<'_> {}

/// Whether activations prepared for `a` serve `b` too (q/k/v, gate/up: one quantization).
pub fn same_prep(a: &Packed, b: &Packed) -> bool {
    match (a, b) {
        (Packed::Int8 { kp: x, k: kx, .. }, Packed::Int8 { kp: y, k: ky, .. }) => x == y && kx == ky,
        (Packed::Int4 { kp: x, k: kx, group: gx, .. }, Packed::Int4 { kp: y, k: ky, group: gy, .. }) => {
            x == y && kx == ky && gx == gy
        }
        (Packed::Bf16 { k: x, .. }, Packed::Bf16 { k: y, .. }) | (Packed::F32 { k: x, .. }, Packed::F32 { k: y, .. }) => x == y,
        _ => false,
    }
}

/// `x` `[m, K]` row-major, prepared for weights like `p`.
/// Rows that the prefill GEMM (`panel`) will take stay f32.
pub fn prepare_rows<'a>(p: &Packed, x: &'a [f32], m: usize, isa: Isa) -> Vec<Act<'a>> {
    let k = p.shape().1;
    if super::tiles::takes(p, m, isa) {
        let t = std::sync::Arc::new(super::tiles::XTiles::pack(x, m, k));
        return (0..m).map(|_| Act::Tiles(std::sync::Arc::clone(&t))).collect();
    }
    if super::panel::takes(p, m, isa) || (matches!(p, Packed::Int4 { .. }) && super::dense_gemm::may_take(p, m)) {
        return (0..m).map(|i| Act::Dense(&x[i * k..(i + 1) * k])).collect();
    }
    (0..m).map(|i| prepare(p, &x[i * k..(i + 1) * k], isa)).collect()
}

/// `x` is `[m, K]` row-major, `y` `[m, N]`, `bias` `[N]`.
pub fn linear(p: &Packed, x: &[f32], m: usize, bias: Option<&[f32]>, y: &mut [f32], isa: Isa) {
    let (n, k) = p.shape();
    assert_eq!(x.len(), m * k);
    assert_eq!(y.len(), m * n);
    let acts = prepare_rows(p, x, m, isa);
    let job = Job { p, acts: &acts, out: y.as_mut_ptr(), ld: n, bias };
    // SAFETY: one job over all of `y`, which is `m * n` long.
    unsafe { run(&[job], isa) };
}

/// Runs `jobs` over the kernel thread team (or inline when they are small), split into chunks of
/// whole tiles sized so each thread gets a few: enough to balance two threads when one is
/// preempted, few enough that scheduling costs little next to the chunk's weight bytes.
///
/// # Safety
/// Each job's `out` must be valid for writes at `i * ld + r` for every activation row `i`
/// and weight row `r`, and no two jobs (nor anything else) may write the same element.
pub unsafe fn run(jobs: &[Job], isa: Isa) {
    // Called from Python between PyTorch ops (the per-kernel path: prefill), the chunks run on
    // PyTorch's OpenMP team like the other kernels (`crate::core::par`: no second pool spinning against
    // OpenMP's workers); inside rayon's pool (the fused step runs in `rayon::scope`) on rayon.
    let on_omp = rayon::current_thread_index().is_none() && crate::core::par::pool() == "openmp";
    let threads = if on_omp { crate::core::par::threads() } else { rayon::current_num_threads() };
    let weights: usize = jobs.iter().map(|j| j.p.shape().0 * j.p.shape().1).sum();
    let parallel = !(weights < PAR_MIN || threads == 1);
    // prefill on the engine's GEMM kernels: each activation matrix packed once for every chunk
    let packed = jobs.iter().any(|j| super::dense_gemm::may_take(j.p, j.acts.len())).then(|| {
        super::dense_gemm::PackedActs::new(jobs, |items, f| {
            if !parallel || items == 1 {
                (0..items).for_each(f);
            } else if on_omp {
                crate::core::par::for_each(items, f);
            } else {
                (0..items).into_par_iter().for_each(f);
            }
        })
    });
    let packed_of = |ji: usize| packed.as_ref().and_then(|p| p.of(ji));
    if !parallel {
        for (ji, j) in jobs.iter().enumerate() {
            chunk(j, 0, j.p.shape().0, isa, packed_of(ji));
        }
        return;
    }
    // sized by weight bytes: with many activation rows (prefill) a chunk's weights are re-read
    // from L2 once per block of ACT_BLOCK rows (see `chunk`), so its size need not shrink
    let wbytes: usize = jobs.iter().map(|j| j.p.nbytes()).sum();
    let target = (wbytes / (threads * 4)).clamp(16 << 10, 512 << 10);
    let mut chunks: Vec<(usize, usize, usize)> = Vec::new();
    for (ji, j) in jobs.iter().enumerate() {
        let n = j.p.shape().0;
        let row_bytes = (j.p.nbytes() / n.max(1)).max(1);
        let per = super::dense_gemm::chunk_rows(j.p, j.acts.len(), threads).unwrap_or(target / row_bytes);
        let per = per.max(1).div_ceil(CHUNK_ROWS) * CHUNK_ROWS;
        let mut r = 0;
        while r < n {
            let nr = per.min(n - r);
            chunks.push((ji, r, nr));
            r += nr;
        }
    }
    if on_omp {
        crate::core::par::for_each(chunks.len(), |c| {
            let (ji, r0, nr) = chunks[c];
            chunk(&jobs[ji], r0, nr, isa, packed_of(ji))
        });
    } else {
        chunks.par_iter().for_each(|&(ji, r0, nr)| chunk(&jobs[ji], r0, nr, isa, packed_of(ji)));
    }
}

/// Chunks hold a multiple of this many weight rows: whole int4 tiles (8), whole prefill panels
/// (`panel::NR`, 16) and whole GEMV tiles (`TILE`). Rounding to 8 alone left half a panel at
/// the end of most prefill chunks (a full 16-column kernel call for 8 columns, then scalar
/// write-back): `down`'s 56-row chunks paid 4 panels of work for 3.5.
const CHUNK_ROWS: usize = 16;
const _: () = assert!(CHUNK_ROWS.is_multiple_of(INT4_ROWS) && CHUNK_ROWS.is_multiple_of(super::panel::NR) && CHUNK_ROWS.is_multiple_of(TILE));

/// Activation rows per pass over a chunk's weights: their quantized values (~1 KiB each for
/// K = 896) stay in L1 while the chunk's weight tiles stream past them.
const ACT_BLOCK: usize = 16;

/// Weight rows `r0 .. r0 + nrows` of one job for every activation row (`packed`: its
/// activations packed for the float32 GEMM, `dense_gemm::PackedActs`).
fn chunk(job: &Job, r0: usize, nrows: usize, isa: Isa, packed: Option<&[f32]>) {
    if super::tiles::chunk(job, r0, nrows) || super::dense_gemm::chunk(job, r0, nrows, packed) || super::panel::chunk(job, r0, nrows, isa) || super::qgemm::chunk(job, r0, nrows, isa) {
        return;
    }
    if let Packed::Int4 { .. } = job.p {
        return int4_chunk(job, r0, nrows, isa);
    }
    for (bi, block) in job.acts.chunks(ACT_BLOCK).enumerate() {
        let mut r = 0;
        while r < nrows {
            let t = TILE.min(nrows - r);
            for (ii, a) in block.iter().enumerate() {
                let i = bi * ACT_BLOCK + ii;
                let mut res = [0f32; TILE];
                tile(job.p, a, r0 + r, t, &mut res, isa);
                for (j, v) in res.iter().enumerate().take(t) {
                    let b = job.bias.map_or(0.0, |b| b[r0 + r + j]);
                    // SAFETY: the caller of `run` promised this element is ours to write.
                    unsafe { *job.out.add(i * job.ld + r0 + r + j) = v + b };
                }
            }
            r += t;
        }
    }
}

fn prepare<'a>(p: &Packed, x: &'a [f32], isa: Isa) -> Act<'a> {
    match p {
        Packed::Bf16 { .. } if isa == Isa::Avx2 && cfg!(target_arch = "x86_64") => Act::Pairs(pair_order(x)),
        Packed::Int8 { kp, .. } => {
            let q = quantize_row(x, *kp);
            let corr = -128.0 * q.scale.iter().zip(&q.qsum).map(|(s, &c)| s * c as f32).sum::<f32>();
            Act::Q8(q, corr)
        }
        Packed::Int4 { kp, k, group, .. } => {
            let q = quantize_row(x, *kp);
            let ng = k / group;
            let per = group / QBLOCK;
            let c: Vec<f32> = (0..ng)
                .map(|g| -8.0 * (g * per..(g + 1) * per).map(|b| q.scale[b] * q.qsum[b] as f32).sum::<f32>())
                .collect();
            let xs: Vec<f32> = x.chunks(*group).map(|c| c.iter().sum()).collect();
            Act::Q4(q, c, xs)
        }
        _ => Act::Dense(x),
    }
}

fn tile(p: &Packed, a: &Act, r0: usize, t: usize, res: &mut [f32; TILE], isa: Isa) {
    match (p, a) {
        (Packed::Int8 { kp, w, scale, .. }, Act::Q8(q, corr)) => {
            let wr = &w[r0 * kp..(r0 + t) * kp];
            int8_rows(wr, *kp, t, q, res, isa);
            for j in 0..t {
                let extra = if isa == Isa::Vnni { *corr } else { 0.0 };
                res[j] = scale[r0 + j] * (res[j] + extra);
            }
        }
        (Packed::Bf16 { k, w, .. }, Act::Dense(x)) => {
            bf16_rows(&w[r0 * k..(r0 + t) * k], *k, t, x, res, isa);
        }
        #[cfg(target_arch = "x86_64")]
        (Packed::Bf16 { k, w, .. }, Act::Pairs(xp)) => {
            let wr = &w[r0 * k..(r0 + t) * k];
            assert!(xp.len() == *k);
            // SAFETY: `wr` holds `t` rows of `k`, `xp` is `k` long; `prepare` made `Pairs` only
            // when `detect` saw AVX2 and FMA.
            unsafe { x86::bf16_pairs_avx2(wr.as_ptr(), *k, t, xp.as_ptr(), res) }
        }
        (Packed::F32 { k, w, .. }, Act::Dense(x)) => {
            f32_rows(&w[r0 * k..(r0 + t) * k], *k, t, x, res, isa);
        }
        _ => unreachable!("activation prepared for another weight kind"),
    }
}

// ---------------------------------------------------------------------------------------
// int8: res[j] = Σ_b scale_b Σ_{i∈b} w[j, i] xq[i] (VNNI: with the +128 bias, undone by caller)

fn int8_rows(w: &[u8], kp: usize, t: usize, q: &QuantRow, res: &mut [f32; TILE], isa: Isa) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `detect` saw the features; `w` holds `t` rows of `kp` bytes, `q` is `kp` long.
        unsafe {
            match isa {
                Isa::Vnni => return x86::int8_vnni(w.as_ptr(), kp, t, q, res),
                Isa::Avx512 | Isa::Avx2 => return x86::int8_avx2(w.as_ptr(), kp, t, q, res),
                Isa::Scalar => {}
            }
        }
    }
    let _ = isa;
    for j in 0..t {
        let row = &w[j * kp..(j + 1) * kp];
        let mut acc = 0f32;
        for (b, s) in q.scale.iter().enumerate() {
            let d: i32 = (0..QBLOCK).map(|i| (row[b * QBLOCK + i] as i32 - 128) * q.q[b * QBLOCK + i] as i32).sum();
            acc += *s * d as f32;
        }
        res[j] = acc;
    }
}

// ---------------------------------------------------------------------------------------
// int4: per group g of a weight row, sc_g (Σ_{b∈g} scale_b Σ_{i∈b} nibble_i xq_i + C_g) + zero_g X_g
// (C_g and X_g: see `Act::Q4`), eight weight rows (one tile of the layout) at a time.

/// Activation rows sharing one pass over a tile's unpacked nibbles.
const INT4_ACTS: usize = 4;

/// Weight rows `r0 .. r0 + nrows` (`r0` a multiple of `INT4_ROWS`) of an int4 job.
fn int4_chunk(job: &Job, r0: usize, nrows: usize, isa: Isa) {
    let Packed::Int4 { n, k, group, w, scale, zero, .. } = job.p else { unreachable!() };
    debug_assert!(r0.is_multiple_of(INT4_ROWS));
    let ng = k / group;
    let (tile_bytes, tile_groups) = ((k / 32) * INT4_BLOCK_BYTES, ng * INT4_ROWS);
    let q4: Vec<(&QuantRow, &[f32], &[f32])> = job
        .acts
        .iter()
        .map(|a| match a {
            Act::Q4(q, c, xs) => {
                assert!(q.q.len() >= *k && c.len() == ng && xs.len() == ng);
                (q, c.as_slice(), xs.as_slice())
            }
            _ => unreachable!("activation prepared for another weight kind"),
        })
        .collect();
    let rows_end = (r0 + nrows).min(*n);
    #[cfg(target_arch = "x86_64")]
    if q4.len() == 1 && isa != Isa::Scalar && rows_end > r0 {
        // decode: one activation row against every tile of the chunk in one loop (per-tile
        // calls cost ~40 % of the kernel's time at one row)
        let (t0, t1) = (r0 / INT4_ROWS, rows_end.div_ceil(INT4_ROWS));
        let (wt, sc, ze) = (&w[t0 * tile_bytes..t1 * tile_bytes], &scale[t0 * tile_groups..t1 * tile_groups], &zero[t0 * tile_groups..t1 * tile_groups]);
        let bias = job.bias.map(|b| &b[r0..rows_end]);
        // SAFETY: every non-scalar `Isa` has AVX2, FMA and F16C (`detect`); the tiles' slices
        // hold t1 - t0 tiles, `int4_chunk`'s check above covers the activation row; the caller
        // of `run` promised columns r0 .. rows_end of the output row as ours to write
        unsafe { x86::int4_avx2_one_row(wt, sc, ze, *k, *group, q4[0], job.out.add(r0), bias, rows_end - r0) };
        return;
    }
    for (bi, block) in q4.chunks(ACT_BLOCK).enumerate() {
        for t in r0 / INT4_ROWS..(r0 + nrows).div_ceil(INT4_ROWS) {
            let wt = &w[t * tile_bytes..(t + 1) * tile_bytes];
            let (sc, ze) = (&scale[t * tile_groups..(t + 1) * tile_groups], &zero[t * tile_groups..(t + 1) * tile_groups]);
            let row0 = t * INT4_ROWS;
            let rows = INT4_ROWS.min(n - row0).min(r0 + nrows - row0);
            let bias = job.bias.map(|b| &b[row0..row0 + rows]);
            // SAFETY: the caller of `run` promised columns row0 .. row0 + rows of every activation
            // row (this block's: rows bi * ACT_BLOCK ..) as ours to write
            unsafe { int4_tile(wt, sc, ze, *k, *group, block, job.out.add(bi * ACT_BLOCK * job.ld + row0), job.ld, bias, rows, isa) };
        }
    }
}

/// `out[i * ld + l]` = weight row `l` (< `rows`) of tile `wt` (scales `sc`, zeros `ze`:
/// `[groups][8]` binary16) times activation row `i` (+ `bias[l]`), for every row `i` of `acts`.
///
/// # Safety
/// `out` valid for writes at `i * ld + l` for every `i < acts.len()`, `l < rows` (<= 8);
/// `bias`, when given, holds `rows` values.
#[allow(clippy::too_many_arguments)]
unsafe fn int4_tile(wt: &[u8], sc: &[u16], ze: &[u16], k: usize, group: usize, acts: &[(&QuantRow, &[f32], &[f32])], out: *mut f32, ld: usize, bias: Option<&[f32]>, rows: usize, isa: Isa) {
    assert!(rows <= INT4_ROWS && bias.is_none_or(|b| b.len() == rows));
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        assert!(wt.len() == (k / 32) * INT4_BLOCK_BYTES && sc.len() == (k / group) * INT4_ROWS && ze.len() == sc.len());
        // SAFETY: every non-scalar `Isa` has AVX2, FMA and F16C (`detect`); lengths asserted,
        // `int4_chunk` checked each activation row's lengths, the caller vouches for `out`.
        let a = x86::Int4Tile { w: wt.as_ptr(), sc: sc.as_ptr(), ze: ze.as_ptr(), k, group };
        return x86::int4_avx2_into(&a, acts, out, ld, bias, rows);
    }
    let _ = isa;
    let ng = k / group;
    for (i, (q, c, xs)) in acts.iter().enumerate() {
        for l in 0..rows {
            let mut acc = 0f32;
            for g in 0..ng {
                let mut gsum = c[g];
                for b in g * group / 32..(g + 1) * group / 32 {
                    let block = &wt[b * INT4_BLOCK_BYTES..(b + 1) * INT4_BLOCK_BYTES];
                    let d: i32 = (0..32)
                        .map(|j| {
                            let byte = block[(j / 8) * 32 + l * 4 + j % 4];
                            let nib = if j % 8 >= 4 { byte >> 4 } else { byte & 15 };
                            nib as i32 * q.q[b * 32 + j] as i32
                        })
                        .sum();
                    gsum += d as f32 * q.scale[b];
                }
                acc += f16_to_f32(sc[g * INT4_ROWS + l]) * gsum + f16_to_f32(ze[g * INT4_ROWS + l]) * xs[g];
            }
            *out.add(i * ld + l) = acc + bias.map_or(0.0, |b| b[l]);
        }
    }
}

/// `x` with each full block of 16 values reordered to its 8 even then its 8 odd values: the
/// order in which `x86::bf16_pairs_avx2` takes apart a block of 16 bf16 weights.
pub fn pair_order(x: &[f32]) -> Vec<f32> {
    let mut out = x.to_vec();
    for (o, b) in out.chunks_exact_mut(16).zip(x.chunks_exact(16)) {
        for j in 0..8 {
            o[j] = b[2 * j];
            o[8 + j] = b[2 * j + 1];
        }
    }
    out
}

fn bf16_rows(w: &[u16], k: usize, t: usize, x: &[f32], res: &mut [f32; TILE], isa: Isa) {
    #[cfg(target_arch = "x86_64")]
    {
        if matches!(isa, Isa::Vnni | Isa::Avx512) {
            // SAFETY: `w` holds `t` rows of `k`, `x` is `k` long.
            unsafe { return x86::bf16_avx512(w.as_ptr(), k, t, x.as_ptr(), res) }
        }
    }
    // AVX2 takes `Act::Pairs` (`x86::bf16_pairs_avx2`), never this
    let _ = isa;
    for j in 0..t {
        res[j] = w[j * k..(j + 1) * k].iter().zip(x).map(|(&a, b)| f32::from_bits((a as u32) << 16) * b).sum();
    }
}

fn f32_rows(w: &[f32], k: usize, t: usize, x: &[f32], res: &mut [f32; TILE], isa: Isa) {
    #[cfg(target_arch = "x86_64")]
    {
        if matches!(isa, Isa::Vnni | Isa::Avx512) {
            // SAFETY: as for bf16.
            unsafe { return x86::f32_avx512(w.as_ptr(), k, t, x.as_ptr(), res) }
        }
        if isa == Isa::Avx2 {
            // SAFETY: as for bf16.
            unsafe { return x86::f32_avx2(w.as_ptr(), k, t, x.as_ptr(), res) }
        }
    }
    let _ = isa;
    for j in 0..t {
        res[j] = w[j * k..(j + 1) * k].iter().zip(x).map(|(a, b)| a * b).sum();
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{QuantRow, PF_TILES, TILE};

    /// How far ahead (in bf16 values: 1 KiB) `bf16_pairs_avx2` prefetches, non-temporally (the
    /// weights are read once per token). In `bench::decode_shape` (same process, interleaved) no
    /// prefetch ran 8-14 % slower; 2 and 4 KiB and the T0 / T1 hints were no better.
    const BF16_AHEAD: usize = 512;
    use std::arch::x86_64::*;

    // Row-outer loops: a tile's rows are contiguous, so the weights stream as one sequential
    // run the hardware prefetcher follows (interleaving 4 short rows measured 2x slower), and
    // the activation row stays in L1.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn int8_vnni(w: *const u8, kp: usize, t: usize, q: &QuantRow, res: &mut [f32; TILE]) {
        let (qp, lp) = (q.q.as_ptr(), q.lane_scale.as_ptr());
        for j in 0..t {
            let row = w.add(j * kp);
            let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            let mut c = 0;
            while c < kp / 64 {
                // kp is a multiple of 128: chunks come in pairs, one per accumulator
                let d0 = _mm512_dpbusd_epi32(
                    _mm512_setzero_si512(),
                    _mm512_loadu_si512(row.add(c * 64) as *const _),
                    _mm512_loadu_si512(qp.add(c * 64) as *const _),
                );
                let d1 = _mm512_dpbusd_epi32(
                    _mm512_setzero_si512(),
                    _mm512_loadu_si512(row.add(c * 64 + 64) as *const _),
                    _mm512_loadu_si512(qp.add(c * 64 + 64) as *const _),
                );
                a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d0), _mm512_loadu_ps(lp.add(c * 16)), a0);
                a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d1), _mm512_loadu_ps(lp.add(c * 16 + 16)), a1);
                c += 2;
            }
            res[j] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
        }
    }

    /// AVX2: `vpmaddubsw` multiplies unsigned by signed bytes and must not saturate, so it
    /// takes |xq| (once per block, shared by the tile's rows) times w with xq's sign moved
    /// onto it (one `vpsignb` per row); |xq| <= 127 and |w| <= 127 keep pair sums in i16.
    /// The tile height is a const parameter so the accumulators live in registers; the tile
    /// two ahead is prefetched as this one streams (a chunk's rows are contiguous).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn int8_avx2(w: *const u8, kp: usize, t: usize, q: &QuantRow, res: &mut [f32; TILE]) {
        match t {
            4 => int8_avx2_t::<4>(w, kp, q, res),
            3 => int8_avx2_t::<3>(w, kp, q, res),
            2 => int8_avx2_t::<2>(w, kp, q, res),
            _ => int8_avx2_t::<1>(w, kp, q, res),
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn int8_avx2_t<const T: usize>(w: *const u8, kp: usize, q: &QuantRow, res: &mut [f32; TILE]) {
        let mut acc = [_mm256_setzero_ps(); T];
        let ones = _mm256_set1_epi16(1);
        let bias = _mm256_set1_epi8(-128);
        let qp = q.q.as_ptr();
        let next = w.wrapping_add(PF_TILES * T * kp);
        for b in 0..kp / 32 {
            for l in 0..T.div_ceil(2) {
                _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(b * 32 * T + l * 64) as *const i8);
            }
            let xv = _mm256_loadu_si256(qp.add(b * 32) as *const _);
            let ax = _mm256_abs_epi8(xv);
            let sv = _mm256_set1_ps(*q.scale.get_unchecked(b));
            for j in 0..T {
                let wv = _mm256_xor_si256(_mm256_loadu_si256(w.add(j * kp + b * 32) as *const _), bias);
                let d = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(wv, xv)), ones);
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), sv, acc[j]);
            }
        }
        for j in 0..T {
            res[j] = hsum256(acc[j]);
        }
    }

    /// One int4 tile (eight weight rows) and where its scales and zeros are.
    pub struct Int4Tile {
        pub w: *const u8,
        /// binary16 scales and zeros, `[groups][8]`
        pub sc: *const u16,
        pub ze: *const u16,
        pub k: usize,
        pub group: usize,
    }

    /// `R` activation rows times the tile's eight weight rows, one output lane per weight row.
    /// Per 32-column block: four 32-byte loads, each giving (AND, shift) four columns of all
    /// eight rows; `vpmaddubsw` against four activation bytes broadcast to every row, summed
    /// in i16 over the block (8 x 2 x 15 x 127 = 30480 < 2^15: no overflow); then one
    /// `vpmaddwd`, one conversion and one FMA with the block's activation scale per activation
    /// row, for eight weight rows at once. Per group: the group's float16 scales and zeros
    /// (one 16-byte load and one `vcvtph2ps` each) and the offset / zero-point terms.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn int4_avx2<const R: usize>(t: &Int4Tile, acts: &[(&QuantRow, &[f32], &[f32])], res: &mut [[f32; 8]; 4]) {
        let ones = _mm256_set1_epi16(1);
        let nib = _mm256_set1_epi8(15);
        let mut qp = [std::ptr::null::<i8>(); R];
        let mut qs = [std::ptr::null::<f32>(); R];
        for i in 0..R {
            qp[i] = acts[i].0.q.as_ptr();
            qs[i] = acts[i].0.scale.as_ptr();
        }
        let per = t.group / 32;
        let mut acc = [_mm256_setzero_ps(); R];
        for g in 0..t.k / t.group {
            // the group's offset term C_g starts the sum (one add fewer per group and row)
            let mut gacc = [_mm256_setzero_ps(); R];
            for i in 0..R {
                gacc[i] = _mm256_set1_ps(*acts[i].1.get_unchecked(g));
            }
            for b in g * per..(g + 1) * per {
                let wb = t.w.add(b * 128);
                let mut s16 = [_mm256_setzero_si256(); R];
                for m in 0..4 {
                    let v = _mm256_loadu_si256(wb.add(m * 32) as *const _);
                    let lo = _mm256_and_si256(v, nib);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
                    for i in 0..R {
                        let x = qp[i].add(b * 32 + m * 8) as *const i32;
                        let x0 = _mm256_set1_epi32(x.read_unaligned());
                        let x1 = _mm256_set1_epi32(x.add(1).read_unaligned());
                        let p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, x0), _mm256_maddubs_epi16(hi, x1));
                        s16[i] = _mm256_add_epi16(s16[i], p);
                    }
                }
                for i in 0..R {
                    let d = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16[i], ones));
                    gacc[i] = _mm256_fmadd_ps(d, _mm256_set1_ps(*qs[i].add(b)), gacc[i]);
                }
            }
            let s = _mm256_cvtph_ps(_mm_loadu_si128(t.sc.add(g * 8) as *const __m128i));
            let z = _mm256_cvtph_ps(_mm_loadu_si128(t.ze.add(g * 8) as *const __m128i));
            for i in 0..R {
                acc[i] = _mm256_fmadd_ps(s, gacc[i], acc[i]);
                acc[i] = _mm256_fmadd_ps(z, _mm256_set1_ps(*acts[i].2.get_unchecked(g)), acc[i]);
            }
        }
        for i in 0..R {
            _mm256_storeu_ps(res[i].as_mut_ptr(), acc[i]);
        }
    }

    /// One activation row against consecutive tiles (`wt`, `sc`, `ze`: the tiles' weights,
    /// scales and zeros, `rows` weight rows in all): `out[l]` = weight row `l` times the row (+
    /// `bias[l]`), the same operations in the same order as `int4_avx2::<1>` per tile, without a
    /// call per tile.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `wt` / `sc` / `ze` hold `rows.div_ceil(8)` tiles of depth `k` and
    /// group `group`, `act`'s row at least `k` values and `k / group` group terms; `out` valid
    /// for `rows` writes; `bias`, when given, `rows` values.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn int4_avx2_one_row(wt: &[u8], sc: &[u16], ze: &[u16], k: usize, group: usize, act: (&QuantRow, &[f32], &[f32]), out: *mut f32, bias: Option<&[f32]>, rows: usize) {
        let (q, c, xs) = act;
        let ng = k / group;
        let per = group / 32;
        let tiles = rows.div_ceil(8);
        let (tile_bytes, tile_groups) = ((k / 32) * super::INT4_BLOCK_BYTES, ng * 8);
        assert!(wt.len() >= tiles * tile_bytes && sc.len() >= tiles * tile_groups && ze.len() >= tiles * tile_groups);
        assert!(q.q.len() >= k && q.scale.len() >= k / 32 && c.len() >= ng && xs.len() >= ng && bias.is_none_or(|b| b.len() >= rows));
        let ones = _mm256_set1_epi16(1);
        let nib = _mm256_set1_epi8(15);
        let (qp, qs) = (q.q.as_ptr(), q.scale.as_ptr());
        for t in 0..tiles {
            let (w, s_, z_) = (wt.as_ptr().add(t * tile_bytes), sc.as_ptr().add(t * tile_groups), ze.as_ptr().add(t * tile_groups));
            let mut acc = _mm256_setzero_ps();
            for g in 0..ng {
                let mut gacc = _mm256_set1_ps(*c.get_unchecked(g));
                for b in g * per..(g + 1) * per {
                    let wb = w.add(b * 128);
                    let mut s16 = _mm256_setzero_si256();
                    for m in 0..4 {
                        let v = _mm256_loadu_si256(wb.add(m * 32) as *const _);
                        let lo = _mm256_and_si256(v, nib);
                        let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
                        let x = qp.add(b * 32 + m * 8) as *const i32;
                        let x0 = _mm256_set1_epi32(x.read_unaligned());
                        let x1 = _mm256_set1_epi32(x.add(1).read_unaligned());
                        let p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, x0), _mm256_maddubs_epi16(hi, x1));
                        s16 = _mm256_add_epi16(s16, p);
                    }
                    let d = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, ones));
                    gacc = _mm256_fmadd_ps(d, _mm256_set1_ps(*qs.add(b)), gacc);
                }
                let s = _mm256_cvtph_ps(_mm_loadu_si128(s_.add(g * 8) as *const __m128i));
                let z = _mm256_cvtph_ps(_mm_loadu_si128(z_.add(g * 8) as *const __m128i));
                acc = _mm256_fmadd_ps(s, gacc, acc);
                acc = _mm256_fmadd_ps(z, _mm256_set1_ps(*xs.get_unchecked(g)), acc);
            }
            let r = t * 8;
            let nv = 8.min(rows - r);
            if nv == 8 {
                if let Some(b) = bias {
                    acc = _mm256_add_ps(acc, _mm256_loadu_ps(b.as_ptr().add(r)));
                }
                _mm256_storeu_ps(out.add(r), acc);
            } else {
                let mut lanes = [0f32; 8];
                _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
                for (l, v) in lanes.iter().enumerate().take(nv) {
                    *out.add(r + l) = v + bias.map_or(0.0, |b| b[r + l]);
                }
            }
        }
    }

    /// `int4_avx2` over every activation row of `acts`, `INT4_ACTS` at a time, each row's
    /// results (+ `bias`) stored straight into `out[i * ld ..]` (a whole tile: one vector store).
    ///
    /// # Safety
    /// As `gemv::int4_tile`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn int4_avx2_into(t: &Int4Tile, acts: &[(&QuantRow, &[f32], &[f32])], out: *mut f32, ld: usize, bias: Option<&[f32]>, rows: usize) {
        let mut res = [[0f32; 8]; 4];
        for (gi, group) in acts.chunks(super::INT4_ACTS).enumerate() {
            match group.len() {
                4 => int4_avx2::<4>(t, group, &mut res),
                3 => int4_avx2::<3>(t, group, &mut res),
                2 => int4_avx2::<2>(t, group, &mut res),
                _ => int4_avx2::<1>(t, group, &mut res),
            }
            for (ii, r) in res.iter().enumerate().take(group.len()) {
                let dst = out.add((gi * super::INT4_ACTS + ii) * ld);
                if rows == 8 {
                    let mut v = _mm256_loadu_ps(r.as_ptr());
                    if let Some(b) = bias {
                        v = _mm256_add_ps(v, _mm256_loadu_ps(b.as_ptr()));
                    }
                    _mm256_storeu_ps(dst, v);
                } else {
                    for (l, v) in r.iter().enumerate().take(rows) {
                        *dst.add(l) = v + bias.map_or(0.0, |b| b[l]);
                    }
                }
            }
        }
    }

    /// How far ahead (bytes) the AVX-512 bf16 / f32 decode rows prefetch the weights, into L1
    /// (`_MM_HINT_T0`; a chunk's rows are contiguous, so this runs into the next rows). Qwen2.5-
    /// 0.5B-shaped decode, 2 threads, separate processes alternated, best of 3 × 64 tokens each:
    /// no prefetch fp32 12.0-12.3 / bf16 21.2-22.0 tok/s; 2 KiB ahead 14.2-14.5 / 22.3-23.5; 512 B
    /// and 1 KiB between them, 4 KiB no better for fp32 and worse for bf16 (20.1); the non-temporal
    /// hint (AVX2's choice) 7.5 / 14.9.
    const AVX512_AHEAD: usize = 2048;

    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn bf16_avx512(w: *const u16, k: usize, t: usize, x: *const f32, res: &mut [f32; TILE]) {
        let k32 = k / 32 * 32;
        for j in 0..t {
            let row = w.add(j * k);
            let ahead = (row as *const i8).wrapping_add(AVX512_AHEAD);
            let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            for i in (0..k32).step_by(32) {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(2 * i));
                let w0 = _mm512_cvtepu16_epi32(_mm256_loadu_si256(row.add(i) as *const _));
                let w1 = _mm512_cvtepu16_epi32(_mm256_loadu_si256(row.add(i + 16) as *const _));
                a0 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(w0, 16)), _mm512_loadu_ps(x.add(i)), a0);
                a1 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(w1, 16)), _mm512_loadu_ps(x.add(i + 16)), a1);
            }
            let mut s = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
            for i in k32..k {
                s += f32::from_bits((*row.add(i) as u32) << 16) * *x.add(i);
            }
            res[j] = s;
        }
    }

    #[target_feature(enable = "avx512f,avx512vl")]
    pub unsafe fn f32_avx512(w: *const f32, k: usize, t: usize, x: *const f32, res: &mut [f32; TILE]) {
        let k32 = k / 32 * 32;
        for j in 0..t {
            let row = w.add(j * k);
            let ahead = (row as *const i8).wrapping_add(AVX512_AHEAD);
            let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            for i in (0..k32).step_by(32) {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(4 * i));
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(4 * i + 64));
                a0 = _mm512_fmadd_ps(_mm512_loadu_ps(row.add(i)), _mm512_loadu_ps(x.add(i)), a0);
                a1 = _mm512_fmadd_ps(_mm512_loadu_ps(row.add(i + 16)), _mm512_loadu_ps(x.add(i + 16)), a1);
            }
            let mut s = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
            for i in k32..k {
                s += *row.add(i) * *x.add(i);
            }
            res[j] = s;
        }
    }

    /// bf16 rows against an activation row in `pair_order`. A 32-bit lane of 16 loaded bf16
    /// weights holds an (even, odd) pair: shifted left by 16 it is the even weight as an f32,
    /// with the low half masked off the odd one. Two single-cycle ALU operations per 16
    /// weights, where widening in order takes two lane-crossing `vpmovzxwd`, two shifts and an
    /// extract: fewer instructions per cache line let the out-of-order window hold more lines
    /// in flight. The weights `BF16_AHEAD` values ahead are prefetched as these stream (a chunk's
    /// rows are contiguous, so that runs into the next rows). On a Qwen2.5-0.5B-shaped decode
    /// (`bench::decode_shape`, 2 threads) this ran 58-63 ms/token against 64-65 for the in-order widening.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn bf16_pairs_avx2(w: *const u16, k: usize, t: usize, xp: *const f32, res: &mut [f32; TILE]) {
        let hi = _mm256_set1_epi32(0xffff_0000u32 as i32);
        for j in 0..t {
            let row = w.add(j * k);
            let ahead = row.wrapping_add(BF16_AHEAD);
            let mut a = [_mm256_setzero_ps(); 4];
            let mut b = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            // two cache lines per pass: at one line per pass the loop's own bookkeeping was 5 of
            // its 15 instructions (1-3 % faster in `bench::decode_shape`, interleaved)
            while i + 64 <= k {
                _mm_prefetch::<_MM_HINT_NTA>(ahead.wrapping_add(i) as *const i8);
                _mm_prefetch::<_MM_HINT_NTA>(ahead.wrapping_add(i + 32) as *const i8);
                let v0 = _mm256_loadu_si256(row.add(i) as *const __m256i);
                let v1 = _mm256_loadu_si256(row.add(i + 16) as *const __m256i);
                let v2 = _mm256_loadu_si256(row.add(i + 32) as *const __m256i);
                let v3 = _mm256_loadu_si256(row.add(i + 48) as *const __m256i);
                (a[0], a[1]) = pair_fma(v0, xp.add(i), a[0], a[1], hi);
                (a[2], a[3]) = pair_fma(v1, xp.add(i + 16), a[2], a[3], hi);
                (b[0], b[1]) = pair_fma(v2, xp.add(i + 32), b[0], b[1], hi);
                (b[2], b[3]) = pair_fma(v3, xp.add(i + 48), b[2], b[3], hi);
                i += 64;
            }
            for l in 0..4 {
                a[l] = _mm256_add_ps(a[l], b[l]);
            }
            while i + 32 <= k {
                _mm_prefetch::<_MM_HINT_NTA>(ahead.wrapping_add(i) as *const i8);
                let v0 = _mm256_loadu_si256(row.add(i) as *const __m256i);
                let v1 = _mm256_loadu_si256(row.add(i + 16) as *const __m256i);
                (a[0], a[1]) = pair_fma(v0, xp.add(i), a[0], a[1], hi);
                (a[2], a[3]) = pair_fma(v1, xp.add(i + 16), a[2], a[3], hi);
                i += 32;
            }
            if i + 16 <= k {
                let v = _mm256_loadu_si256(row.add(i) as *const __m256i);
                (a[0], a[1]) = pair_fma(v, xp.add(i), a[0], a[1], hi);
                i += 16;
            }
            let mut s = hsum256(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
            for c in i..k {
                s += f32::from_bits((*row.add(c) as u32) << 16) * *xp.add(c);
            }
            res[j] = s;
        }
    }

    /// 16 bf16 weights `v` as (even, odd) pairs times the pair-ordered activations at `x`
    /// (8 even, then 8 odd), added to `even` / `odd`: a shift left by 16 gives the even weights
    /// as f32, masking off the low halves (`hi`) the odd ones.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn pair_fma(v: __m256i, x: *const f32, even: __m256, odd: __m256, hi: __m256i) -> (__m256, __m256) {
        (
            _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), _mm256_loadu_ps(x), even),
            _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v, hi)), _mm256_loadu_ps(x.add(8)), odd),
        )
    }

    /// AVX2 fp32 GEMV, row-outer like the AVX-512 ones: a tile's rows are contiguous, so the
    /// weights stream as one sequential run the hardware prefetcher follows (interleaving the 4
    /// rows of a K = 896 tile measured 3x slower here); the activation row stays in L1. Four
    /// accumulators per row cover the FMA latency. A software prefetch 2-4 KiB ahead (NTA or T1)
    /// made fp32 decode 9-20 % slower (old and new builds alternated): the streamer does better.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn f32_avx2(w: *const f32, k: usize, t: usize, x: *const f32, res: &mut [f32; TILE]) {
        for j in 0..t {
            let row = w.add(j * k);
            let mut a = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i + 32 <= k {
                for (l, acc) in a.iter_mut().enumerate() {
                    *acc = _mm256_fmadd_ps(_mm256_loadu_ps(row.add(i + 8 * l)), _mm256_loadu_ps(x.add(i + 8 * l)), *acc);
                }
                i += 32;
            }
            while i + 8 <= k {
                a[0] = _mm256_fmadd_ps(_mm256_loadu_ps(row.add(i)), _mm256_loadu_ps(x.add(i)), a[0]);
                i += 8;
            }
            let mut s = hsum256(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
            for c in i..k {
                s += *row.add(c) * *x.add(c);
            }
            res[j] = s;
        }
    }

    use crate::core::math::vector::hsum256;
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::half::round_f16;
    use super::super::test_util::lcg;

    fn reference(w: &[f32], n: usize, k: usize, x: &[f32], m: usize) -> Vec<f32> {
        let mut y = vec![0f32; m * n];
        for i in 0..m {
            for r in 0..n {
                y[i * n + r] = (0..k).map(|c| w[r * k + c] * x[i * k + c]).sum();
            }
        }
        y
    }

    fn close(a: &[f32], b: &[f32], tol: f32) {
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= tol * scale, "{x} vs {y} (scale {scale})");
        }
    }

    /// `linear` (no bias) at every level this CPU runs, against `want`.
    fn every_isa_close(p: &Packed, x: &[f32], m: usize, want: &[f32], tol: f32) {
        for isa in Isa::supported() {
            let mut y = vec![0f32; want.len()];
            linear(p, x, m, None, &mut y, isa);
            close(&y, want, tol);
        }
    }

    #[test]
    fn int8_matches_dequantized() {
        let mut s = 1u64;
        for &(n, k, m) in &[(5, 33, 1), (9, 200, 3), (300, 896, 1), (13, 96, 37)] {
            let q: Vec<i8> = (0..n * k).map(|_| (lcg(&mut s) * 254.0) as i8).collect();
            let sc: Vec<f32> = (0..n).map(|_| round_f16(0.01 + lcg(&mut s).abs() * 0.01)).collect();
            let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut s)).collect();
            let w: Vec<f32> = (0..n * k).map(|i| q[i] as f32 * sc[i / k]).collect();
            let want = reference(&w, n, k, &x, m);
            let p = Packed::int8(n, k, &q, &sc).unwrap();
            every_isa_close(&p, &x, m, &want, 2e-2);
        }
    }

    #[test]
    fn int4_matches_dequantized() {
        let mut s = 7u64;
        for &(n, k, m, g) in &[(3, 64, 1, 32), (7, 192, 2, 64), (130, 896, 1, 128), (5, 4864, 1, 32), (9, 128, 33, 32)] {
            let nib: Vec<u8> = (0..n * k).map(|_| ((lcg(&mut s) + 0.5) * 15.99) as u8).collect();
            let packed: Vec<u8> = (0..n * k / 2).map(|j| nib[2 * j] | (nib[2 * j + 1] << 4)).collect();
            let ng = n * k / g;
            let sc: Vec<f32> = (0..ng).map(|_| round_f16(0.01 + lcg(&mut s).abs() * 0.01)).collect();
            let ze: Vec<f32> = (0..ng).map(|_| round_f16(lcg(&mut s) * 0.01)).collect();
            let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut s)).collect();
            let w: Vec<f32> = (0..n * k).map(|i| (nib[i] as f32 - 8.0) * sc[i / g] + ze[i / g]).collect();
            let want = reference(&w, n, k, &x, m);
            let p = Packed::int4(n, k, g, &packed, &sc, &ze).unwrap();
            every_isa_close(&p, &x, m, &want, 2e-2);
        }
    }

    /// int4 with a bias: whole and partial tiles (n = 13), activation rows past one
    /// `ACT_BLOCK` in groups of `INT4_ACTS` and a remainder (m = 37), every ISA, the output
    /// written through a row stride wider than n; the columns between stay untouched.
    #[test]
    fn int4_bias_partial_tiles_and_row_blocks() {
        let mut s = 11u64;
        let (n, k, m, g, ld) = (13usize, 96usize, 37usize, 32usize, 16usize);
        let nib: Vec<u8> = (0..n * k).map(|_| ((lcg(&mut s) + 0.5) * 15.99) as u8).collect();
        let packed: Vec<u8> = (0..n * k / 2).map(|j| nib[2 * j] | (nib[2 * j + 1] << 4)).collect();
        let sc: Vec<f32> = (0..n * k / g).map(|_| round_f16(0.01 + lcg(&mut s).abs() * 0.01)).collect();
        let ze: Vec<f32> = (0..n * k / g).map(|_| round_f16(lcg(&mut s) * 0.01)).collect();
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut s)).collect();
        let bias: Vec<f32> = (0..n).map(|i| i as f32 - 6.0).collect();
        let w: Vec<f32> = (0..n * k).map(|i| (nib[i] as f32 - 8.0) * sc[i / g] + ze[i / g]).collect();
        let want = reference(&w, n, k, &x, m);
        let p = Packed::int4(n, k, g, &packed, &sc, &ze).unwrap();
        for isa in Isa::supported() {
            let acts: Vec<Act> = (0..m).map(|i| prepare(&p, &x[i * k..(i + 1) * k], isa)).collect();
            let mut y = vec![f32::NAN; m * ld];
            let job = Job { p: &p, acts: &acts, out: y.as_mut_ptr(), ld, bias: Some(&bias) };
            int4_chunk(&job, 0, n, isa);
            for i in 0..m {
                let got: Vec<f32> = y[i * ld..i * ld + n].to_vec();
                let exp: Vec<f32> = (0..n).map(|r| want[i * n + r] + bias[r]).collect();
                close(&got, &exp, 2e-2);
                assert!(y[i * ld + n..(i + 1) * ld].iter().all(|v| v.is_nan()), "wrote past column n ({isa:?})");
            }
        }
    }

    #[test]
    fn dense_match_reference() {
        let mut s = 3u64;
        let (n, k, m) = (37, 131, 2);
        let w: Vec<f32> = (0..n * k).map(|_| lcg(&mut s)).collect();
        let wb: Vec<u16> = w.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
        let wt: Vec<f32> = wb.iter().map(|&b| f32::from_bits((b as u32) << 16)).collect();
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut s)).collect();
        let bias: Vec<f32> = (0..n).map(|i| i as f32).collect();
        for isa in Isa::supported() {
            let mut y = vec![0f32; m * n];
            linear(&Packed::f32(n, k, &w).unwrap(), &x, m, Some(&bias), &mut y, isa);
            let mut want = reference(&w, n, k, &x, m);
            for (i, v) in want.iter_mut().enumerate() {
                *v += bias[i % n];
            }
            close(&y, &want, 1e-5);
            linear(&Packed::bf16(n, k, &wb).unwrap(), &x, m, None, &mut y, isa);
            close(&y, &reference(&wt, n, k, &x, m), 1e-5);
        }
    }

    #[test]
    fn dense_odd_sizes_every_isa() {
        let mut s = 11u64;
        for &(n, k, m) in &[(1, 1, 1), (3, 15, 1), (5, 16, 2), (6, 17, 1), (9, 47, 3), (4, 40, 1), (3, 48, 2), (7, 63, 1), (5, 1000, 2), (70, 896, 1)] {
            let w: Vec<f32> = (0..n * k).map(|_| lcg(&mut s)).collect();
            let wb: Vec<u16> = w.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
            let wt: Vec<f32> = wb.iter().map(|&b| f32::from_bits((b as u32) << 16)).collect();
            let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut s)).collect();
            for isa in Isa::supported() {
                let mut y = vec![0f32; m * n];
                linear(&Packed::f32(n, k, &w).unwrap(), &x, m, None, &mut y, isa);
                close(&y, &reference(&w, n, k, &x, m), 1e-5);
                linear(&Packed::bf16(n, k, &wb).unwrap(), &x, m, None, &mut y, isa);
                close(&y, &reference(&wt, n, k, &x, m), 1e-5);
            }
        }
    }

    #[test]
    fn pair_order_splits_full_blocks_and_keeps_the_tail() {
        let x: Vec<f32> = (0..37).map(|i| i as f32).collect();
        let p = pair_order(&x);
        let want: Vec<f32> = [0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15]
            .iter()
            .flat_map(|&i| [i as f32])
            .chain((0..16).map(|j| if j < 8 { 16.0 + 2.0 * j as f32 } else { 17.0 + 2.0 * (j - 8) as f32 }))
            .chain((32..37).map(|i| i as f32))
            .collect();
        assert_eq!(p, want);
    }

    /// Several weights in one parallel region, sharing one activation preparation and writing
    /// column ranges of one strided output (the fused step's q/k/v and gate/up).
    #[test]
    fn jobs_share_activations_and_write_strided_columns() {
        let mut s = 9u64;
        let (k, m) = (256, 3);
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut s)).collect();
        for isa in Isa::supported() {
            for kind in ["int8", "int4", "f32"] {
                let ns = [130usize, 33, 33];
                let mut packed = Vec::new();
                let mut dense = Vec::new();
                for &n in &ns {
                    let w: Vec<f32> = (0..n * k).map(|_| lcg(&mut s)).collect();
                    let (p, wd) = match kind {
                        "int8" => {
                            let q: Vec<i8> = w.iter().map(|v| (v * 254.0) as i8).collect();
                            let sc = vec![0.01f32; n];
                            (Packed::int8(n, k, &q, &sc).unwrap(), q.iter().map(|&v| v as f32 * 0.01).collect::<Vec<_>>())
                        }
                        "int4" => {
                            let nib: Vec<u8> = w.iter().map(|v| ((v + 0.5) * 15.99) as u8).collect();
                            let pk: Vec<u8> = (0..n * k / 2).map(|j| nib[2 * j] | (nib[2 * j + 1] << 4)).collect();
                            let (s2, z1) = (round_f16(0.02), round_f16(0.01));
                            let (sc, ze) = (vec![s2; n * k / 64], vec![z1; n * k / 64]);
                            let wd = nib.iter().map(|&v| (v as f32 - 8.0) * s2 + z1).collect();
                            (Packed::int4(n, k, 64, &pk, &sc, &ze).unwrap(), wd)
                        }
                        _ => (Packed::f32(n, k, &w).unwrap(), w.clone()),
                    };
                    assert!(packed.is_empty() || same_prep(&packed[0], &p));
                    packed.push(p);
                    dense.push(wd);
                }
                let ld = ns.iter().sum::<usize>() + 5;
                let mut out = vec![f32::NAN; m * ld];
                let acts = prepare_rows(&packed[0], &x, m, isa);
                let bias: Vec<f32> = (0..33).map(|i| i as f32).collect();
                let mut col = 0;
                let mut jobs = Vec::new();
                for (j, p) in packed.iter().enumerate() {
                    let b = if j == 1 { Some(&bias[..]) } else { None };
                    jobs.push(Job { p, acts: &acts, out: unsafe { out.as_mut_ptr().add(col) }, ld, bias: b });
                    col += ns[j];
                }
                unsafe { run(&jobs, isa) };
                let mut col = 0;
                for (j, &n) in ns.iter().enumerate() {
                    let mut want = reference(&dense[j], n, k, &x, m);
                    if j == 1 {
                        for (i, v) in want.iter_mut().enumerate() {
                            *v += bias[i % n];
                        }
                    }
                    for i in 0..m {
                        close(&out[i * ld + col..i * ld + col + n], &want[i * n..(i + 1) * n], 2e-2);
                    }
                    col += n;
                }
                for i in 0..m {
                    assert!(out[i * ld + col..(i + 1) * ld].iter().all(|v| v.is_nan()), "wrote past its columns");
                }
            }
        }
    }

    #[test]
    fn int8_rejects_minus_128() {
        assert!(Packed::int8(1, 2, &[-128, 0], &[1.0]).is_err());
        assert!(Packed::int4(1, 48, 32, &[0; 24], &[1.0], &[0.0]).is_err());
    }
}

/// Throughput of the GEMVs on the decode shapes of a Qwen2.5-0.5B-sized model, hot (a matrix
/// that stays in a 512 KiB L2, read over and over: the kernel's compute ceiling), from L3, and
/// streamed (matrices far larger than the caches):
/// `RAYON_NUM_THREADS=2 cargo test --release --lib gemv_throughput -- --ignored --nocapture`.
#[cfg(test)]
mod bench {
    use super::*;
    use std::time::Instant;

    fn weights(kind: &str, n: usize, k: usize, seed: u64) -> Packed {
        let mut s = seed;
        let mut r = || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 33) as u32
        };
        match kind {
            "bf16" => {
                let q: Vec<u16> = (0..n * k).map(|_| 0x3c00 | (r() & 0x7f) as u16).collect();
                Packed::bf16(n, k, &q).unwrap()
            }
            "fp32" => {
                let q: Vec<f32> = (0..n * k).map(|_| (r() % 1000) as f32 * 1e-4).collect();
                Packed::f32(n, k, &q).unwrap()
            }
            "int8" => {
                let q: Vec<i8> = (0..n * k).map(|_| ((r() % 255) as i32 - 127) as i8).collect();
                Packed::int8(n, k, &q, &vec![0.01; n]).unwrap()
            }
            _ => {
                let q: Vec<u8> = (0..n * k / 2).map(|_| r() as u8).collect();
                let g = n * k / 32;
                Packed::int4(n, k, 32, &q, &vec![1.0 / 128.0; g], &vec![1.0 / 1024.0; g]).unwrap()
            }
        }
    }

    fn time(ps: &[Packed], x: &[f32], reps: usize) -> f64 {
        let isa = detect();
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t0 = Instant::now();
            for i in 0..reps {
                let p = &ps[i % ps.len()];
                let mut y = vec![0f32; p.shape().0];
                linear(p, &x[..p.shape().1], 1, None, &mut y, isa);
            }
            best = best.min(t0.elapsed().as_secs_f64() / reps as f64);
        }
        best
    }

    /// A plain read of `bytes` over the pool: the bandwidth a GEMV can hope for right now.
    fn read_probe(buf: &[u8]) -> f64 {
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t0 = Instant::now();
            let s: u64 = buf
                .par_chunks(1 << 20)
                .map(|c| c.chunks_exact(8).fold(0u64, |a, b| a ^ u64::from_le_bytes(b.try_into().unwrap())))
                .reduce(|| 0, |a, b| a ^ b);
            std::hint::black_box(s);
            best = best.min(t0.elapsed().as_secs_f64());
        }
        buf.len() as f64 / best / 1e9
    }

    #[test]
    #[ignore]
    fn gemv_throughput() {
        let x: Vec<f32> = (0..4864).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01).collect();
        println!("threads {} isa {}", rayon::current_num_threads(), isa_name());
        let probe = super::super::huge::HugeBuf::filled(256 << 20, 1u8);
        for kind in ["bf16", "fp32", "int8", "int4"] {
            println!("read probe {:.1} GB/s", read_probe(&probe));
            for &(n, k, copies, what) in
                &[(256, 896, 1, "hot 256x896"), (1024, 896, 1, "L3 1024x896"), (9728, 896, 8, "gate_up 9728x896"), (896, 4864, 8, "down 896x4864"), (151936, 896, 1, "head 151936x896")]
            {
                let ps: Vec<Packed> = (0..copies).map(|c| weights(kind, n, k, c as u64 + 1)).collect();
                let reps = if what.starts_with("hot") || what.starts_with("L3") { 2000 } else { 40 };
                let s = time(&ps, &x, reps);
                let nb = ps[0].nbytes() as f64;
                println!("{kind} {what:18} {:8.1} us  {:6.1} GB/s  {:6.2} Gweights/s", s * 1e6, nb / s / 1e9, (n * k) as f64 / s / 1e9);
            }
        }
    }

    /// int4 prefill on one thread: `m` activation rows through `chunk` (the integer kernel),
    /// GMAC/s. `cargo test --release --lib int4_prefill_throughput -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn int4_prefill_throughput() {
        let isa = detect();
        for &(n, k, m) in &[(1152usize, 896usize, 64usize), (4864, 896, 64), (896, 4864, 64), (256, 896, 1), (256, 896, 4), (4864, 896, 1)] {
            let p = weights("int4", n, k, 7);
            let x: Vec<f32> = (0..m * k).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01).collect();
            let acts: Vec<Act> = (0..m).map(|i| prepare(&p, &x[i * k..(i + 1) * k], isa)).collect();
            let mut y = vec![0f32; m * n];
            let job = Job { p: &p, acts: &acts, out: y.as_mut_ptr(), ld: n, bias: None };
            let mut best = f64::MAX;
            for _ in 0..if m == 1 { 200 } else { 7 } {
                let t0 = Instant::now();
                int4_chunk(&job, 0, n, isa);
                best = best.min(t0.elapsed().as_secs_f64());
            }
            println!("int4 prefill {n}x{k} m={m}: {:6.1} GMAC/s", (n * k * m) as f64 / best / 1e9);
        }
    }

    /// The GEMVs of one decode step of a Qwen2.5-0.5B-shaped model (24 layers of q/k/v, o,
    /// gate/up, down, then the tied head), each its own parallel region inside a rayon scope as
    /// in `Model::step`; bf16 and fp32 weights interleaved.
    /// `cargo test --release --lib decode_shape -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn decode_shape() {
        let isa = detect();
        let mk = |kind: &str| {
            let mut mats: Vec<Packed> = Vec::new();
            for l in 0..24u64 {
                for (j, &(n, k)) in [(1152, 896), (896, 896), (9728, 896), (896, 4864)].iter().enumerate() {
                    mats.push(weights(kind, n, k, 4 * l + j as u64 + 1));
                }
            }
            mats.push(weights(kind, 151936, 896, 999));
            mats
        };
        let sets = [mk("bf16"), mk("fp32")];
        let x: Vec<f32> = (0..4864).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01).collect();
        let token = |mats: &[Packed]| {
            rayon::scope(|_| {
                for p in mats {
                    let (n, k) = p.shape();
                    let mut y = vec![0f32; n];
                    let acts = prepare_rows(p, &x[..k], 1, isa);
                    let job = Job { p, acts: &acts, out: y.as_mut_ptr(), ld: n, bias: None };
                    unsafe { run(&[job], isa) };
                    std::hint::black_box(&y);
                }
            })
        };
        // bf16 and fp32 alternate (A B A B ...): the fraction of fp32's bandwidth bf16 reaches
        let mut ts: Vec<Vec<f64>> = vec![Vec::new(); sets.len()];
        for _ in 0..9 {
            for (si, set) in sets.iter().enumerate() {
                let t0 = Instant::now();
                token(set);
                ts[si].push(t0.elapsed().as_secs_f64());
            }
        }
        for (si, set) in sets.iter().enumerate() {
            let mut t = ts[si].clone();
            t.sort_by(|a, b| a.partial_cmp(b).unwrap());
            let bytes: usize = set.iter().map(|m| m.nbytes()).sum();
            println!("{} decode-shaped GEMVs: {:7.2} ms/token  {:5.1} GB/s", set[0].kind(), t[4] * 1e3, bytes as f64 / t[4] / 1e9);
        }
    }
}
