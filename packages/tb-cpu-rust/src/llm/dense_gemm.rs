//! Prefill of dense weights on the engine's own GEMM kernels (`kernels::gemm`, the kernels the
//! compile path's `mm` runs): `Y = X @ W^T` for a chunk of weight rows, single-threaded (the
//! chunks are the parallel tasks, as for every prefill path).
//!
//! The panel GEMM (`panel`) serves every weight format with one register tile (12 activation
//! rows × 16 weight rows, each FMA with a broadcast load): 13 loads per 12 FMAs keeps it near the
//! load ports' limit, about half the FMA peak. The engine's kernel packs both operands into cache
//! blocks and runs a tile with two vector loads and eight broadcasts per sixteen FMAs, near the
//! peak (see `benchmarks/bench_gemm.py`).
//!
//! - **float32 weights**: the weight chunk is simply B = W[r0..r0+n]ᵀ (k contiguous per column,
//!   the `Linear` layout). Exact float32 products and sums like the panel path (another
//!   summation order).
//! - **bfloat16 weights on AVX-512 BF16 without AMX tiles** (`tiles` takes them where AMX is):
//!   the engine's pair kernel (`kernels::gemm::bf16`, `vdpbf16ps`: two bf16 products per float32
//!   lane and instruction, twice the float32 FMA rate), the weights read as stored. The
//!   activation rows are rounded once to bf16 (nearest even, as the tiles path and an eager
//!   bfloat16 model round them); products of two bf16 values are exact in float32 and the sums
//!   are float32, so the only difference from the panel path is that rounding (the LLM
//!   conformance suite's `bf16_rounding`). `llm_prefill_bf16_pairs(False)` keeps the panel path.
//!
//! The activations are packed once per `gemv::run` for every chunk (`PackedActs`).

use super::gemv::{Act, Job};
use super::packed::Packed;
use crate::core::mem::SPtr;
use crate::kernels::gemm::{Epi, Mat};
use std::sync::atomic::{AtomicBool, Ordering};

/// From this many activation rows on (the panel path's threshold).
pub const MIN_ROWS: usize = super::panel::MIN_ROWS;

/// On unless a benchmark turns it off (`set_enabled`: the two paths interleaved in one run).
static ENABLED: AtomicBool = AtomicBool::new(true);

pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// bf16 weights on the pair kernel: on unless a benchmark or a user turns it off.
static PAIRS: AtomicBool = AtomicBool::new(true);

pub fn pairs_enabled() -> bool {
    PAIRS.load(Ordering::Relaxed)
}

pub fn set_pairs_enabled(on: bool) {
    PAIRS.store(on, Ordering::Relaxed);
}

/// Whether bf16 weights with `k` values a row take the pair kernel here (on, the CPU has
/// AVX-512 BF16 with the own GEMM backend, k even: whole pairs).
fn pairs_take(k: usize) -> bool {
    pairs_enabled() && k.is_multiple_of(2) && crate::kernels::gemm::bf16::pairs_available()
}

/// Whether weights `p` take the pair kernel: bf16 as stored; int8 and int4 widened to bf16 in
/// blocks of `WIDE_ROWS` rows (int4: K a multiple of 32, whole blocks; `gemv::prepare_rows`
/// then hands its activations over unquantized).
pub fn pairs_take_weights(p: &Packed) -> bool {
    match p {
        Packed::Bf16 { k, .. } | Packed::Int8 { k, .. } => pairs_take(*k),
        Packed::Int4 { k, .. } => pairs_take(*k) && k.is_multiple_of(32),
        Packed::F32 { .. } => false,
    }
}

/// Weight rows widened to bf16 at a time for the pair kernel: one 32-column panel.
const WIDE_ROWS: usize = 32;

thread_local! {
    /// A block of int8 weight rows widened to bf16 (one per thread, reused per block).
    static WIDE: std::cell::RefCell<Vec<u16>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Whether this path may take weights `p` for `m` activation rows (`matrix` decides per job).
pub fn may_take(p: &Packed, m: usize) -> bool {
    (matches!(p, Packed::F32 { .. }) || pairs_take_weights(p)) && takes(m)
}

/// What a packed activation matrix is packed for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// float32 values for the float32 kernel
    F32,
    /// bf16-rounded values, two per 32-bit word, for the pair kernel (k counted in pairs)
    Pairs,
}

