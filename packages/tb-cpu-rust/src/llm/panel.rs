//! Prefill GEMM for f32, bf16 and int8 weights (int4 takes `gemv::int4_chunk`, see `takes`): `Y = X @ W^T` over many activation rows, with each
//! block of `NR` weight rows dequantized once into an f32 panel (`[K, NR]`, exact: the same
//! arithmetic as `Packed::rows`) that every activation row then reuses from cache.
//!
//! The register tile is `MR` activation rows x `NR` weight rows: on AVX-512 one 16-lane
//! accumulator per row, per K step one panel load and `MR` FMAs with the broadcast folded in;
//! on AVX2 two tiles of 6 rows, each per K step two panel loads and 6 broadcasts feeding 12
//! FMAs. Either way the loop runs near the FMA ports' limit instead of the integer-multiply path of the int8-activation kernels
//! (`qgemm`), whose per-32-value scale handling costs ~5 operations per 32 products per row
//! pair. The activations stay f32 (no int8 quantization), so this path is also more exact.
//! The dequantization is `O(N K)` per call against `O(M N K)` FMAs: used from `MIN_ROWS` rows.

use super::gemv::{Act, Isa, Job};
use super::packed::Packed;
use std::sync::atomic::{AtomicBool, Ordering};

pub const NR: usize = 16;
/// Activation rows per register tile: 12 on AVX-512 (one 16-lane accumulator per row, the
/// broadcasts folded into the FMAs), two tiles of 6 on AVX2 (two 8-lane accumulators per row).
pub const MR: usize = 12;
/// From this many activation rows on, prefill takes this path.
pub const MIN_ROWS: usize = 16;
/// K values per pass. Measured single-threaded at 512 rows (int8, best of 6, interleaved):
/// one pass over the whole K (the panel streams from L2, each output tile is written once)
/// ran 41.5-44.3 GMAC/s against 37.6-41.4 for slices of 256 (a 16 KiB panel slice in L1 and
/// partial sums added up in the output), so slices only cap absurd K.
const KC: usize = 1 << 16;
/// Activation rows per block (MB x K floats in L2 while the group's panels pass them).
const MB: usize = 24;
/// Panels dequantized per pass (8 measured 0-6% faster than 1, 2 or 4).
const PG: usize = 8;

