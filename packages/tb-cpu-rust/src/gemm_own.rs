//! Our own packed, cache-blocked single-precision GEMM for AVX-512 CPUs, with the epilogue
//! (bias, activations, residual add) applied per output tile while it is still in L1.
//!
//! Why an own kernel: the `gemm` crate only uses AVX-512 with its `nightly` feature and
//! `matrixmultiply` has no AVX-512 kernel, so on AVX-512 machines both run at the AVX2 rate.
//! The benchmark compares all three (README, "Performance").
//!
//! Layout (Goto/BLIS): B is packed once per call into NR-column panels for every KC-deep slice
//! of k; each task packs its MC×KC blocks of A into MR-row panels; an MR×NR micro-kernel
//! keeps the C tile in 16 zmm registers for KC rank-1 updates.

use crate::exec::SPtr;
use crate::gemm::{Epi, Mat};
use rayon::prelude::*;
use std::cell::RefCell;

pub const MR: usize = 8;
pub const NR: usize = 32;
fn blocking() -> (usize, usize) {
    static B: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();
    *B.get_or_init(|| {
        let get = |k: &str, d: usize| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
        (get("TB_GEMM_KC", 512).max(1), (get("TB_GEMM_MC", 64) / MR * MR).max(MR))
    })
}

thread_local! {
    static PACK_A: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static PACK_B: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with a thread-local scratch vector of at least `n` floats (a fresh one when the
/// thread-local is already borrowed, e.g. by a nested call on the same rayon worker).
fn with_scratch<R>(cell: &'static std::thread::LocalKey<RefCell<Vec<f32>>>, n: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    cell.with(|c| match c.try_borrow_mut() {
        Ok(mut v) => {
            if v.len() < n {
                v.resize(n, 0.0);
            }
            f(&mut v[..n])
        }
        Err(_) => f(&mut vec![0.0; n]),
    })
}

pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::isa::has_avx512()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// c = [c +] alpha * a @ b, then the epilogue, for a m×n×k product.
///
/// # Safety
/// As `gemm::sgemm`; `available()` must be true.
pub unsafe fn sgemm(m: usize, n: usize, k: usize, a: Mat, b: Mat, c: Mat, alpha: f32, accumulate: bool, threads: usize, epi: &Epi) {
    let (kc_, _) = blocking();
    let npan = n.div_ceil(NR);
    let n_pad = npan * NR;
    let nblocks = k.div_ceil(kc_);
    let work = m * n * k;
    // below ~2M multiply-adds per thread the fork/join costs more than it saves
    let threads = threads.min((work >> 21).max(1));
    with_scratch(&PACK_B, k * n_pad, |pb| {
        let pbp = SPtr(pb.as_mut_ptr());
        let pack_one = |i: usize| {
            let (q, jp) = (i / npan, i % npan);
            let p0 = q * kc_;
            let kc = kc_.min(k - p0);
            pack_b(b, p0, kc, jp * NR, n, pbp.get().add(p0 * n_pad + jp * kc * NR));
        };
        if threads > 1 {
            (0..nblocks * npan).into_par_iter().for_each(pack_one);
        } else {
            (0..nblocks * npan).for_each(pack_one);
        }
        // split C into `threads` tasks: by rows when there are enough of them, else by columns
        let mpan = m.div_ceil(MR);
        let (tm, tn) = if mpan >= 2 * threads || mpan >= npan { (threads.min(mpan), 1) } else { (1, threads.min(npan)) };
        let task = |t: usize| {
            let (ti, tj) = (t / tn, t % tn);
            let (r0, r1) = (mpan * ti / tm * MR, (mpan * (ti + 1) / tm * MR).min(m));
            let (j0, j1) = (npan * tj / tn, npan * (tj + 1) / tn);
            if r0 >= r1 || j0 >= j1 {
                return;
            }
            let (kc_, mc_) = blocking();
            with_scratch(&PACK_A, mc_ * kc_, |pa| {
                run_task(r0, r1, j0, j1, m, n, k, n_pad, a, pbp, pa, c, alpha, accumulate, epi);
            });
        };
        if tm * tn > 1 {
            (0..tm * tn).into_par_iter().for_each(task);
        } else {
            task(0);
        }
    });
}

