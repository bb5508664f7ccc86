//! `y = x @ W^T (+ bias)` for packed weights: matrix-vector products for decode, and the same
//! loops over a few rows of `x` for small batches.
//!
//! Output rows are split into tiles of `TILE` weight rows that share every activation load;
//! tiles are spread over rayon's pool when the matrix is big enough to pay for it. int8 and
//! int4 weights meet block-quantized int8 activations in integer dot products (AVX-512 VNNI
//! `vpdpbusd`, or AVX2 `vpmaddubsw` + `vpmaddwd`), with the block and group scales applied
//! per 32 values in f32. Every SIMD path has a scalar twin that the tests compare against.

use super::act_quant::{quantize_row, QuantRow, QBLOCK};
use super::packed::Packed;
use rayon::prelude::*;
use std::sync::OnceLock;

const TILE: usize = 4;
/// AVX2 kernels prefetch the weights this many tiles ahead of the one they read.
const PF_TILES: usize = 2;
/// Below this many weights (per activation row) a GEMV runs on the calling thread.
const PAR_MIN: usize = 1 << 16;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Isa {
    Vnni,
    Avx512,
    Avx2,
    Scalar,
}

pub fn detect() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        if std::env::var("TORCHBURN_LLM_ISA").as_deref() == Ok("scalar") {
            return Isa::Scalar;
        }
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx512f") && has!("avx512bw") && has!("avx512vl") {
                return if has!("avx512vnni") { Isa::Vnni } else { Isa::Avx512 };
            }
            if has!("avx2") && has!("fma") {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    })
}