thread_local! {
    /// The dequantized panels of the chunk a thread is working on (kept, so a prefill does not
    /// page-fault a fresh buffer per chunk).
    static PANELS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Where a kernel call leaves its `R x NR` tile: row `i` at `ptr + i * ld`, added to what is
/// there when `add` (a later K slice), plus `bias[0 .. NR]` when given (the last K slice).
pub struct Out {
    pub ptr: *mut f32,
    pub ld: usize,
    pub add: bool,
    pub bias: Option<*const f32>,
}

/// One register tile (up to `MR` rows `xs`, `k` values each) times a `[k, NR]` panel, into `out`.
///
/// # Safety
/// AVX2 and FMA (`takes`); `panel` holds `k * NR` floats, each `xs` row `k`; `out` is valid for
/// `xs.len()` rows of `NR` at stride `ld` (and `bias` for `NR`).
#[cfg(target_arch = "x86_64")]
pub unsafe fn kernel(xs: &[*const f32], panel: *const f32, k: usize, out: &Out) {
    debug_assert!(!xs.is_empty() && xs.len() <= MR);
    x86::kernel(xs, panel, k, out)
}

/// On unless a benchmark turns it off (`set_enabled`: old / new paths interleaved in one run).
static ENABLED: AtomicBool = AtomicBool::new(true);

pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether `m` activation rows for weights `p` take this path (then `gemv::prepare_rows`
/// leaves them f32).
/// int4 weights never: `gemv::int4_chunk`'s integer kernel, with four activation rows sharing
/// each unpacked tile, ran 36-41 GMAC/s per thread at 512 rows against 34-36 for dequantizing
/// into panels (`qgemm::bench::gemm_throughput`, one thread, same run).
pub fn takes(p: &Packed, m: usize, isa: Isa) -> bool {
    !matches!(p, Packed::Int4 { .. }) && m >= MIN_ROWS && matches!(isa, Isa::Avx2 | Isa::Avx512 | Isa::Vnni) && cfg!(target_arch = "x86_64") && enabled()
}

/// `buf[c * NR + j]` = W[r0 + j, c] for `j < nr` (zero beyond), `c < k`.
///
/// The rows are dequantized row-major into a scratch buffer first (loops that vectorize), then
/// transposed 8 x 8 at a time: writing the panel one row at a time (a store every 64 bytes
/// across the whole `k * NR` panel, larger than L1) cost ~1 ns per weight, 7-8% of the GEMM.
pub fn dequant_panel(p: &Packed, r0: usize, nr: usize, buf: &mut [f32]) {
    let k = p.shape().1;
    debug_assert!(buf.len() >= k * NR && nr <= NR);
    ROWS.with(|cell| {
        let mut rows = cell.borrow_mut();
        if rows.len() < NR * k {
            rows.resize(NR * k, 0.0);
        }
        for j in 0..NR {
            let row = &mut rows[j * k..(j + 1) * k];
            if j < nr {
                dequant_row(p, r0 + j, row);
            } else {
                row.fill(0.0);
            }
        }
        transpose_into(&rows[..NR * k], k, &mut buf[..k * NR]);
    });
}

thread_local! {
    /// Scratch rows of `dequant_panel`.
    static ROWS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Weight row `r` as f32, with `Packed::rows`'s arithmetic.
fn dequant_row(p: &Packed, r: usize, row: &mut [f32]) {
    let k = row.len();
    match p {
        Packed::Int8 { kp, w, scale, .. } => {
            let s = scale[r];
            for (d, &v) in row.iter_mut().zip(&w[r * kp..r * kp + k]) {
                *d = (v as i16 - 128) as f32 * s;
            }
        }
        Packed::Int4 { .. } => unreachable!("int4 weights take gemv::int4_chunk (see `takes`)"),
        Packed::Bf16 { w, .. } => {
            for (d, &b) in row.iter_mut().zip(&w[r * k..(r + 1) * k]) {
                *d = f32::from_bits((b as u32) << 16);
            }
        }
        Packed::F32 { w, .. } => row.copy_from_slice(&w[r * k..(r + 1) * k]),
    }
}

/// `buf[c * NR + j] = rows[j * k + c]` (`NR` rows of `k`).
pub fn transpose_into(rows: &[f32], k: usize, buf: &mut [f32]) {
    assert!(rows.len() >= NR * k && buf.len() >= k * NR);
    let mut c0 = 0;
    #[cfg(target_arch = "x86_64")]
    if crate::core::isa::has_avx() {
        c0 = k / 8 * 8;
        // SAFETY: AVX checked; every access is inside the asserted lengths (c < k / 8 * 8).
        unsafe { x86::transpose_8x8_blocks(rows.as_ptr(), k, c0, buf.as_mut_ptr()) };
    }
    for c in c0..k {
        for j in 0..NR {
            buf[c * NR + j] = rows[j * k + c];
        }
    }
}

/// Weight rows `r0 .. r0 + nrows` of `job` for every (f32) activation row; false when the
/// job is not for this path.
pub fn chunk(job: &Job, r0: usize, nrows: usize, isa: Isa) -> bool {
    if !takes(job.p, job.acts.len(), isa) || !matches!(job.acts[0], Act::Dense(_)) {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let k = job.p.shape().1;
        let xs: Vec<*const f32> = job
            .acts
            .iter()
            .map(|a| match a {
                Act::Dense(x) => {
                    assert_eq!(x.len(), k);
                    x.as_ptr()
                }
                _ => unreachable!("mixed activation preparations"),
            })
            .collect();
        let m = xs.len();
        let np = nrows.div_ceil(NR);
        PANELS.with(|cell| {
            let mut buf = cell.borrow_mut();
            if buf.len() < PG * k * NR {
                buf.resize(PG * k * NR, 0.0);
            }
            // PG panels at a time (128 weight rows): dequantized once, then
            let mut g0 = 0;
            while g0 < np {
                let g1 = (g0 + PG).min(np);
                for pi in g0..g1 {
                    let (r, nr) = (pi * NR, NR.min(nrows - pi * NR));
                    dequant_panel(job.p, r0 + r, nr, &mut buf[(pi - g0) * k * NR..(pi - g0 + 1) * k * NR]);
                }
                // K slices of KC (in practice the whole K): MR-row tiles of an MB-row block of X pass
                // each panel; partial sums of later slices add up in `out`.
                let mut kb = 0;
                while kb < k {
                    let kl = KC.min(k - kb);
                    let (first, last) = (kb == 0, kb + kl == k);
                    let mut mb = 0;
                    while mb < m {
                        let mh = MB.min(m - mb);
                        for pi in g0..g1 {
                            let (r, nr) = (pi * NR, NR.min(nrows - pi * NR));
                            let panel = buf[((pi - g0) * k + kb) * NR..].as_ptr();
                            let mut i = mb;
                            while i < mb + mh {
                                let mr = MR.min(mb + mh - i);
                                let mut xo = [std::ptr::null::<f32>(); MR];
                                for (d, &x) in xo.iter_mut().zip(&xs[i..i + mr]) {
                                    // SAFETY: kb < k, inside the row
                                    *d = unsafe { x.add(kb) };
                                }
                                let c0 = r0 + r;
                                if nr == NR {
                                    let out = Out {
                                        // SAFETY: row i, column c0 of the job's output
                                        ptr: unsafe { job.out.add(i * job.ld + c0) },
                                        ld: job.ld,
                                        add: !first,
                                        bias: job.bias.filter(|_| last).map(|b| b[c0..c0 + NR].as_ptr()),
                                    };
                                    // SAFETY: `takes` saw AVX2 + FMA; the panel slice holds `kl` rows of
                                    // NR floats from `panel`, each x pointer `kl` floats; the caller of
                                    // `gemv::run` promised rows i .. i + mr, columns c0 .. c0 + NR are ours.
                                    unsafe { x86::kernel(&xo[..mr], panel, kl, &out) };
                                } else {
                                    let mut res = [[0f32; NR]; MR];
                                    let out = Out { ptr: res.as_mut_ptr().cast(), ld: NR, add: false, bias: None };
                                    // SAFETY: as above, into `res`.
                                    unsafe { x86::kernel(&xo[..mr], panel, kl, &out) };
                                    for (ii, row) in res.iter().enumerate().take(mr) {
                                        for (j, v) in row.iter().enumerate().take(nr) {
                                            let c = c0 + j;
                                            // SAFETY: the caller of `gemv::run` promised this element is ours.
                                            unsafe {
                                                let o = job.out.add((i + ii) * job.ld + c);
                                                let mut acc = if first { *v } else { *o + v };
                                                if last {
                                                    acc += job.bias.map_or(0.0, |b| b[c]);
                                                }
                                                *o = acc;
                                            }
                                        }
                                    }
                                }
                                i += mr;
                            }
                        }
                        mb += mh;
                    }
                    kb += kl;
                }
                g0 = g1;
            }
        });
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (r0, nrows);
        false
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Out, NR};
    use std::arch::x86_64::*;

    /// Columns `0 .. c1` (a multiple of 8) of the `NR` rows of `k` at `rows` into the panel
    /// layout at `buf`: each 8 x 8 block goes through registers.
    #[target_feature(enable = "avx")]
    pub unsafe fn transpose_8x8_blocks(rows: *const f32, k: usize, c1: usize, buf: *mut f32) {
        let mut c = 0;
        while c < c1 {
            for h in 0..NR / 8 {
                let src = rows.add(h * 8 * k + c);
                let r: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(src.add(i * k)));
                let out = crate::core::transpose::transpose_8x8(&r);
                for (i, v) in out.iter().enumerate() {
                    _mm256_storeu_ps(buf.add((c + i) * NR + h * 8), *v);
                }
            }
            c += 8;
        }
    }

    /// Rows of an AVX2 tile (12 accumulators of 8 lanes).
    const MR_AVX2: usize = 6;

    pub unsafe fn kernel(xs: &[*const f32], panel: *const f32, k: usize, out: &Out) {
        if crate::core::isa::has_avx512() {
            return kernel_avx512(xs, panel, k, out);
        }
        kernel_avx2_tiles(xs, panel, k, out)
    }

    /// Up to `MR` rows as AVX2 tiles of `MR_AVX2` rows each.
    pub(super) unsafe fn kernel_avx2_tiles(xs: &[*const f32], panel: *const f32, k: usize, out: &Out) {
        for (t, rows) in xs.chunks(MR_AVX2).enumerate() {
            let part = Out { ptr: out.ptr.add(t * MR_AVX2 * out.ld), ld: out.ld, add: out.add, bias: out.bias };
            kernel_avx2(rows, panel, k, &part);
        }
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn kernel_avx512(xs: &[*const f32], panel: *const f32, k: usize, out: &Out) {
        match xs.len() {
            12 => kernel_z::<12>(xs, panel, k, out),
            11 => kernel_z::<11>(xs, panel, k, out),
            10 => kernel_z::<10>(xs, panel, k, out),
            9 => kernel_z::<9>(xs, panel, k, out),
            8 => kernel_z::<8>(xs, panel, k, out),
            7 => kernel_z::<7>(xs, panel, k, out),
            6 => kernel_z::<6>(xs, panel, k, out),
            5 => kernel_z::<5>(xs, panel, k, out),
            4 => kernel_z::<4>(xs, panel, k, out),
            3 => kernel_z::<3>(xs, panel, k, out),
            2 => kernel_z::<2>(xs, panel, k, out),
            _ => kernel_z::<1>(xs, panel, k, out),
        }
    }

    /// The AVX-512 tile: per K step one panel load and `R` FMAs with a broadcast activation.
    /// Each output is the same sequence of FMAs as in `kernel_t` (c = 0, 1, ... into one
    /// accumulator), so both ISAs give the same bits.
    #[target_feature(enable = "avx512f")]
    unsafe fn kernel_z<const R: usize>(xs: &[*const f32], panel: *const f32, k: usize, out: &Out) {
        let mut acc = [_mm512_setzero_ps(); R];
        let mut x = [std::ptr::null::<f32>(); R];
        x.copy_from_slice(&xs[..R]);
        for c in 0..k {
            let w = _mm512_loadu_ps(panel.add(c * NR));
            for i in 0..R {
                acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(*x[i].add(c)), w, acc[i]);
            }
        }
        for (i, a) in acc.iter().enumerate() {
            let o = out.ptr.add(i * out.ld);
            let mut a = *a;
            if out.add {
                a = _mm512_add_ps(a, _mm512_loadu_ps(o));
            }
            if let Some(b) = out.bias {
                a = _mm512_add_ps(a, _mm512_loadu_ps(b));
            }
            _mm512_storeu_ps(o, a);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn kernel_avx2(xs: &[*const f32], panel: *const f32, k: usize, out: &Out) {
        match xs.len() {
            6 => kernel_t::<6>(xs, panel, k, out),
            5 => kernel_t::<5>(xs, panel, k, out),
            4 => kernel_t::<4>(xs, panel, k, out),
            3 => kernel_t::<3>(xs, panel, k, out),
            2 => kernel_t::<2>(xs, panel, k, out),
            _ => kernel_t::<1>(xs, panel, k, out),
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn kernel_t<const R: usize>(xs: &[*const f32], panel: *const f32, k: usize, out: &Out) {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let mut x = [std::ptr::null::<f32>(); R];
        x.copy_from_slice(&xs[..R]);
        for c in 0..k {
            let w0 = _mm256_loadu_ps(panel.add(c * NR));
            let w1 = _mm256_loadu_ps(panel.add(c * NR + 8));
            for i in 0..R {
                let b = _mm256_broadcast_ss(&*x[i].add(c));
                acc[i][0] = _mm256_fmadd_ps(b, w0, acc[i][0]);
                acc[i][1] = _mm256_fmadd_ps(b, w1, acc[i][1]);
            }
        }
        // the tile straight into the output rows (vectors, not 16 scalar updates per row)
        for (i, a) in acc.iter().enumerate() {
            let o = out.ptr.add(i * out.ld);
            let (mut a0, mut a1) = (a[0], a[1]);
            if out.add {
                a0 = _mm256_add_ps(a0, _mm256_loadu_ps(o));
                a1 = _mm256_add_ps(a1, _mm256_loadu_ps(o.add(8)));
            }
            if let Some(b) = out.bias {
                a0 = _mm256_add_ps(a0, _mm256_loadu_ps(b));
                a1 = _mm256_add_ps(a1, _mm256_loadu_ps(b.add(8)));
            }
            _mm256_storeu_ps(o, a0);
            _mm256_storeu_ps(o.add(8), a1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::gemv::detect;
    use super::super::test_util::lcg;
    use super::*;

    /// Against the dequantized weights (`Packed::rows`) times x in f64: only f32 rounding of
    /// the K-long sums separates them.
    #[test]
    fn panel_matches_dequantized_every_kind() {
        if !takes(&Packed::f32(1, 1, &[0.0]).unwrap(), MIN_ROWS, detect()) {
            return;
        }
        let mut s = 23u64;
        for &(n, k) in &[(1, 64), (17, 96), (33, 896), (40, 192), (130, 256), (5, 4864), (19, 200)] {
            let mut ps: Vec<Packed> = Vec::new();
            let w: Vec<f32> = (0..n * k).map(|_| lcg(&mut s)).collect();
            let wb: Vec<u16> = w.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
            ps.push(Packed::f32(n, k, &w).unwrap());
            ps.push(Packed::bf16(n, k, &wb).unwrap());
            let q: Vec<i8> = w.iter().map(|v| (v * 254.0) as i8).collect();
            ps.push(Packed::int8(n, k, &q, &vec![0.01; n]).unwrap());
            let bias: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
            for p in &ps {
                let mut wd = vec![0f32; n * k];
                p.rows(&(0..n).collect::<Vec<_>>(), &mut wd).unwrap();
                for m in [16usize, 17, 23, 64, 512] {
                    let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut s)).collect();
                    let mut y = vec![f32::NAN; m * n];
                    // this path's own `chunk`, not `run`: bf16 weights would take the AMX tiles
                    // where the CPU has them, f32 weights the engine's GEMM (`dense_gemm`)
                    let acts: Vec<Act> = x.chunks(k).map(Act::Dense).collect();
                    assert!(chunk(&Job { p, acts: &acts, out: y.as_mut_ptr(), ld: n, bias: Some(&bias) }, 0, n, detect()));
                    for i in 0..m {
                        for r in 0..n {
                            let exact: f64 = (0..k).map(|c| wd[r * k + c] as f64 * x[i * k + c] as f64).sum::<f64>() + bias[r] as f64;
                            let mag: f64 =
                                (0..k).map(|c| (wd[r * k + c] as f64 * x[i * k + c] as f64).abs()).sum::<f64>() + bias[r].abs() as f64;
                            let got = y[i * n + r] as f64;
                            assert!(
                                (got - exact).abs() <= 1e-5 * mag + 1e-7,
                                "{} n={n} k={k} m={m}: {got} vs {exact}",
                                p.kind()
                            );
                        }
                    }
                }
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod isa_tests {
    use super::super::test_util::lcg;
    use super::*;

    /// The AVX-512 tile and the AVX2 tiles give the same bits for every row count, K
    /// (odd, short, long), accumulate / bias combination and special value.
    #[test]
    fn avx512_tile_matches_avx2_tiles_bit_for_bit() {
        if !(crate::core::isa::has_avx512() && crate::core::isa::has_avx2()) {
            return; // one ISA only: the other tile cannot run here
        }
        let mut s = 7u64;
        for &k in &[1usize, 3, 16, 97, 896] {
            let mut panel: Vec<f32> = (0..k * NR).map(|_| lcg(&mut s)).collect();
            panel[(NR + 3) % (k * NR)] = f32::INFINITY;
            let mut x: Vec<Vec<f32>> = (0..MR).map(|_| (0..k).map(|_| lcg(&mut s)).collect()).collect();
            x[1][0] = f32::NAN;
            let bias: Vec<f32> = (0..NR).map(|_| lcg(&mut s)).collect();
            for r in 1..=MR {
                let xs: Vec<*const f32> = x[..r].iter().map(|v| v.as_ptr()).collect();
                for (add, with_bias) in [(false, false), (true, false), (false, true), (true, true)] {
                    let start: Vec<f32> = (0..r * NR).map(|_| lcg(&mut s)).collect();
                    let (mut a, mut b) = (start.clone(), start);
                    let b_ptr = with_bias.then_some(bias.as_ptr());
                    // SAFETY: both ISAs checked above; `a` / `b` hold r rows of NR, each x row k values.
                    unsafe {
                        x86::kernel_avx512(&xs, panel.as_ptr(), k, &Out { ptr: a.as_mut_ptr(), ld: NR, add, bias: b_ptr });
                        x86::kernel_avx2_tiles(&xs, panel.as_ptr(), k, &Out { ptr: b.as_mut_ptr(), ld: NR, add, bias: b_ptr });
                    }
                    let (ab, bb): (Vec<u32>, Vec<u32>) = (a.iter().map(|v| v.to_bits()).collect(), b.iter().map(|v| v.to_bits()).collect());
                    assert_eq!(ab, bb, "k={k} rows={r} add={add} bias={with_bias}");
                }
            }
        }
    }
}

#[cfg(test)]
mod probe {
    use super::super::qgemm::bench::cpu_time;
    use super::*;

    #[test]
    #[ignore]
    fn kernel_l1_peak() {
        for &kl in &[64usize, 256] {
            let panel = vec![0.5f32; kl * NR];
            let x: Vec<Vec<f32>> = (0..MR).map(|_| vec![0.25f32; kl]).collect();
            let xo: Vec<*const f32> = x.iter().map(|r| r.as_ptr()).collect();
            let mut res = [[0f32; NR]; MR];
            let out = Out { ptr: res.as_mut_ptr().cast(), ld: NR, add: true, bias: None };
            let reps = 200000;
            let t0 = cpu_time();
            for _ in 0..reps {
                unsafe { x86::kernel(&xo, panel.as_ptr(), kl, &out) };
            }
            let s = cpu_time() - t0;
            println!("kl={kl}: {:.1} GMAC/s ({})", (reps * kl * NR * MR) as f64 / s / 1e9, res[0][0]);
        }
        let (n, k) = (9728usize, 896usize);
        let ps = [
            Packed::bf16(n, k, &vec![0x3f80u16; n * k]).unwrap(),
            Packed::int8(n, k, &vec![3i8; n * k], &vec![0.01; n]).unwrap(),
        ];
        let mut buf = vec![0f32; k * NR];
        for p in &ps {
            let t0 = cpu_time();
            for r in (0..n).step_by(NR) {
                dequant_panel(p, r, NR, &mut buf);
            }
            let s = cpu_time() - t0;
            println!("dequant {}: {:.2} ns/value; per 512-row GEMM at 40 GMAC/s: {:.1}%", p.kind(), s / (n * k) as f64 * 1e9, s / ((512 * n * k) as f64 / 40e9) * 100.0);
        }
    }
}