#[allow(clippy::too_many_arguments)]
unsafe fn run_task(
    r0: usize, r1: usize, jp0: usize, jp1: usize, m: usize, n: usize, k: usize, n_pad: usize, a: Mat, pb: SPtr<f32>,
    pa: &mut [f32], c: Mat, alpha: f32, accumulate: bool, epi: &Epi,
) {
    let _ = m;
    let (kc_, mc_) = blocking();
    let mut p0 = 0;
    while p0 < k {
        let kc = kc_.min(k - p0);
        let first = p0 == 0;
        let last = p0 + kc >= k;
        let mut i0 = r0;
        while i0 < r1 {
            let mc = mc_.min(r1 - i0);
            pack_a(a, i0, mc, p0, kc, pa.as_mut_ptr());
            for jp in jp0..jp1 {
                let bpan = pb.get().add(p0 * n_pad + jp * kc * NR);
                let j = jp * NR;
                let nv = NR.min(n - j);
                let mut ir = 0;
                while ir < mc {
                    let mv = MR.min(mc - ir);
                    let acc = accumulate || !first;
                    let ap = pa.as_ptr().add(ir * kc);
                    if mv == MR && nv == NR && c.cs == 1 {
                        // full tile, contiguous rows: accumulators go straight into C
                        let cp = c.p.0.offset((i0 + ir) as isize * c.rs + j as isize);
                        micro_direct(kc, ap, bpan, cp, c.rs, alpha, acc);
                        if last && !epi.is_empty() {
                            for r in 0..MR {
                                let row = std::slice::from_raw_parts_mut(cp.offset(r as isize * c.rs), NR);
                                epi_row(epi, row, i0 + ir + r, j);
                            }
                        }
                    } else {
                        let mut tile = [0f32; MR * NR];
                        micro(kc, ap, bpan, &mut tile);
                        store_tile(&tile, c, i0 + ir, j, mv, nv, alpha, acc, if last { Some(epi) } else { None });
                    }
                    ir += MR;
                }
            }
            i0 += mc;
        }
        p0 += kc;
    }
}

/// Packs rows i0..i0+mc, depth p0..p0+kc of A into MR-row panels (zero rows past the end).
unsafe fn pack_a(a: Mat, i0: usize, mc: usize, p0: usize, kc: usize, dst: *mut f32) {
    let mut ir = 0;
    while ir < mc {
        let mv = MR.min(mc - ir);
        let d = dst.add(ir * kc);
        if a.cs == 1 {
            for r in 0..MR {
                if r < mv {
                    let src = a.p.0.offset((i0 + ir + r) as isize * a.rs + p0 as isize);
                    for p in 0..kc {
                        *d.add(p * MR + r) = *src.add(p);
                    }
                } else {
                    for p in 0..kc {
                        *d.add(p * MR + r) = 0.0;
                    }
                }
            }
        } else {
            for p in 0..kc {
                let src = a.p.0.offset((p0 + p) as isize * a.cs + (i0 + ir) as isize * a.rs);
                for r in 0..MR {
                    *d.add(p * MR + r) = if r < mv { *src.offset(r as isize * a.rs) } else { 0.0 };
                }
            }
        }
        ir += MR;
    }
}

/// Packs depth p0..p0+kc, columns j0..j0+NR of B into one panel (zero columns past n).
unsafe fn pack_b(b: Mat, p0: usize, kc: usize, j0: usize, n: usize, dst: *mut f32) {
    let nv = NR.min(n - j0);
    if b.cs == 1 {
        for p in 0..kc {
            let src = b.p.0.offset((p0 + p) as isize * b.rs + j0 as isize);
            let d = dst.add(p * NR);
            std::ptr::copy_nonoverlapping(src, d, nv);
            for j in nv..NR {
                *d.add(j) = 0.0;
            }
        }
    } else if b.rs == 1 {
        // transposed weights (linear): each column of B is contiguous along k; transpose
        // 16×16 blocks in registers
        pack_b_t(b, p0, kc, j0, nv, dst);
    } else {
        for j in 0..NR {
            if j < nv {
                let src = b.p.0.offset((j0 + j) as isize * b.cs + p0 as isize * b.rs);
                for p in 0..kc {
                    *dst.add(p * NR + j) = *src.offset(p as isize * b.rs);
                }
            } else {
                for p in 0..kc {
                    *dst.add(p * NR + j) = 0.0;
                }
            }
        }
    }
}