/// Weight rows per parallel chunk for `job` when this path takes it: two chunks per thread
/// (balance against a thread that loses its core; the activations are packed once for all of
/// them by `PackedActs`, each chunk packs only its own weight panels); None when it does not
/// take it.
pub fn chunk_rows(p: &Packed, m: usize, threads: usize) -> Option<usize> {
    let n = match p {
        Packed::F32 { n, .. } => *n,
        _ if pairs_take_weights(p) => p.shape().0,
        _ => return None,
    };
    takes(m).then(|| n.div_ceil(2 * threads.max(1)))
}

/// On, enough activation rows, and the own kernel as the GEMM backend (float32 weights aside).
fn takes(m: usize) -> bool {
    enabled() && m >= MIN_ROWS && crate::kernels::gemm::backend() == "own"
}

/// `job`'s activations as one `[m, K]` matrix when this path takes the job: float32 weights, at
/// least `MIN_ROWS` activation rows, all `Dense` and equally spaced in memory (rows of one
/// matrix), the own kernel as the GEMM backend; None otherwise.
fn matrix(job: &Job) -> Option<(Mat, Kind)> {
    let (k, kind) = match job.p {
        Packed::F32 { k, .. } => (k, Kind::F32),
        Packed::Bf16 { k, .. } | Packed::Int8 { k, .. } | Packed::Int4 { k, .. } if pairs_take_weights(job.p) => (k, Kind::Pairs),
        _ => return None,
    };
    let m = job.acts.len();
    if !takes(m) || *k == 0 || crate::kernels::gemm::own::packed_b_layout(*k).is_none() {
        return None;
    }
    let mut xs = Vec::with_capacity(m);
    for a in job.acts {
        match a {
            Act::Dense(x) if x.len() == *k => xs.push(x.as_ptr()),
            _ => return None,
        }
    }
    // rows of one [m, K] matrix: ascending, equally spaced, at least K apart
    let lda = (xs[1] as usize).saturating_sub(xs[0] as usize) / 4;
    if lda < *k || xs.iter().enumerate().any(|(i, &x)| Some(x as usize) != (4 * i).checked_mul(lda).and_then(|d| d.checked_add(xs[0] as usize))) {
        return None;
    }
    Some((Mat { p: SPtr(xs[0] as *mut f32), rs: lda as isize, cs: 1 }, kind))
}

/// Floats of the packed matrix for `m` rows of `k` values packed as `kind`.
fn packed_len(kind: Kind, m: usize, k: usize) -> usize {
    match kind {
        Kind::F32 => crate::kernels::gemm::own::packed_a_len(m, k),
        #[cfg(target_arch = "x86_64")]
        Kind::Pairs => crate::kernels::gemm::own::packed_a_len_for::<crate::kernels::gemm::bf16::x86::Pairs>(m, k / 2),
        #[cfg(not(target_arch = "x86_64"))]
        Kind::Pairs => 0,
    }
}

/// KC-deep slices of the packed matrix (the items `PackedActs` packs in parallel).
fn slices(kind: Kind, k: usize) -> usize {
    match kind {
        Kind::F32 => crate::kernels::gemm::own::a_slices(k),
        #[cfg(target_arch = "x86_64")]
        Kind::Pairs => crate::kernels::gemm::own::a_slices_for::<crate::kernels::gemm::bf16::x86::Pairs>(k / 2),
        #[cfg(not(target_arch = "x86_64"))]
        Kind::Pairs => 0,
    }
}

/// The activation matrices of a set of jobs packed for the GEMM's micro-kernel
/// (`own::pack_a_slices`), once each: jobs reading the same activations (q / k / v, gate / up)
/// share one. A job's chunks all read its packed matrix instead of packing it again each (a
/// 512-token prefill packed its activations ~5× over in chunks, 5 % of the prefill's time).
pub struct PackedActs {
    bufs: Vec<Vec<f32>>,
    of_job: Vec<Option<usize>>,
}