pub fn isa_name() -> &'static str {
    match detect() {
        Isa::Vnni => "avx512-vnni",
        Isa::Avx512 => "avx512",
        Isa::Avx2 => "avx2+fma",
        Isa::Scalar => "scalar",
    }
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
    if super::panel::takes(m, isa) {
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
    // PyTorch's OpenMP team like the other kernels (`crate::par`: no second pool spinning against
    // OpenMP's workers); inside rayon's pool (the fused step runs in `rayon::scope`) on rayon.
    let on_omp = rayon::current_thread_index().is_none() && crate::par::pool() == "openmp";
    let threads = if on_omp { crate::par::threads() } else { rayon::current_num_threads() };
    let weights: usize = jobs.iter().map(|j| j.p.shape().0 * j.p.shape().1).sum();
    if weights < PAR_MIN || threads == 1 {
        for j in jobs {
            chunk(j, 0, j.p.shape().0, isa);
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
        let per = (target / row_bytes).max(1).div_ceil(TILE) * TILE;
        let mut r = 0;
        while r < n {
            let nr = per.min(n - r);
            chunks.push((ji, r, nr));
            r += nr;
        }
    }
    if on_omp {
        crate::par::for_each(chunks.len(), |c| {
            let (ji, r0, nr) = chunks[c];
            chunk(&jobs[ji], r0, nr, isa)
        });
    } else {
        chunks.par_iter().for_each(|&(ji, r0, nr)| chunk(&jobs[ji], r0, nr, isa));
    }
}

/// Activation rows per pass over a chunk's weights: their quantized values (~1 KiB each for
/// K = 896) stay in L1 while the chunk's weight tiles stream past them.
const ACT_BLOCK: usize = 16;

/// Weight rows `r0 .. r0 + nrows` of one job for every activation row.
fn chunk(job: &Job, r0: usize, nrows: usize, isa: Isa) {
    if super::panel::chunk(job, r0, nrows, isa) || super::qgemm::chunk(job, r0, nrows, isa) {
        return;
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
        (Packed::Int4 { k, kp, group, w, scale, zero, .. }, Act::Q4(q, c, xs)) => {
            let ng = k / group;
            let wr = &w[r0 * kp / 2..(r0 + t) * kp / 2];
            let sc = &scale[r0 * ng..(r0 + t) * ng];
            let ze = &zero[r0 * ng..(r0 + t) * ng];
            #[cfg(target_arch = "x86_64")]
            if int4_folds_terms(isa) {
                assert!(wr.len() >= t * kp / 2 && c.len() == ng && xs.len() == ng && sc.len() >= t * ng);
                // SAFETY: lengths asserted; `detect` saw AVX2.
                unsafe {
                    x86::int4_avx2(wr.as_ptr(), *kp, *group, ng, t, q, sc.as_ptr(), ze.as_ptr(), c.as_ptr(), xs.as_ptr(), res)
                };
                return;
            }
            int4_rows(wr, *kp, *group, ng, t, q, sc, res, isa);
            for j in 0..t {
                res[j] += dot(&sc[j * ng..(j + 1) * ng], c, isa) + dot(&ze[j * ng..(j + 1) * ng], xs, isa);
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

// int4: res[j] = Σ_b scale[j, g(b)] scale_b Σ_{i∈b} nibble[j, i] xq[i]; the caller adds the
// offset (-8) and zero-point terms, which are per-group dot products.
fn int4_rows(w: &[u8], kp: usize, group: usize, ng: usize, t: usize, q: &QuantRow, sc: &[f32], res: &mut [f32; TILE], isa: Isa) {
    debug_assert!(!int4_folds_terms(isa), "the AVX2 kernel is called through int4_full");
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: as for int8; `sc` holds `t` rows of `ng` scales.
        unsafe {
            match isa {
                Isa::Vnni => return x86::int4_vnni(w.as_ptr(), kp, group, ng, t, q, sc.as_ptr(), res),
                Isa::Avx512 | Isa::Avx2 => unreachable!("int4_full"),
                Isa::Scalar => {}
            }
        }
    }
    let _ = isa;
    let rb = kp / 2;
    for j in 0..t {
        let row = &w[j * rb..(j + 1) * rb];
        let mut acc = 0f32;
        for b in 0..ng * group / QBLOCK {
            let mut d = 0i32;
            for i in b * QBLOCK..(b + 1) * QBLOCK {
                let (chunk, o) = (i / 128, i % 128);
                let byte = row[chunk * 64 + o % 64];
                let v = if o < 64 { byte & 15 } else { byte >> 4 };
                d += v as i32 * q.q[i] as i32;
            }
            acc += sc[j * ng + b * QBLOCK / group] * q.scale[b] * d as f32;
        }
        res[j] = acc;
    }
}

/// Whether the int4 kernel of `isa` adds the offset / zero-point terms itself (AVX2).
fn int4_folds_terms(isa: Isa) -> bool {
    cfg!(target_arch = "x86_64") && matches!(isa, Isa::Avx2 | Isa::Avx512)
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

fn dot(a: &[f32], b: &[f32], isa: Isa) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if matches!(isa, Isa::Vnni | Isa::Avx512) {
            // SAFETY: equal lengths checked by the zip below in the scalar twin; here by assert.
            assert_eq!(a.len(), b.len());
            unsafe { return x86::dot_avx512(a.as_ptr(), b.as_ptr(), a.len()) }
        }
        if isa == Isa::Avx2 {
            assert_eq!(a.len(), b.len());
            // SAFETY: equal lengths, asserted.
            unsafe { return x86::dot_avx2(a.as_ptr(), b.as_ptr(), a.len()) }
        }
    }
    let _ = isa;
    a.iter().zip(b).map(|(x, y)| x * y).sum()
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

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn int4_vnni(
        w: *const u8,
        kp: usize,
        group: usize,
        ng: usize,
        t: usize,
        q: &QuantRow,
        sc: *const f32,
        res: &mut [f32; TILE],
    ) {
        let (qp, lp) = (q.q.as_ptr(), q.lane_scale.as_ptr());
        let nib = _mm512_set1_epi8(15);
        let rb = kp / 2;
        // group sizes are powers of two: a shift, not a division, in the inner loop; padding
        // past K reads the last group (its xq are 0)
        // The 128 weights of one step span groups base .. base + 4 (G = 32), base .. base + 2
        // (G = 64) or just base (G = 128): one masked load of up to 4 scales, then a permute
        // spreads them over the 16 lanes of each 64-weight half (lanes 0..8 = first 32 weights).
        let shift = group.trailing_zeros();
        let lane = |half: i32| -> __m512i {
            let f = |l: i32| (half * 64 + (l / 8) * 32) >> shift;
            _mm512_setr_epi32(f(0), f(0), f(0), f(0), f(0), f(0), f(0), f(0), f(8), f(8), f(8), f(8), f(8), f(8), f(8), f(8))
        };
        let (i0, i1) = (lane(0), lane(1));
        for j in 0..t {
            let s = sc.add(j * ng);
            let row = w.add(j * rb);
            let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            for p in 0..kp / 128 {
                let k0 = p * 128;
                let base = k0 >> shift;
                // past the row's last group (padding up to a multiple of 128) the mask reads nothing
                let avail = ng.saturating_sub(base).min(4);
                let sv = _mm512_castps128_ps512(_mm_maskz_loadu_ps(((1u32 << avail) - 1) as u8, s.add(base.min(ng - 1))));
                let wv = _mm512_loadu_si512(row.add(p * 64) as *const _);
                let lo = _mm512_and_si512(wv, nib);
                let hi = _mm512_and_si512(_mm512_srli_epi16(wv, 4), nib);
                let d0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(qp.add(k0) as *const _));
                let d1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi, _mm512_loadu_si512(qp.add(k0 + 64) as *const _));
                let s0 = _mm512_permutexvar_ps(i0, sv);
                let s1 = _mm512_permutexvar_ps(i1, sv);
                a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d0), _mm512_mul_ps(s0, _mm512_loadu_ps(lp.add(p * 32))), a0);
                a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d1), _mm512_mul_ps(s1, _mm512_loadu_ps(lp.add(p * 32 + 16))), a1);
            }
            res[j] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
        }
    }

    /// AVX2 int4: nibbles (unsigned) times xq with `vpmaddubsw`, block scale × group scale
    /// per 32 weights; then, per row, the `-8` offset and zero-point terms (`Σ_g sc_g C_g +
    /// zero_g X_g`, see `Act::Q4`) in the same call. `res[j]` is the whole dot product.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn int4_avx2(w: *const u8, kp: usize, group: usize, ng: usize, t: usize, q: &QuantRow, sc: *const f32, ze: *const f32, c: *const f32, xs: *const f32, res: &mut [f32; TILE]) {
        let a = Int4Args { w, kp, group, ng, q, sc, ze, c, xs };
        match t {
            4 => int4_avx2_t::<4>(&a, res),
            3 => int4_avx2_t::<3>(&a, res),
            2 => int4_avx2_t::<2>(&a, res),
            _ => int4_avx2_t::<1>(&a, res),
        }
    }

    pub struct Int4Args<'a> {
        w: *const u8,
        kp: usize,
        group: usize,
        ng: usize,
        q: &'a QuantRow,
        sc: *const f32,
        ze: *const f32,
        c: *const f32,
        xs: *const f32,
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn int4_avx2_t<const T: usize>(a: &Int4Args, res: &mut [f32; TILE]) {
        let (w, kp, ng) = (a.w, a.kp, a.ng);
        let mut acc = [_mm256_setzero_ps(); T];
        let ones = _mm256_set1_epi16(1);
        let nib = _mm256_set1_epi8(15);
        let qp = a.q.q.as_ptr();
        let qs = a.q.scale.as_ptr();
        let rb = kp / 2;
        // group sizes are powers of two; padding past K reads the last group (its xq are 0)
        let shift = a.group.trailing_zeros();
        let g = |kk: usize| (kk >> shift).min(ng - 1);
        let next = w.wrapping_add(PF_TILES * T * rb);
        for p in 0..kp / 128 {
            for l in 0..T {
                _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(p * 64 * T + l * 64) as *const i8);
            }
            for h in 0..2 {
                // bytes h*32 .. h*32+32 of the chunk: low nibbles are weights h*32.., high 64+h*32..
                let (ka, kb) = (p * 128 + h * 32, p * 128 + 64 + h * 32);
                let xa = _mm256_loadu_si256(qp.add(ka) as *const _);
                let xb = _mm256_loadu_si256(qp.add(kb) as *const _);
                let sa = _mm256_set1_ps(*qs.add(ka / 32));
                let sb = _mm256_set1_ps(*qs.add(kb / 32));
                let (ga, gb) = (g(ka), g(kb));
                for j in 0..T {
                    let s = a.sc.add(j * ng);
                    let wv = _mm256_loadu_si256(w.add(j * rb + p * 64 + h * 32) as *const _);
                    let lo = _mm256_and_si256(wv, nib);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(wv, 4), nib);
                    let da = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xa), ones);
                    let db = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xb), ones);
                    // block scale (shared by the tile) times the group scale, a broadcast load
                    let fa = _mm256_mul_ps(_mm256_cvtepi32_ps(da), sa);
                    let fb = _mm256_mul_ps(_mm256_cvtepi32_ps(db), sb);
                    acc[j] = _mm256_fmadd_ps(fa, _mm256_broadcast_ss(&*s.add(ga)), acc[j]);
                    acc[j] = _mm256_fmadd_ps(fb, _mm256_broadcast_ss(&*s.add(gb)), acc[j]);
                }
            }
        }
        let ng8 = ng / 8 * 8;
        for j in 0..T {
            let (s, z) = (a.sc.add(j * ng), a.ze.add(j * ng));
            let mut e = acc[j];
            let mut i = 0;
            while i < ng8 {
                e = _mm256_fmadd_ps(_mm256_loadu_ps(s.add(i)), _mm256_loadu_ps(a.c.add(i)), e);
                e = _mm256_fmadd_ps(_mm256_loadu_ps(z.add(i)), _mm256_loadu_ps(a.xs.add(i)), e);
                i += 8;
            }
            let mut tail = 0f32;
            while i < ng {
                tail += *s.add(i) * *a.c.add(i) + *z.add(i) * *a.xs.add(i);
                i += 1;
            }
            res[j] = hsum256(e) + tail;
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn bf16_avx512(w: *const u16, k: usize, t: usize, x: *const f32, res: &mut [f32; TILE]) {
        let k32 = k / 32 * 32;
        for j in 0..t {
            let row = w.add(j * k);
            let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            for i in (0..k32).step_by(32) {
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
            let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            for i in (0..k32).step_by(32) {
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

    #[target_feature(enable = "avx512f,avx512vl")]
    pub unsafe fn dot_avx512(a: *const f32, b: *const f32, n: usize) -> f32 {
        let mut acc = _mm512_setzero_ps();
        let mut i = 0;
        while i < n {
            let m: __mmask16 = if n - i >= 16 { 0xFFFF } else { (1u16 << (n - i)) - 1 };
            acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a.add(i)), _mm512_maskz_loadu_ps(m, b.add(i)), acc);
            i += 16;
        }
        _mm512_reduce_add_ps(acc)
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
    /// accumulators per row cover the FMA latency.
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

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_avx2(a: *const f32, b: *const f32, n: usize) -> f32 {
        let mut acc = _mm256_setzero_ps();
        let n8 = n / 8 * 8;
        let mut i = 0;
        while i < n8 {
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i)), _mm256_loadu_ps(b.add(i)), acc);
            i += 8;
        }
        let mut s = hsum256(acc);
        while i < n {
            s += *a.add(i) * *b.add(i);
            i += 1;
        }
        s
    }

    use crate::vmath::hsum256;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

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

    fn isas() -> Vec<Isa> {
        let mut v = vec![Isa::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") {
                v.push(Isa::Avx2);
            }
            if has!("avx512f") && has!("avx512bw") && has!("avx512vl") {
                v.push(Isa::Avx512);
                if has!("avx512vnni") {
                    v.push(Isa::Vnni);
                }
            }
        }
        v
    }

    #[test]
    fn int8_matches_dequantized() {
        let mut s = 1u64;
        for &(n, k, m) in &[(5, 33, 1), (9, 200, 3), (300, 896, 1), (13, 96, 37)] {
            let q: Vec<i8> = (0..n * k).map(|_| (lcg(&mut s) * 254.0) as i8).collect();
            let sc: Vec<f32> = (0..n).map(|_| 0.01 + lcg(&mut s).abs() * 0.01).collect();
            let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut s)).collect();
            let w: Vec<f32> = (0..n * k).map(|i| q[i] as f32 * sc[i / k]).collect();
            let want = reference(&w, n, k, &x, m);
            let p = Packed::int8(n, k, &q, &sc).unwrap();
            for isa in isas() {
                let mut y = vec![0f32; m * n];
                linear(&p, &x, m, None, &mut y, isa);
                close(&y, &want, 2e-2);
            }
        }
    }

    #[test]
    fn int4_matches_dequantized() {
        let mut s = 7u64;
        for &(n, k, m, g) in &[(3, 64, 1, 32), (7, 192, 2, 64), (130, 896, 1, 128), (5, 4864, 1, 32), (9, 128, 33, 32)] {
            let nib: Vec<u8> = (0..n * k).map(|_| ((lcg(&mut s) + 0.5) * 15.99) as u8).collect();
            let packed: Vec<u8> = (0..n * k / 2).map(|j| nib[2 * j] | (nib[2 * j + 1] << 4)).collect();
            let ng = n * k / g;
            let sc: Vec<f32> = (0..ng).map(|_| 0.01 + lcg(&mut s).abs() * 0.01).collect();
            let ze: Vec<f32> = (0..ng).map(|_| lcg(&mut s) * 0.01).collect();
            let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut s)).collect();
            let w: Vec<f32> = (0..n * k).map(|i| (nib[i] as f32 - 8.0) * sc[i / g] + ze[i / g]).collect();
            let want = reference(&w, n, k, &x, m);
            let p = Packed::int4(n, k, g, &packed, &sc, &ze).unwrap();
            for isa in isas() {
                let mut y = vec![0f32; m * n];
                linear(&p, &x, m, None, &mut y, isa);
                close(&y, &want, 2e-2);
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
        for isa in isas() {
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
            for isa in isas() {
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

    #[test]
    fn dot_every_isa() {
        let mut s = 5u64;
        for n in [0usize, 1, 7, 8, 9, 28, 33] {
            let a: Vec<f32> = (0..n).map(|_| lcg(&mut s)).collect();
            let b: Vec<f32> = (0..n).map(|_| lcg(&mut s)).collect();
            let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            for isa in isas() {
                assert!((dot(&a, &b, isa) - want).abs() < 1e-5, "{isa:?} n={n}");
            }
        }
    }

    /// Several weights in one parallel region, sharing one activation preparation and writing
    /// column ranges of one strided output (the fused step's q/k/v and gate/up).
    #[test]
    fn jobs_share_activations_and_write_strided_columns() {
        let mut s = 9u64;
        let (k, m) = (256, 3);
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut s)).collect();
        for isa in isas() {
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
                            let (sc, ze) = (vec![0.02f32; n * k / 64], vec![0.01f32; n * k / 64]);
                            let wd = nib.iter().map(|&v| (v as f32 - 8.0) * 0.02 + 0.01).collect();
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
/// that stays in L2, read over and over) and streamed (matrices far larger than the caches):
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
                Packed::int4(n, k, 32, &q, &vec![0.01; g], &vec![0.001; g]).unwrap()
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
        let probe = super::super::packed::big_vec(256 << 20, 1u8);
        for kind in ["bf16", "fp32", "int8", "int4"] {
            println!("read probe {:.1} GB/s", read_probe(&probe));
            for &(n, k, copies, what) in
                &[(1024, 896, 1, "hot 1024x896"), (9728, 896, 8, "gate_up 9728x896"), (896, 4864, 8, "down 896x4864"), (151936, 896, 1, "head 151936x896")]
            {
                let ps: Vec<Packed> = (0..copies).map(|c| weights(kind, n, k, c as u64 + 1)).collect();
                let reps = if what.starts_with("hot") { 2000 } else { 40 };
                let s = time(&ps, &x, reps);
                let nb = ps[0].nbytes() as f64;
                println!("{kind} {what:18} {:8.1} us  {:6.1} GB/s  {:6.2} Gweights/s", s * 1e6, nb / s / 1e9, (n * k) as f64 / s / 1e9);
            }
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