/// Packs a B whose columns are contiguous (rs == 1, column j at j * cs).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pack_b_t(b: Mat, p0: usize, kc: usize, j0: usize, nv: usize, dst: *mut f32) {
    use std::arch::x86_64::*;
    let col = |j: usize| b.p.0.offset((j0 + j) as isize * b.cs + p0 as isize);
    let full_p = kc / 16 * 16;
    for h in 0..NR / 16 {
        let mut pp = 0;
        while pp < full_p {
            let mut r = [_mm512_setzero_ps(); 16];
            for (i, ri) in r.iter_mut().enumerate() {
                let j = h * 16 + i;
                if j < nv {
                    *ri = _mm512_loadu_ps(col(j).add(pp));
                }
            }
            let mut t = [_mm512_setzero_ps(); 16];
            for i in 0..8 {
                t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
                t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
            }
            let mut u = [_mm512_setzero_ps(); 16];
            for g in 0..4 {
                let (a, b1, c, d) = (t[4 * g], t[4 * g + 1], t[4 * g + 2], t[4 * g + 3]);
                u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(c)));
                u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(c)));
                u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(b1), _mm512_castps_pd(d)));
                u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(b1), _mm512_castps_pd(d)));
            }
            // u[4g + q] holds, in 128-bit lane L, column 4L + q of rows 4g..4g+4
            for q in 0..4 {
                let xlo = _mm512_shuffle_f32x4::<0x44>(u[q], u[4 + q]);
                let xhi = _mm512_shuffle_f32x4::<0xEE>(u[q], u[4 + q]);
                let ylo = _mm512_shuffle_f32x4::<0x44>(u[8 + q], u[12 + q]);
                let yhi = _mm512_shuffle_f32x4::<0xEE>(u[8 + q], u[12 + q]);
                let cols = [
                    _mm512_shuffle_f32x4::<0x88>(xlo, ylo),
                    _mm512_shuffle_f32x4::<0xDD>(xlo, ylo),
                    _mm512_shuffle_f32x4::<0x88>(xhi, yhi),
                    _mm512_shuffle_f32x4::<0xDD>(xhi, yhi),
                ];
                for (l, v) in cols.iter().enumerate() {
                    _mm512_storeu_ps(dst.add((pp + 4 * l + q) * NR + h * 16), *v);
                }
            }
            pp += 16;
        }
    }
    for p in full_p..kc {
        for j in 0..NR {
            *dst.add(p * NR + j) = if j < nv { *col(j).add(p) } else { 0.0 };
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn pack_b_t(b: Mat, p0: usize, kc: usize, j0: usize, nv: usize, dst: *mut f32) {
    for j in 0..NR {
        for p in 0..kc {
            *dst.add(p * NR + j) = if j < nv { *b.p.0.offset((j0 + j) as isize * b.cs + (p0 + p) as isize) } else { 0.0 };
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn micro(kc: usize, a: *const f32, b: *const f32, tile: &mut [f32; MR * NR]) {
    use std::arch::x86_64::*;
    let mut c = [[_mm512_setzero_ps(); 2]; MR];
    let (mut a, mut b) = (a, b);
    for _ in 0..kc {
        let b0 = _mm512_loadu_ps(b);
        let b1 = _mm512_loadu_ps(b.add(16));
        for r in 0..MR {
            let av = _mm512_set1_ps(*a.add(r));
            c[r][0] = _mm512_fmadd_ps(av, b0, c[r][0]);
            c[r][1] = _mm512_fmadd_ps(av, b1, c[r][1]);
        }
        a = a.add(MR);
        b = b.add(NR);
    }
    for r in 0..MR {
        _mm512_storeu_ps(tile.as_mut_ptr().add(r * NR), c[r][0]);
        _mm512_storeu_ps(tile.as_mut_ptr().add(r * NR + 16), c[r][1]);
    }
}

/// The micro-kernel writing C directly: C[r, 0..NR] = [C +] alpha * acc.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn micro_direct(kc: usize, a: *const f32, b: *const f32, cp: *mut f32, rs: isize, alpha: f32, acc: bool) {
    use std::arch::x86_64::*;
    let mut c = [[_mm512_setzero_ps(); 2]; MR];
    let (mut a, mut b) = (a, b);
    for _ in 0..kc {
        let b0 = _mm512_loadu_ps(b);
        let b1 = _mm512_loadu_ps(b.add(16));
        for r in 0..MR {
            let av = _mm512_set1_ps(*a.add(r));
            c[r][0] = _mm512_fmadd_ps(av, b0, c[r][0]);
            c[r][1] = _mm512_fmadd_ps(av, b1, c[r][1]);
        }
        a = a.add(MR);
        b = b.add(NR);
    }
    let al = _mm512_set1_ps(alpha);
    for r in 0..MR {
        let p = cp.offset(r as isize * rs);
        let (mut v0, mut v1) = (_mm512_mul_ps(c[r][0], al), _mm512_mul_ps(c[r][1], al));
        if acc {
            v0 = _mm512_add_ps(v0, _mm512_loadu_ps(p));
            v1 = _mm512_add_ps(v1, _mm512_loadu_ps(p.add(16)));
        }
        _mm512_storeu_ps(p, v0);
        _mm512_storeu_ps(p.add(16), v1);
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn micro_direct(kc: usize, a: *const f32, b: *const f32, cp: *mut f32, rs: isize, alpha: f32, acc: bool) {
    let mut tile = [0f32; MR * NR];
    micro(kc, a, b, &mut tile);
    for r in 0..MR {
        for j in 0..NR {
            let p = cp.offset(r as isize * rs + j as isize);
            *p = if acc { *p + alpha * tile[r * NR + j] } else { alpha * tile[r * NR + j] };
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn epi_row(epi: &Epi, row: &mut [f32], i: usize, j: usize) {
    epi.apply_row(row, i, j)
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn epi_row(epi: &Epi, row: &mut [f32], i: usize, j: usize) {
    epi.apply_row(row, i, j)
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn micro(kc: usize, a: *const f32, b: *const f32, tile: &mut [f32; MR * NR]) {
    for p in 0..kc {
        for r in 0..MR {
            for j in 0..NR {
                tile[r * NR + j] += *a.add(p * MR + r) * *b.add(p * NR + j);
            }
        }
    }
}

/// Writes the valid mv×nv part of a tile into C (scaled by alpha, added to C when `acc`) and
/// runs the epilogue on it while it is in L1.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn store_tile(tile: &[f32; MR * NR], c: Mat, i: usize, j: usize, mv: usize, nv: usize, alpha: f32, acc: bool, epi: Option<&Epi>) {
    store_tile_generic(tile, c, i, j, mv, nv, alpha, acc, epi)
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn store_tile(tile: &[f32; MR * NR], c: Mat, i: usize, j: usize, mv: usize, nv: usize, alpha: f32, acc: bool, epi: Option<&Epi>) {
    store_tile_generic(tile, c, i, j, mv, nv, alpha, acc, epi)
}

#[inline(always)]
unsafe fn store_tile_generic(tile: &[f32; MR * NR], c: Mat, i: usize, j: usize, mv: usize, nv: usize, alpha: f32, acc: bool, epi: Option<&Epi>) {
    let mut row = [0f32; NR];
    for r in 0..mv {
        let t = &tile[r * NR..r * NR + nv];
        let cp = c.p.0.offset((i + r) as isize * c.rs + j as isize * c.cs);
        let row = &mut row[..nv];
        if acc {
            if c.cs == 1 {
                let cs = std::slice::from_raw_parts(cp, nv);
                for ((o, &x), &y) in row.iter_mut().zip(t).zip(cs) {
                    *o = y + alpha * x;
                }
            } else {
                for (q, (o, &x)) in row.iter_mut().zip(t).enumerate() {
                    *o = *cp.offset(q as isize * c.cs) + alpha * x;
                }
            }
        } else if alpha == 1.0 {
            row.copy_from_slice(t);
        } else {
            for (o, &x) in row.iter_mut().zip(t) {
                *o = alpha * x;
            }
        }
        if let Some(e) = epi {
            e.apply_row(row, i + r, j);
        }
        if c.cs == 1 {
            std::ptr::copy_nonoverlapping(row.as_ptr(), cp, nv);
        } else {
            for (q, &x) in row.iter().enumerate() {
                *cp.offset(q as isize * c.cs) = x;
            }
        }
    }
}