thread_local! {
    /// Packed-activation buffers `PackedActs` returns when dropped, for the next run.
    static SPARE: std::cell::RefCell<Vec<Vec<f32>>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Drop for PackedActs {
    fn drop(&mut self) {
        let bufs = std::mem::take(&mut self.bufs);
        let _ = SPARE.try_with(|spare| {
            let mut spare = spare.borrow_mut();
            for b in bufs {
                if spare.len() < 2 {
                    spare.push(b);
                }
            }
        });
    }
}

impl PackedActs {
    /// Packs what this path takes of `jobs`; `run_all(items, f)` runs `f(0..items)`, on several
    /// threads where the caller has them (the slices of each matrix are the items).
    pub fn new(jobs: &[Job], run_all: impl FnOnce(usize, &(dyn Fn(usize) + Sync))) -> Self {
        let mut mats: Vec<(Mat, Kind, usize, usize)> = Vec::new(); // (A, kind, m, k) of each distinct matrix
        let mut of_job = Vec::with_capacity(jobs.len());
        for j in jobs {
            let Some((a, kind)) = matrix(j) else {
                of_job.push(None);
                continue;
            };
            let (m, k) = (j.acts.len(), j.p.shape().1);
            let same = mats.iter().position(|(b, bk, bm, bkk)| b.p.0 == a.p.0 && b.rs == a.rs && *bk == kind && *bm == m && *bkk == k);
            of_job.push(Some(same.unwrap_or_else(|| {
                mats.push((a, kind, m, k));
                mats.len() - 1
            })));
        }
        // buffers kept by the calling thread from run to run: a fresh multi-MiB allocation is
        // mapped anew each time, and its first writes fault every page in
        let mut bufs: Vec<Vec<f32>> = SPARE.with(|spare| {
            let mut spare = spare.borrow_mut();
            mats.iter()
                .map(|&(_, kind, m, k)| {
                    let mut b = spare.pop().unwrap_or_default();
                    b.resize(packed_len(kind, m, k), 0.0);
                    b
                })
                .collect()
        });
        // the pair kernel's matrices: rounded to bf16 first (one pass, on the calling thread)
        let rounded: Vec<Vec<u16>> = mats
            .iter()
            .map(|&(a, kind, m, k)| {
                if kind != Kind::Pairs {
                    return Vec::new();
                }
                let round = crate::kernels::cast::vector_cast(crate::core::tensor::DType::F32, crate::core::tensor::DType::BF16).expect("f32 -> bf16 cast");
                let mut r = vec![0u16; m * k];
                for i in 0..m {
                    // SAFETY: row i of A holds k floats (`matrix` checked the rows); r holds m * k
                    unsafe { round(a.p.0.offset(i as isize * a.rs) as *const u8, r.as_mut_ptr().add(i * k) as *mut u8, k) };
                }
                r
            })
            .collect();
        let items: Vec<(usize, usize)> = mats.iter().enumerate().flat_map(|(i, &(_, kind, _, k))| (0..slices(kind, k)).map(move |s| (i, s))).collect();
        let dsts: Vec<SPtr<f32>> = bufs.iter_mut().map(|b| SPtr(b.as_mut_ptr())).collect();
        let srcs: Vec<Mat> = mats
            .iter()
            .zip(&rounded)
            .map(|(&(a, kind, _, k), r)| match kind {
                Kind::F32 => a,
                // bf16 pairs as 32-bit words: an m × k/2 matrix
                Kind::Pairs => Mat { p: SPtr(r.as_ptr() as *mut f32), rs: (k / 2) as isize, cs: 1 },
            })
            .collect();
        if !items.is_empty() {
            run_all(items.len(), &|t| {
                let (i, s) = items[t];
                let (_, kind, m, k) = mats[i];
                // SAFETY: the matrix was checked by `matrix` (or is its rounded copy); each item
                // writes its own slice of a buffer sized by `packed_len`
                unsafe {
                    match kind {
                        Kind::F32 => crate::kernels::gemm::own::pack_a_slice(srcs[i], m, k, s, dsts[i].get()),
                        #[cfg(target_arch = "x86_64")]
                        Kind::Pairs => crate::kernels::gemm::own::pack_a_slice_for::<crate::kernels::gemm::bf16::x86::Pairs>(srcs[i], m, k / 2, s, dsts[i].get()),
                        #[cfg(not(target_arch = "x86_64"))]
                        Kind::Pairs => {}
                    }
                }
            });
        }
        PackedActs { bufs, of_job }
    }

    /// Job `ji`'s packed activations, if this path takes it.
    pub fn of(&self, ji: usize) -> Option<&[f32]> {
        self.of_job.get(ji).copied().flatten().map(|i| self.bufs[i].as_slice())
    }
}

/// Rows `r0 .. r0 + nrows` of `job`'s output through the engine's GEMM; false (nothing touched)
/// unless `matrix` takes the job. `packed`: the job's activations packed by `PackedActs` (None:
/// the GEMM packs them itself).
pub fn chunk(job: &Job, r0: usize, nrows: usize, packed: Option<&[f32]>) -> bool {
    if nrows == 0 {
        return false;
    }
    let Some((a, kind)) = matrix(job) else { return false };
    let m = job.acts.len();
    let k = job.p.shape().1;
    let c = Mat { p: SPtr(job.out.wrapping_add(r0)), rs: job.ld as isize, cs: 1 };
    let bias = job.bias.map(|b| (Mat { p: SPtr(b[r0..].as_ptr() as *mut f32), rs: 0, cs: 1 }, 1.0));
    let epi = Epi::new(bias, []);
    match (job.p, kind) {
        (Packed::F32 { w, .. }, Kind::F32) => {
            // SAFETY: rows r0..r0 + nrows of W exist (the caller's chunk); the output rows are
            // this chunk's to write (the caller of `gemv::run` promised disjoint outputs);
            // `packed` is this job's matrix packed by `PackedActs`
            unsafe {
                let b = Mat { p: SPtr(w.as_ptr().add(r0 * k) as *mut f32), rs: 1, cs: k as isize };
                match packed {
                    Some(pa) if pa.len() == packed_len(kind, m, k) => crate::kernels::gemm::own::sgemm_packed_a(m, nrows, k, pa.as_ptr(), b, c, &epi),
                    _ => crate::kernels::gemm::sgemm_epi(m, nrows, k, a, b, c, 1.0, false, 1, &epi),
                }
            }
            true
        }
        #[cfg(target_arch = "x86_64")]
        (Packed::Bf16 { w, .. }, Kind::Pairs) => {
            // only with the activations rounded and packed by `PackedActs` (else the panel path)
            let Some(pa) = packed.filter(|pa| pa.len() == packed_len(kind, m, k)) else { return false };
            // SAFETY: as above; W's rows are k bf16 values = k/2 words, so B = W[r0..]^T is a
            // k/2 × nrows matrix of words with columns k/2 apart; `pairs_take` held (AVX-512 BF16)
            unsafe {
                let b = Mat { p: SPtr(w.as_ptr().add(r0 * k) as *mut f32), rs: 1, cs: (k / 2) as isize };
                crate::kernels::gemm::own::drive_packed_a::<crate::kernels::gemm::bf16::x86::Pairs>(m, nrows, k / 2, pa.as_ptr(), b, c, &epi);
            }
            true
        }
        #[cfg(target_arch = "x86_64")]
        (Packed::Int8 { .. } | Packed::Int4 { .. }, Kind::Pairs) => {
            let Some(pa) = packed.filter(|pa| pa.len() == packed_len(kind, m, k)) else { return false };
            WIDE.with(|cell| {
                let mut wide = cell.borrow_mut();
                if wide.len() < WIDE_ROWS * k {
                    wide.resize(WIDE_ROWS * k, 0);
                }
                let mut j = r0;
                while j < r0 + nrows {
                    let nv = WIDE_ROWS.min(r0 + nrows - j);
                    // the block's rows as bf16: int8 as `q - 128` (exact: at most 8 significant
                    // bits; each row's scale and bias applied to the float32 sums below), int4
                    // dequantized as `Packed::rows` does and rounded (its bias in the epilogue)
                    let scale = match job.p {
                        Packed::Int8 { kp, w, scale, .. } => {
                            for r in 0..nv {
                                super::tiles::int8_row_bf16(&w[(j + r) * kp..(j + r) * kp + k], &mut wide[r * k..(r + 1) * k]);
                            }
                            Some(&scale[j..j + nv])
                        }
                        _ => {
                            super::tiles::int4_rows_bf16(job.p, j, nv, &mut wide[..nv * k]);
                            None
                        }
                    };
                    let cj = Mat { p: SPtr(job.out.wrapping_add(j)), rs: job.ld as isize, cs: 1 };
                    let bias = job.bias.map(|b| &b[j..j + nv]);
                    let epi = Epi::new(if scale.is_none() { bias.map(|b| (Mat { p: SPtr(b.as_ptr() as *mut f32), rs: 0, cs: 1 }, 1.0)) } else { None }, []);
                    // SAFETY: `wide` holds nv rows of k bf16 values = k/2 words each; the
                    // output columns j..j + nv of every row are this chunk's (see above)
                    unsafe {
                        let b = Mat { p: SPtr(wide.as_ptr() as *mut f32), rs: 1, cs: (k / 2) as isize };
                        crate::kernels::gemm::own::drive_packed_a::<crate::kernels::gemm::bf16::x86::Pairs>(m, nv, k / 2, pa.as_ptr(), b, cj, &epi);
                        if let Some(sc) = scale {
                            for i in 0..m {
                                let row = std::slice::from_raw_parts_mut(job.out.add(i * job.ld + j), nv);
                                for (c, y) in row.iter_mut().enumerate() {
                                    *y = *y * sc[c] + bias.map_or(0.0, |b| b[c]);
                                }
                            }
                        }
                    }
                    j += nv;
                }
            });
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::super::gemv::{detect, run};
    use super::super::test_util::lcg;
    use super::*;

    /// Through `gemv::run` (its chunking, 1 and several threads' worth of chunks): against a
    /// float64 product with bias, over row counts, K not a multiple of any vector width, N not a
    /// multiple of the chunk; NaN and infinity reach exactly their rows.
    #[test]
    fn matches_a_float64_product_through_run() {
        // other tests switch the GEMM backend (this path needs the own kernel): not meanwhile
        let _g = crate::kernels::gemm::tests::LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let mut s = 5u64;
        for &(n, k) in &[(1usize, 64usize), (37, 96), (130, 257), (300, 896)] {
            let w: Vec<f32> = (0..n * k).map(|_| lcg(&mut s)).collect();
            let p = Packed::f32(n, k, &w).unwrap();
            let bias: Vec<f32> = (0..n).map(|_| lcg(&mut s)).collect();
            for m in [16usize, 17, 64, 130] {
                let mut x: Vec<f32> = (0..m * k).map(|_| lcg(&mut s)).collect();
                x[3 * k + 1] = f32::NAN;
                x[5 * k] = f32::INFINITY;
                let mut y = vec![f32::NAN; m * n];
                let acts: Vec<Act> = x.chunks(k).map(Act::Dense).collect();
                assert!(chunk_rows(&p, m, 2).is_some() || crate::kernels::gemm::backend() != "own");
                // SAFETY: one job over all of `y` (m rows of n)
                unsafe { run(&[Job { p: &p, acts: &acts, out: y.as_mut_ptr(), ld: n, bias: Some(&bias) }], detect()) };
                for i in 0..m {
                    for r in 0..n {
                        let got = y[i * n + r];
                        if i == 3 {
                            assert!(got.is_nan(), "row 3 holds a NaN");
                            continue;
                        }
                        let exact: f64 = (0..k).map(|c| w[r * k + c] as f64 * x[i * k + c] as f64).sum::<f64>() + bias[r] as f64;
                        if i == 5 {
                            assert!(got.is_infinite() || got.is_nan(), "row 5 holds an infinity: {got}");
                            continue;
                        }
                        let mag: f64 = (0..k).map(|c| (w[r * k + c] as f64 * x[i * k + c] as f64).abs()).sum::<f64>() + bias[r].abs() as f64;
                        assert!((got as f64 - exact).abs() <= 1e-5 * mag + 1e-7, "n={n} k={k} m={m} [{i},{r}]: {got} vs {exact}");
                    }
                }
            }
        }
    }

    /// Declines what it does not take: other formats, too few rows, rows not one matrix.
    #[test]
    fn declines_what_it_does_not_take() {
        let _g = crate::kernels::gemm::tests::LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let (n, k) = (8usize, 32usize);
        let w = vec![0.5f32; n * k];
        let p = Packed::f32(n, k, &w).unwrap();
        let wb = vec![0x3f00u16; n * k];
        let pb = Packed::bf16(n, k, &wb).unwrap();
        let x = vec![1f32; 40 * k];
        let mut y = vec![0f32; 40 * n];
        let out = y.as_mut_ptr();
        let dense: Vec<Act> = x.chunks(k).map(Act::Dense).collect();
        let job = |p, acts| Job { p, acts, out, ld: n, bias: None };
        assert!(!chunk(&job(&pb, &dense[..20]), 0, n, None));
        assert!(!chunk(&job(&p, &dense[..MIN_ROWS - 1]), 0, n, None));
        // rows 0, 1, 3, 4, ...: not rows of one [m, K] matrix
        let uneven: Vec<Act> = x.chunks(k).enumerate().filter(|(i, _)| *i != 2).map(|(_, r)| Act::Dense(r)).collect();
        assert!(!chunk(&job(&p, &uneven[..20]), 0, n, None));
        // every other row: one matrix with a row stride of 2K, taken
        let strided: Vec<Act> = x.chunks(k).step_by(2).map(Act::Dense).collect();
        assert!(chunk(&job(&p, &strided), 0, n, None));
        assert!(y[..20 * n].iter().all(|&v| v == 0.5 * k as f32), "sums of K products 0.5 * 1");
        assert!(chunk_rows(&p, MIN_ROWS - 1, 2).is_none());
        assert_eq!(chunk_rows(&pb, 20, 2).is_some(), crate::kernels::gemm::bf16::pairs_available() && pairs_enabled(), "bf16: the pair kernel's");
    }

    /// Activations packed once (`PackedActs`) give the same bits as each chunk packing its own:
    /// three jobs on one activation matrix (q / k / v) share one packed copy, a job on other
    /// activations gets its own, jobs this path does not take get none; chunks at any offset.
    #[test]
    fn packed_once_matches_packed_per_chunk() {
        let _g = crate::kernels::gemm::tests::LOCK.lock().unwrap_or_else(|e| e.into_inner());
        if crate::kernels::gemm::own::packed_b_layout(8).is_none() {
            return; // the own kernel is not the GEMM backend on this CPU
        }
        let mut s = 11u64;
        let (m, k) = (37usize, 300usize);
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut s)).collect();
        let x2: Vec<f32> = (0..m * k).map(|_| lcg(&mut s)).collect();
        let acts: Vec<Act> = x.chunks(k).map(Act::Dense).collect();
        let acts2: Vec<Act> = x2.chunks(k).map(Act::Dense).collect();
        let few: Vec<Act> = x.chunks(k).take(MIN_ROWS - 1).map(Act::Dense).collect();
        let ns = [64usize, 45, 45, 70, 64];
        let ws: Vec<Packed> = ns.iter().map(|&n| Packed::f32(n, k, &(0..n * k).map(|_| lcg(&mut s)).collect::<Vec<_>>()).unwrap()).collect();
        let bias: Vec<f32> = (0..70).map(|_| lcg(&mut s)).collect();
        let mut outs: Vec<Vec<f32>> = ns.iter().map(|&n| vec![0f32; m * n]).collect();
        let mut again = outs.clone();
        let act_of = [&acts, &acts, &acts, &acts2, &few];
        let jobs_for = |o: &mut Vec<Vec<f32>>| -> Vec<Job> {
            o.iter_mut()
                .enumerate()
                .map(|(i, y)| Job { p: &ws[i], acts: act_of[i], out: y.as_mut_ptr(), ld: ns[i], bias: (i == 3).then_some(&bias[..ns[i]]) })
                .collect()
        };
        let jobs = jobs_for(&mut outs);
        let packed = PackedActs::new(&jobs, |items, f| (0..items).for_each(f));
        let (a, b, c, d) = (packed.of(0).unwrap(), packed.of(1).unwrap(), packed.of(2).unwrap(), packed.of(3).unwrap());
        assert!(std::ptr::eq(a, b) && std::ptr::eq(a, c), "q / k / v share one packed matrix");
        assert!(!std::ptr::eq(a, d), "other activations, another packed matrix");
        assert!(packed.of(4).is_none(), "too few rows: not this path");
        for (i, j) in jobs.iter().enumerate().take(4) {
            // two chunks at an offset that is not a multiple of the panel width
            let cut = 13.min(ns[i]);
            assert!(chunk(j, 0, cut, packed.of(i)) && chunk(j, cut, ns[i] - cut, packed.of(i)));
        }
        let jobs2 = jobs_for(&mut again);
        for (i, j) in jobs2.iter().enumerate().take(4) {
            assert!(chunk(j, 0, ns[i], None));
        }
        for i in 0..4 {
            assert!(outs[i].iter().zip(&again[i]).all(|(p, q)| p.to_bits() == q.to_bits()), "job {i}: packed once != packed per chunk");
            assert!(outs[i].iter().any(|&v| v != 0.0));
        }
    }

    fn bf16_bits(v: f32) -> u16 {
        // round to nearest even (finite values; NaN kept quiet)
        let b = v.to_bits();
        if v.is_nan() {
            return ((b >> 16) | 0x40) as u16;
        }
        ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
    }

    fn from_bf16(h: u16) -> f32 {
        f32::from_bits((h as u32) << 16)
    }

    /// Runs one job of weights `p` (n × k, with a random bias) over m rows of random
    /// activations through `gemv::run` (its chunks and packed activations) and checks each
    /// output against `factor(r) · Σ_c weight(r, c) · x̂[i, c] + bias[r]` in float64, x̂ the
    /// activation rounded to bf16 where `rounded`, within float32 summation error; row 3 holds a
    /// NaN and row 5 an infinity, and their outputs are not finite.
    fn check_through_run(p: &Packed, m: usize, s: &mut u64, rounded: bool, weight: &dyn Fn(usize, usize) -> f64, factor: &dyn Fn(usize) -> f64) {
        let (n, k) = p.shape();
        let bias: Vec<f32> = (0..n).map(|_| lcg(s)).collect();
        let mut x: Vec<f32> = (0..m * k).map(|_| 3.0 * lcg(s)).collect();
        x[3 * k + k / 2] = f32::NAN;
        x[5 * k] = f32::INFINITY;
        let mut y = vec![f32::NAN; m * n];
        let acts: Vec<Act> = x.chunks(k).map(Act::Dense).collect();
        // SAFETY: one job over all of `y` (m rows of n)
        unsafe { run(&[Job { p, acts: &acts, out: y.as_mut_ptr(), ld: n, bias: Some(&bias) }], detect()) };
        for i in 0..m {
            for r in 0..n {
                let got = y[i * n + r];
                if i == 3 || i == 5 {
                    assert!(!got.is_finite(), "row {i} holds a NaN or an infinity: {got}");
                    continue;
                }
                let xr = |c: usize| if rounded { from_bf16(bf16_bits(x[i * k + c])) as f64 } else { x[i * k + c] as f64 };
                let exact = factor(r) * (0..k).map(|c| weight(r, c) * xr(c)).sum::<f64>() + bias[r] as f64;
                let mag = factor(r) * (0..k).map(|c| (weight(r, c) * xr(c)).abs()).sum::<f64>() + bias[r].abs() as f64;
                assert!((got as f64 - exact).abs() <= 1e-5 * mag + 1e-6, "rounded={rounded} n={n} k={k} m={m} [{i},{r}]: {got} vs {exact}");
            }
        }
    }

    /// Whether bf16 / int8 / int4 weights meet bf16-rounded activations here (the pair kernel).
    fn pairs_on() -> bool {
        pairs_enabled() && crate::kernels::gemm::bf16::pairs_available() && !super::super::tiles::available()
    }

    /// bf16 weights on the pair kernel (`check_through_run`: products of the bf16-rounded
    /// activations and the weights, over row counts, K even and not a multiple of the vector
    /// widths, N not a multiple of a panel). Where the CPU has no pair kernel (or AMX tiles take
    /// bf16), the job is declined and the panel path's exact-f32 result is checked instead.
    #[test]
    fn bf16_pairs_match_rounded_activations() {
        let _g = crate::kernels::gemm::tests::LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let mut s = 23u64;
        for &(n, k) in &[(1usize, 2usize), (37, 96), (130, 258), (70, 896)] {
            let wb: Vec<u16> = (0..n * k).map(|_| bf16_bits(lcg(&mut s))).collect();
            let p = Packed::bf16(n, k, &wb).unwrap();
            for m in [16usize, 17, 64, 131] {
                check_through_run(&p, m, &mut s, pairs_on(), &|r, c| from_bf16(wb[r * k + c]) as f64, &|_| 1.0);
            }
        }
    }

    /// The pair kernel declines odd K (a last value without its pair), too few rows and the
    /// switch turned off; `chunk` without packed activations declines bf16 (the panel path runs).
    #[test]
    fn bf16_pairs_decline() {
        let _g = crate::kernels::gemm::tests::LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let (n, k) = (8usize, 33usize);
        let p = Packed::bf16(n, k, &vec![0x3f00u16; n * k]).unwrap();
        let x = vec![1f32; 40 * k];
        let mut y = vec![0f32; 40 * n];
        let dense: Vec<Act> = x.chunks(k).map(Act::Dense).collect();
        let job = Job { p: &p, acts: &dense, out: y.as_mut_ptr(), ld: n, bias: None };
        assert!(matrix(&job).is_none(), "odd K");
        let p2 = Packed::bf16(n, 32, &vec![0x3f00u16; n * 32]).unwrap();
        let x2 = vec![1f32; 40 * 32];
        let dense2: Vec<Act> = x2.chunks(32).map(Act::Dense).collect();
        let job2 = Job { p: &p2, acts: &dense2, out: y.as_mut_ptr(), ld: n, bias: None };
        assert!(!chunk(&job2, 0, n, None), "bf16 needs its packed activations");
        let few = Job { p: &p2, acts: &dense2[..MIN_ROWS - 1], out: y.as_mut_ptr(), ld: n, bias: None };
        assert!(matrix(&few).is_none());
        let was = pairs_enabled();
        set_pairs_enabled(false);
        assert!(matrix(&job2).is_none() && chunk_rows(&p2, 40, 2).is_none(), "switched off");
        set_pairs_enabled(was);
        if crate::kernels::gemm::bf16::pairs_available() {
            assert!(matrix(&job2).is_some() && chunk_rows(&p2, 40, 2).is_some());
        }
    }

    /// int8 weights on the pair kernel (widened to bf16 `q`, exact): the row's scale times the
    /// sum of `q` by the bf16-rounded activations, plus the bias (`check_through_run`).
    #[test]
    fn int8_pairs_match_rounded_activations() {
        let _g = crate::kernels::gemm::tests::LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let mut s = 31u64;
        for &(n, k) in &[(5usize, 2usize), (37, 96), (70, 258), (33, 896)] {
            let q: Vec<i8> = (0..n * k).map(|_| (lcg(&mut s) * 254.0) as i8).collect();
            let scale: Vec<f32> = (0..n).map(|_| 0.01 + lcg(&mut s).abs() * 0.02).collect();
            let p = Packed::int8(n, k, &q, &scale).unwrap();
            for m in [16usize, 45, 131] {
                check_through_run(&p, m, &mut s, pairs_on(), &|r, c| q[r * k + c] as f64, &|r| scale[r] as f64);
            }
        }
    }

    /// int4 weights on the pair kernel: each value dequantized as `Packed::rows` does, rounded
    /// to bf16, against the bf16-rounded activations (`check_through_run`). Elsewhere int4
    /// meets int8-quantized activations on the integer kernel (`qgemm`'s tests).
    #[test]
    fn int4_pairs_match_rounded_weights_and_activations() {
        let _g = crate::kernels::gemm::tests::LOCK.lock().unwrap_or_else(|e| e.into_inner());
        if !pairs_on() {
            return;
        }
        let mut s = 41u64;
        for &(n, k, group) in &[(8usize, 32usize, 32usize), (40, 96, 32), (64, 256, 64)] {
            let nibbles: Vec<u8> = (0..n * k / 2).map(|_| ((lcg(&mut s) + 0.5) * 255.0) as u8).collect();
            // float16-valued scales and zeros (what the layout requires)
            let scale: Vec<f32> = (0..n * (k / group)).map(|i| (1.0 + (i % 16) as f32 / 16.0) / 64.0).collect();
            let zero: Vec<f32> = (0..n * (k / group)).map(|i| (i % 8) as f32 / 32.0 - 0.125).collect();
            let p = Packed::int4(n, k, group, &nibbles, &scale, &zero).unwrap();
            let mut rows = vec![0f32; n * k];
            p.rows(&(0..n).collect::<Vec<_>>(), &mut rows).unwrap();
            for m in [16usize, 33] {
                check_through_run(&p, m, &mut s, true, &|r, c| from_bf16(bf16_bits(rows[r * k + c])) as f64, &|_| 1.0);
            }
        }
    }
}
