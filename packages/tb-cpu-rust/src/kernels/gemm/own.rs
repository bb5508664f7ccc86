//! Our own packed, cache-blocked single-precision GEMM for x86-64 with AVX-512 or AVX2+FMA,
//! with the epilogue (bias, activations, residual add) applied per output tile while it is
//! still in L1.
//!
//! Why an own kernel: the `gemm` crate only uses AVX-512 with its `nightly` feature and
//! `matrixmultiply` has no AVX-512 kernel; on AVX2 both pack every operand whatever its shape
//! and split threads statically. Here the micro-kernel is per ISA (`Isa`: 12×32 in zmm
//! registers, 6×16 in ymm registers) and one driver chooses the loop order by shape:
//!
//! - few rows (m ≤ `SMALL_M`, the Linear layers of small batches): tasks split the columns;
//!   A is packed once per call (in parallel, before the tasks). A row-major B (`x @ W`) is read
//!   in place by the micro-kernels (`Isa::kernel_b_rows`: each panel feeds only m / MR tiles,
//!   too few to pay for copying it; packing was a quarter of 64x784x512), except when its rows
//!   are a multiple of 4 KiB apart (they would share a few L1 sets). Otherwise each task packs
//!   each NR-column panel of B just before the micro-kernels use it (so it is in L1 for all of
//!   them). Every element of B is read from memory once and no B-sized buffer is written.
//! - many rows: B is packed once per call, in parallel, into NR-column panels for every
//!   KC-deep slice of k (Goto/BLIS); tasks are blocks of MC rows, each packing its A block
//!   into MR-row panels.
//!
//! Tasks outnumber threads, so a core that is busy elsewhere takes fewer of them instead of
//! holding the others up at the join.

use crate::core::mem::{with_scratch, SPtr};
use crate::kernels::gemm::epilogue::RegEpi;
use crate::kernels::gemm::{Epi, Mat};
use std::cell::RefCell;

/// Largest MR×NR tile of any micro-kernel (edge tiles go through a buffer of this size).
const MAX_TILE: usize = 512;

/// One micro-kernel and the packing it needs.
pub(crate) trait Isa: Copy + Send + Sync + 'static {
    const MR: usize;
    const NR: usize;
    /// Default depth (KC) and row (MC) blocking.
    const KC: usize;
    const MC: usize;
    /// The ISA has `kernel_b_rows`.
    const B_ROWS: bool = false;
    /// C[r, j] (r < MR, j < NR; row stride `rs`, unit column stride) = [C +] alpha * sum_p
    /// A[p * MR + r] * B[p * NR + j].
    ///
    /// # Safety
    /// The packed panels hold `kc` steps; C is valid for the tile.
    unsafe fn kernel(kc: usize, a: *const f32, b: *const f32, c: *mut f32, rs: isize, alpha: f32, acc: bool);
    /// As `kernel` for the first `mv` rows only (0 < mv < MR; the packed A panel still has MR
    /// rows a step), so that a last tile of a few rows costs a few rows' work. False where the
    /// ISA has no such kernel: the caller then runs `kernel` into a buffer.
    ///
    /// # Safety
    /// As `kernel`, for rows 0..mv of C.
    unsafe fn kernel_rows(_mv: usize, _kc: usize, _a: *const f32, _b: *const f32, _c: *mut f32, _rs: isize, _alpha: f32, _acc: bool) -> bool {
        false
    }
    /// As `kernel_rows` for any 0 < mv ≤ MR, with B read in place instead of from a packed
    /// panel: step p's NR values are the contiguous floats at `b + p * bs` (a row-major B's row).
    /// False, touching nothing, where the ISA has no such kernel (`B_ROWS` false).
    ///
    /// # Safety
    /// As `kernel`; B valid for kc steps of NR floats `bs` apart.
    unsafe fn kernel_b_rows(_mv: usize, _kc: usize, _a: *const f32, _b: *const f32, _bs: usize, _c: *mut f32, _rs: isize, _alpha: f32, _acc: bool) -> bool {
        false
    }
    /// The ISA has `kernel_epi`.
    const EPI_IN_REGS: bool = false;
    /// As `kernel` (bs = NR: a packed panel; mv = MR) / `kernel_rows` / `kernel_b_rows` for
    /// rows 0..mv (0 < mv ≤ MR), with the epilogue `e` applied to the accumulators before they
    /// are stored (`e` built at row 0, this tile's first row `i`): C's tile is written once, instead of written and read back by the epilogue
    /// (12 rows of an NCHW output 4 KiB apart share an L1 set, so the read-back missed).
    /// False, touching nothing, where the ISA has none (`EPI_IN_REGS` false).
    ///
    /// # Safety
    /// As `kernel_b_rows`; the epilogue's pointers valid for the tile.
    #[allow(clippy::too_many_arguments)]
    unsafe fn kernel_epi(_mv: usize, _kc: usize, _a: *const f32, _b: *const f32, _bs: usize, _c: *mut f32, _rs: isize, _alpha: f32, _acc: bool, _e: &RegEpi, _i: usize) -> bool {
        false
    }
    /// Packs depth p0..p0+kc, columns j0..j0+nv (nv ≤ NR) of a B whose columns are contiguous
    /// (rs == 1) into one NR-wide panel, zero-filling columns past nv.
    ///
    /// # Safety
    /// B must be valid there; `dst` holds kc * NR floats.
    unsafe fn pack_b_t(b: Mat, p0: usize, kc: usize, j0: usize, nv: usize, dst: *mut f32);
    /// `pack_b_rows` compiled for this ISA (its copies in full-width vectors, not SSE2's); the
    /// default is the baseline build.
    ///
    /// # Safety
    /// As `pack_b_rows`.
    unsafe fn pack_b_rows(b: Mat, p0: usize, kc: usize, g0: usize, g1: usize, n: usize, dst: *mut f32) {
        pack_b_rows::<Self>(b, p0, kc, g0, g1, n, dst)
    }
}

fn blocking<I: Isa>() -> (usize, usize) {
    static ENV: std::sync::OnceLock<(Option<usize>, Option<usize>)> = std::sync::OnceLock::new();
    let (kc, mc) = *ENV.get_or_init(|| {
        let get = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<usize>().ok());
        (get("TB_GEMM_KC"), get("TB_GEMM_MC"))
    });
    (kc.unwrap_or(I::KC).max(1), (mc.unwrap_or(I::MC) / I::MR * I::MR).max(I::MR))
}

thread_local! {
    static PACK_A: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static PACK_B: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static PANEL_B: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

pub fn available() -> bool {
    crate::core::isa::has_avx512() || crate::core::isa::has_avx2()
}

/// The instruction set the own kernel runs with on this CPU ("" when it is not available).
pub fn isa_name() -> &'static str {
    if crate::core::isa::has_avx512() {
        "avx512"
    } else if crate::core::isa::has_avx2() {
        "avx2"
    } else {
        ""
    }
}

/// The few-rows path packs this many NR-column panels of B at a time: with B row-major, a
/// panel is one short piece of each of kc rows a page apart, which the caches can hold only a
/// few sets of (every piece maps to the same L1 set); a group reads runs of PANEL_GROUP cache
/// lines instead.
const PANEL_GROUP: usize = 4;
/// Up to this many rows, the driver packs B panel by panel (see the module comment).
const SMALL_M: usize = 256;
/// Floats of packed A the few-rows path holds at once (4 MiB).
const A_SCRATCH: usize = 1 << 20;

/// c = [c +] alpha * a @ b, then the epilogue, for a m×n×k product (k > 0).
///
/// # Safety
/// As `gemm::sgemm`; `available()` must be true.
pub unsafe fn sgemm(m: usize, n: usize, k: usize, a: Mat, b: Mat, c: Mat, alpha: f32, accumulate: bool, threads: usize, epi: &Epi) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::core::isa::has_avx512() {
            return drive::<x86::Avx512>(m, n, k, a, b, c, alpha, accumulate, threads, epi);
        }
        if crate::core::isa::has_avx2() {
            return drive::<x86::Avx2>(m, n, k, a, b, c, alpha, accumulate, threads, epi);
        }
    }
    let _ = (m, n, k, a, b, c, alpha, accumulate, threads, epi);
    unreachable!("gemm_own::sgemm without available()")
}

/// Splits `0..n` into `parts` nearly equal contiguous ranges; returns the `t`-th.
fn part(n: usize, parts: usize, t: usize) -> (usize, usize) {
    (n * t / parts, n * (t + 1) / parts)
}

/// Runs `task(t)` for t in 0..tasks, on the thread pool (`par`) when there is more than one.
fn run_tasks(tasks: usize, task: impl Fn(usize) + Sync + Send) {
    if tasks > 1 {
        crate::core::par::for_each(tasks, task);
    } else if tasks == 1 {
        task(0);
    }
}

pub(crate) unsafe fn drive<I: Isa>(m: usize, n: usize, k: usize, a: Mat, b: Mat, c: Mat, alpha: f32, accumulate: bool, threads: usize, epi: &Epi) {
    let (kc_, mc_) = blocking::<I>();
    // k in equal slices of at most KC (784 = 4 × 196, not 3 × 256 + 16: a thin last slice
    // costs a whole pass over C and its packing for a few steps of k)
    let kc_ = k.div_ceil(k.div_ceil(kc_));
    let npan = n.div_ceil(I::NR);
    let mpan = m.div_ceil(I::MR);
    // below ~1M multiply-adds per thread the fork/join costs more than it saves
    let threads = threads.clamp(1, ((m * n * k) >> 20).max(1));
    if m <= SMALL_M {
        // tasks over column ranges, at least 4 panels each, a few per thread
        let tasks = if threads > 1 { (threads * 3).min(npan / 4).max(threads.min(npan)) } else { 1 };
        // A is packed once, before the column tasks (each used to pack all of it again): the
        // slice at depth p0 starts at (p0 - d0) * m_pad, its rows in MR-row panels. At most
        // A_SCRATCH floats at a time: a deep k is taken in groups of whole KC slices.
        let m_pad = mpan * I::MR;
        let group = (A_SCRATCH / (m_pad * kc_)).max(1) * kc_;
        // a row-major B is read in place when each of its panels feeds few row tiles (packing
        // it costs more than the tiles' reads of it save) and its rows are not a multiple of
        // 4 KiB apart (those would all fall into the same few L1 sets)
        let direct_b = I::B_ROWS && b.cs == 1 && b.rs > 0 && b.rs as usize != I::NR && !(b.rs as usize * 4).is_multiple_of(4096);
        let mut d0 = 0;
        while d0 < k {
            let d1 = (d0 + group).min(k);
            with_scratch(&PACK_A, m_pad * (d1 - d0), |pa_all| {
                let pap = SPtr(pa_all.as_mut_ptr());
                let groups = if tasks > 1 { (threads * 2).min(mpan) } else { 1 };
                let a_items = (d1 - d0).div_ceil(kc_) * groups;
                let pack = |t: usize| {
                    let (p0, (g0, g1)) = (d0 + (t / groups) * kc_, part(mpan, groups, t % groups));
                    let (r0, r1) = (g0 * I::MR, (g1 * I::MR).min(m));
                    if r0 < r1 {
                        let kc = kc_.min(d1 - p0);
                        pack_a::<I>(a, r0, r1 - r0, p0, kc, pap.get().add((p0 - d0) * m_pad + r0 * kc));
                    }
                };
                if tasks > 1 && m * (d1 - d0) >= 1 << 15 {
                    run_tasks(a_items, pack);
                } else {
                    (0..a_items).for_each(pack);
                }
                run_tasks(tasks, |t| {
                    let (j0, j1) = part(npan, tasks, t);
                    if j0 == j1 {
                        return;
                    }
                    with_scratch(&PANEL_B, kc_.min(k) * I::NR * PANEL_GROUP, |pb| {
                        let pb = pb.as_mut_ptr();
                        let mut p0 = d0;
                        while p0 < d1 {
                            let kc = kc_.min(d1 - p0);
                            let pa = pap.get().add((p0 - d0) * m_pad) as *const f32;
                            let mut g0 = j0;
                            while g0 < j1 {
                                let g1 = (g0 + PANEL_GROUP).min(j1);
                                let panel = |jp: usize| pb.add((jp - g0) * kc * I::NR);
                                if direct_b {
                                    // full panels read in place, a partial last one packed
                                    for jp in g0..g1 {
                                        let j = jp * I::NR;
                                        if j + I::NR <= n {
                                            let src = b.p.0.offset(p0 as isize * b.rs + j as isize);
                                            tiles_b::<I>(0, m, jp, n, kc, pa, src, b.rs as usize, c, alpha, accumulate || p0 > 0, p0 + kc >= k, epi);
                                        } else {
                                            pack_b::<I>(b, p0, kc, j, n, panel(jp));
                                            tiles::<I>(0, m, jp, n, kc, pa, panel(jp), c, alpha, accumulate || p0 > 0, p0 + kc >= k, epi);
                                        }
                                    }
                                    g0 = g1;
                                    continue;
                                }
                                if b.cs == 1 {
                                    I::pack_b_rows(b, p0, kc, g0, g1, n, panel(g0));
                                } else {
                                    for jp in g0..g1 {
                                        pack_b::<I>(b, p0, kc, jp * I::NR, n, panel(jp));
                                    }
                                }
                                for jp in g0..g1 {
                                    tiles::<I>(0, m, jp, n, kc, pa, panel(jp), c, alpha, accumulate || p0 > 0, p0 + kc >= k, epi);
                                }
                                g0 = g1;
                            }
                            p0 += kc;
                        }
                    })
                });
            });
            d0 = d1;
        }
        return;
    }
    let n_pad = npan * I::NR;
    let nblocks = k.div_ceil(kc_);
    with_scratch(&PACK_B, k * n_pad, |pb| {
        let pbp = SPtr(pb.as_mut_ptr());
        let panel = move |p0: usize, jp: usize| pbp.get().add(p0 * n_pad + jp * kc_.min(k - p0) * I::NR);
        let items = nblocks * npan;
        let ptasks = if threads > 1 { (threads * 4).min(items) } else { 1 };
        run_tasks(ptasks, |t| {
            let (lo, hi) = part(items, ptasks, t);
            for i in lo..hi {
                let (q, jp) = (i / npan, i % npan);
                let p0 = q * kc_;
                pack_b::<I>(b, p0, kc_.min(k - p0), jp * I::NR, n, panel(p0, jp));
            }
        });
        let rblocks = m.div_ceil(mc_);
        let tasks = if threads > 1 { rblocks } else { 1 };
        run_tasks(tasks, |t| {
            let (b0, b1) = part(rblocks, tasks, t);
            with_scratch(&PACK_A, mc_ * kc_.min(k), |pa| {
                for blk in b0..b1 {
                    let (r0, r1) = (blk * mc_, ((blk + 1) * mc_).min(m));
                    let mut p0 = 0;
                    while p0 < k {
                        let kc = kc_.min(k - p0);
                        pack_a::<I>(a, r0, r1 - r0, p0, kc, pa.as_mut_ptr());
                        for jp in 0..npan {
                            tiles::<I>(r0, r1, jp, n, kc, pa.as_ptr(), panel(p0, jp), c, alpha, accumulate || p0 > 0, p0 + kc >= k, epi);
                        }
                        p0 += kc;
                    }
                }
            })
        });
    });
}

/// How a caller lays out a B it packs itself for `sgemm_packed_ab` (None: the own kernel is not
/// the GEMM backend on this CPU): the panel width NR and the depth of each slice of k.
pub fn packed_b_layout(k: usize) -> Option<(usize, usize)> {
    fn of<I: Isa>(k: usize) -> (usize, usize) {
        packed_layout::<I>(k)
    }
    if crate::kernels::gemm::backend() != "own" || k == 0 {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if crate::core::isa::has_avx512() {
            return Some(of::<x86::Avx512>(k));
        }
        if crate::core::isa::has_avx2() {
            return Some(of::<x86::Avx2>(k));
        }
    }
    None
}

/// `packed_b_layout` for the micro-kernel `I` (the bfloat16 pair kernel's, say: k counted in
/// pairs): (NR, the depth of each slice of k).
pub(crate) fn packed_layout<I: Isa>(k: usize) -> (usize, usize) {
    let kc = blocking::<I>().0;
    (I::NR, k.div_ceil(k.div_ceil(kc)))
}

/// Floats `pack_a_slices` writes for an m × k A (0 where `packed_b_layout` is None).
pub fn packed_a_len(m: usize, k: usize) -> usize {
    match packed_b_layout(k) {
        #[cfg(target_arch = "x86_64")]
        Some(_) => {
            let mr = if crate::core::isa::has_avx512() { <x86::Avx512 as Isa>::MR } else { <x86::Avx2 as Isa>::MR };
            m.div_ceil(mr) * mr * k
        }
        _ => 0,
    }
}

/// Packs all of A (m × k) for `sgemm_packed_ab`: each KC-deep slice of k (`packed_b_layout(k).1`
/// deep) in MR-row panels, the slice at depth p0 starting at `p0 * m_pad`. A convolution packs
/// its weights once this way for all its GEMMs instead of once per image and chunk.
///
/// # Safety
/// A valid for m × k; `dst` holds `packed_a_len(m, k)` floats; `packed_b_layout(k)` is Some.
pub unsafe fn pack_a_slices(a: Mat, m: usize, k: usize, dst: *mut f32) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::core::isa::has_avx512() {
            return pack_a_slices_for::<x86::Avx512>(a, m, k, dst);
        }
        if crate::core::isa::has_avx2() {
            return pack_a_slices_for::<x86::Avx2>(a, m, k, dst);
        }
    }
    let _ = (a, m, k, dst);
    unreachable!("pack_a_slices without packed_b_layout()")
}

/// `pack_a_slices` for the micro-kernel `I`; `dst` holds `m.div_ceil(I::MR) * I::MR * k` elements.
///
/// # Safety
/// As `pack_a_slices`.
pub(crate) unsafe fn pack_a_slices_for<I: Isa>(a: Mat, m: usize, k: usize, dst: *mut f32) {
    let kc_ = k.div_ceil(k.div_ceil(blocking::<I>().0));
    let m_pad = m.div_ceil(I::MR) * I::MR;
    let mut p0 = 0;
    while p0 < k {
        let kc = kc_.min(k - p0);
        pack_a::<I>(a, 0, m, p0, kc, dst.add(p0 * m_pad));
        p0 += kc;
    }
}

/// How many KC-deep slices `pack_a_slices` writes for depth k (`pack_a_slice` packs one).
pub fn a_slices(k: usize) -> usize {
    packed_b_layout(k).map_or(0, |(_, kc)| k.div_ceil(kc))
}

/// Slice `s` (< `a_slices(k)`) of `pack_a_slices(a, m, k, dst)`, written where that call writes
/// it: callers pack the slices of one A on several threads.
///
/// # Safety
/// As `pack_a_slices`.
pub unsafe fn pack_a_slice(a: Mat, m: usize, k: usize, s: usize, dst: *mut f32) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::core::isa::has_avx512() {
            return pack_a_slice_for::<x86::Avx512>(a, m, k, s, dst);
        }
        if crate::core::isa::has_avx2() {
            return pack_a_slice_for::<x86::Avx2>(a, m, k, s, dst);
        }
    }
    let _ = (a, m, k, s, dst);
    unreachable!("pack_a_slice without packed_b_layout()")
}

/// `pack_a_slice` for the micro-kernel `I` (the bfloat16 pair kernel's, say: k counted in pairs).
///
/// # Safety
/// As `pack_a_slice`; `dst` holds `packed_a_len_for::<I>(m, k)` elements.
pub(crate) unsafe fn pack_a_slice_for<I: Isa>(a: Mat, m: usize, k: usize, s: usize, dst: *mut f32) {
    let kc_ = k.div_ceil(k.div_ceil(blocking::<I>().0));
    let m_pad = m.div_ceil(I::MR) * I::MR;
    let p0 = s * kc_;
    if p0 < k {
        pack_a::<I>(a, 0, m, p0, kc_.min(k - p0), dst.add(p0 * m_pad));
    }
}

/// c = A @ B, then the epilogue, single-threaded, A packed by the caller (`pack_a_slices` /
/// `pack_a_slice`) and B (k × n, any strides) packed here one NR-column panel at a time, just
/// before that panel's tiles read it from L1. For callers that split one product's columns into
/// chunks on several threads: A is packed once for all of them instead of once per chunk.
///
/// # Safety
/// As `sgemm`; `pa` holds A packed by `pack_a_slices(a, m, k, ..)`; `packed_b_layout(k)` is Some.
pub unsafe fn sgemm_packed_a(m: usize, n: usize, k: usize, pa: *const f32, b: Mat, c: Mat, epi: &Epi) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::core::isa::has_avx512() {
            return drive_packed_a::<x86::Avx512>(m, n, k, pa, b, c, epi);
        }
        if crate::core::isa::has_avx2() {
            return drive_packed_a::<x86::Avx2>(m, n, k, pa, b, c, epi);
        }
    }
    let _ = (m, n, k, pa, b, c, epi);
    unreachable!("sgemm_packed_a without packed_b_layout()")
}

/// `a_slices` for the micro-kernel `I`.
pub(crate) fn a_slices_for<I: Isa>(k: usize) -> usize {
    if k == 0 {
        return 0;
    }
    k.div_ceil(k.div_ceil(k.div_ceil(blocking::<I>().0)))
}

/// `packed_a_len` for the micro-kernel `I`.
pub(crate) fn packed_a_len_for<I: Isa>(m: usize, k: usize) -> usize {
    m.div_ceil(I::MR) * I::MR * k
}

/// `sgemm_packed_a` on the micro-kernel `I`, A packed by `pack_a_slice_for::<I>`.
///
/// # Safety
/// As `sgemm_packed_a`.
pub(crate) unsafe fn drive_packed_a<I: Isa>(m: usize, n: usize, k: usize, pa: *const f32, b: Mat, c: Mat, epi: &Epi) {
    if m == 0 || n == 0 {
        return;
    }
    let kc_ = k.div_ceil(k.div_ceil(blocking::<I>().0));
    let npan = n.div_ceil(I::NR);
    let m_pad = m.div_ceil(I::MR) * I::MR;
    with_scratch(&PANEL_B, kc_.min(k) * I::NR, |panel| {
        let panel = panel.as_mut_ptr();
        // slices outer: A's slice stays in L2 for every panel; C is read back once per slice
        let mut p0 = 0;
        while p0 < k {
            let kc = kc_.min(k - p0);
            for jp in 0..npan {
                pack_b::<I>(b, p0, kc, jp * I::NR, n, panel);
                tiles::<I>(0, m, jp, n, kc, pa.add(p0 * m_pad), panel, c, 1.0, p0 > 0, p0 + kc >= k, epi);
            }
            p0 += kc;
        }
    });
}

/// c = A @ B, then the epilogue, single-threaded, with both operands packed by the caller: A by
/// `pack_a_slices`, B (k × n) as `packed_b_layout(k)` says: slices of kc rows of k one after
/// another, each slice NR-column panels of kc × NR floats (columns past n zero), so slice p0
/// starts at `p0 * npanels * NR` and its panel jp at `jp * kc * NR` within it. (A convolution
/// packs its weights once and writes its im2col that way: no second copy of either.)
///
/// # Safety
/// As `sgemm`; `pa` holds A packed by `pack_a_slices(a, m, k, ..)`, `pb` k × n.div_ceil(NR) × NR
/// floats; `packed_b_layout(k)` is Some.
pub unsafe fn sgemm_packed_ab(m: usize, n: usize, k: usize, pa: *const f32, pb: *const f32, c: Mat, epi: &Epi) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::core::isa::has_avx512() {
            return drive_packed_ab::<x86::Avx512>(m, n, k, pa, pb, c, 1.0, epi);
        }
        if crate::core::isa::has_avx2() {
            return drive_packed_ab::<x86::Avx2>(m, n, k, pa, pb, c, 1.0, epi);
        }
    }
    let _ = (m, n, k, pa, pb, c, epi);
    unreachable!("sgemm_packed_ab without packed_b_layout()")
}

/// `sgemm_packed_ab` on the micro-kernel `I`, both operands packed for it (`pack_a_slices_for`,
/// B as `packed_layout::<I>(k)` says), the product scaled by `alpha` before the epilogue.
///
/// # Safety
/// As `sgemm_packed_ab`.
pub(crate) unsafe fn drive_packed_ab<I: Isa>(m: usize, n: usize, k: usize, pa: *const f32, pb: *const f32, c: Mat, alpha: f32, epi: &Epi) {
    if m == 0 || n == 0 {
        return;
    }
    let kc_ = k.div_ceil(k.div_ceil(blocking::<I>().0));
    let npan = n.div_ceil(I::NR);
    let m_pad = m.div_ceil(I::MR) * I::MR;
    let mut p0 = 0;
    while p0 < k {
        let kc = kc_.min(k - p0);
        let slice = pb.add(p0 * npan * I::NR);
        for jp in 0..npan {
            tiles::<I>(0, m, jp, n, kc, pa.add(p0 * m_pad), slice.add(jp * kc * I::NR), c, alpha, p0 > 0, p0 + kc >= k, epi);
        }
        p0 += kc;
    }
}

/// All MR-row tiles of rows r0..r1 against column panel `jp`: `pa` holds those rows packed
/// (panel of row r0 first), `pb` the panel. `last` applies the epilogue.
#[inline(always)]
unsafe fn tiles<I: Isa>(
    r0: usize, r1: usize, jp: usize, n: usize, kc: usize, pa: *const f32, pb: *const f32, c: Mat, alpha: f32, acc: bool, last: bool,
    epi: &Epi,
) {
    tiles_b::<I>(r0, r1, jp, n, kc, pa, pb, I::NR, c, alpha, acc, last, epi)
}

/// `tiles` with B's steps `bs` floats apart: a packed panel (bs = NR) or, for a full-width
/// panel only, the rows of a row-major B read in place (`Isa::kernel_b_rows`).
#[inline(always)]
unsafe fn tiles_b<I: Isa>(
    r0: usize, r1: usize, jp: usize, n: usize, kc: usize, pa: *const f32, pb: *const f32, bs: usize, c: Mat, alpha: f32, acc: bool,
    last: bool, epi: &Epi,
) {
    let j = jp * I::NR;
    let nv = I::NR.min(n - j);
    let packed = bs == I::NR;
    // the epilogue in the micro-kernel's registers where it has that form (built once per
    // panel, at row 0: a copy per tile cost a memcpy call each)
    let reg = if I::EPI_IN_REGS && last && !epi.is_empty() && nv == I::NR && c.cs == 1 { epi.in_registers(0, j) } else { None };
    let mut i = r0;
    while i < r1 {
        let mv = I::MR.min(r1 - i);
        let ap = pa.add((i - r0) * kc);
        let cp = c.p.0.offset(i as isize * c.rs + j as isize * c.cs);
        // full-width tile with contiguous rows: accumulators go straight into C (a tile of
        // fewer rows where the ISA has a kernel for them)
        let direct = nv == I::NR
            && c.cs == 1
            && if let Some(e) = reg.as_ref() {
                I::kernel_epi(mv, kc, ap, pb, bs, cp, c.rs, alpha, acc, e, i)
            } else if !packed {
                I::kernel_b_rows(mv, kc, ap, pb, bs, cp, c.rs, alpha, acc)
            } else if mv == I::MR {
                I::kernel(kc, ap, pb, cp, c.rs, alpha, acc);
                true
            } else {
                I::kernel_rows(mv, kc, ap, pb, cp, c.rs, alpha, acc)
            };
        if direct {
            if last && !epi.is_empty() && reg.is_none() {
                for r in 0..mv {
                    let row = std::slice::from_raw_parts_mut(cp.offset(r as isize * c.rs), I::NR);
                    epi_row(epi, row, i + r, j);
                }
            }
        } else {
            // only the tile's mv rows where the ISA has a kernel for them (a partial last
            // tile of a narrow product would otherwise cost a whole one)
            let mut tile = [0f32; MAX_TILE];
            let t = tile.as_mut_ptr();
            if !packed {
                I::kernel_b_rows(mv, kc, ap, pb, bs, t, I::NR as isize, 1.0, false);
            } else if mv == I::MR || !I::kernel_rows(mv, kc, ap, pb, t, I::NR as isize, 1.0, false) {
                I::kernel(kc, ap, pb, t, I::NR as isize, 1.0, false);
            }
            store_tile(&tile[..I::MR * I::NR], I::NR, c, i, j, mv, nv, alpha, acc, if last { Some(epi) } else { None });
        }
        i += I::MR;
    }
}

/// Packs rows i0..i0+mc, depth p0..p0+kc of A into MR-row panels (zero rows past the end).
#[inline(always)]
unsafe fn pack_a<I: Isa>(a: Mat, i0: usize, mc: usize, p0: usize, kc: usize, dst: *mut f32) {
    let mr = I::MR;
    let mut ir = 0;
    while ir < mc {
        let mv = mr.min(mc - ir);
        let d = dst.add(ir * kc);
        let base = a.p.0.offset((i0 + ir) as isize * a.rs + p0 as isize * a.cs);
        if a.rs == 1 && mv == mr {
            // column-major A (a transposed operand): each step of k is MR contiguous floats
            for p in 0..kc {
                std::ptr::copy_nonoverlapping(base.offset(p as isize * a.cs), d.add(p * mr), mr);
            }
        } else if a.cs == 1 {
            let mut rows = [base; 16];
            for r in 0..mr {
                rows[r] = if r < mv { base.offset(r as isize * a.rs) } else { std::ptr::null_mut() };
            }
            if mv == mr {
                for p in 0..kc {
                    for r in 0..mr {
                        *d.add(p * mr + r) = *rows[r].add(p);
                    }
                }
            } else {
                for p in 0..kc {
                    for r in 0..mr {
                        *d.add(p * mr + r) = if r < mv { *rows[r].add(p) } else { 0.0 };
                    }
                }
            }
        } else {
            for p in 0..kc {
                let src = base.offset(p as isize * a.cs);
                for r in 0..mr {
                    *d.add(p * mr + r) = if r < mv { *src.offset(r as isize * a.rs) } else { 0.0 };
                }
            }
        }
        ir += mr;
    }
}

/// Packs depth p0..p0+kc, columns j0..j0+NR of B into one panel (zero columns past n).
#[inline(always)]
unsafe fn pack_b<I: Isa>(b: Mat, p0: usize, kc: usize, j0: usize, n: usize, dst: *mut f32) {
    let nr = I::NR;
    let nv = nr.min(n - j0);
    if b.cs == 1 {
        I::pack_b_rows(b, p0, kc, j0 / nr, j0 / nr + 1, n, dst);
    } else if b.rs == 1 {
        // transposed weights (linear): each column of B is contiguous along k
        I::pack_b_t(b, p0, kc, j0, nv, dst);
    } else {
        for j in 0..nr {
            if j < nv {
                let src = b.p.0.offset((j0 + j) as isize * b.cs + p0 as isize * b.rs);
                for p in 0..kc {
                    *dst.add(p * nr + j) = *src.offset(p as isize * b.rs);
                }
            } else {
                for p in 0..kc {
                    *dst.add(p * nr + j) = 0.0;
                }
            }
        }
    }
}

/// Packs depth p0..p0+kc of the column panels g0..g1 of a row-major B (cs == 1) into
/// consecutive NR-wide panels of kc rows each (zero columns past n), reading each row of B
/// once across the group.
#[inline(always)]
pub(crate) unsafe fn pack_b_rows<I: Isa>(b: Mat, p0: usize, kc: usize, g0: usize, g1: usize, n: usize, dst: *mut f32) {
    let nr = I::NR;
    let (c0, c1) = (g0 * nr, (g1 * nr).min(n));
    // rows a few steps ahead are requested while this one is copied, so that many of the
    // (page-apart) misses are in flight at once
    const AHEAD: usize = 8;
    for p in 0..kc {
        let src = b.p.0.offset((p0 + p) as isize * b.rs + c0 as isize);
        if p + AHEAD < kc {
            let next = src.wrapping_offset(AHEAD as isize * b.rs);
            let mut q = 0;
            while q < c1 - c0 {
                prefetch_l2(next.wrapping_add(q));
                q += 16;
            }
            prefetch_l2(next.wrapping_add(c1 - c0 - 1));
        }
        for jp in g0..g1 {
            let j = jp * nr;
            let nv = nr.min(n - j);
            let d = dst.add((jp - g0) * kc * nr + p * nr);
            let s = src.add(j - c0);
            if nv == nr {
                std::ptr::copy_nonoverlapping(s, d, nr);
            } else {
                std::ptr::copy_nonoverlapping(s, d, nv);
                for q in nv..nr {
                    *d.add(q) = 0.0;
                }
            }
        }
    }
}

/// Asks for the cache line holding `p` to be brought into L2 (a hint; never faults).
#[inline(always)]
fn prefetch_l2(p: *const f32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch is a hint that does not fault, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// `pack_b_t` without SIMD: the tails of the SIMD versions.
#[inline(always)]
unsafe fn pack_b_t_scalar(b: Mat, p_lo: usize, p_hi: usize, p0: usize, nr: usize, j0: usize, nv: usize, dst: *mut f32) {
    for p in p_lo..p_hi {
        for j in 0..nr {
            *dst.add(p * nr + j) = if j < nv { *b.p.0.offset((j0 + j) as isize * b.cs + (p0 + p) as isize) } else { 0.0 };
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn epi_row(epi: &Epi, row: &mut [f32], i: usize, j: usize) {
    epi.apply_row(row, i, j)
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn epi_row(epi: &Epi, row: &mut [f32], i: usize, j: usize) {
    epi.apply_row(row, i, j)
}

/// Writes the valid mv×nv part of a tile (row stride `ts`) into C (scaled by alpha, added to
/// C when `acc`) and runs the epilogue on it while it is in L1.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn store_tile(tile: &[f32], ts: usize, c: Mat, i: usize, j: usize, mv: usize, nv: usize, alpha: f32, acc: bool, epi: Option<&Epi>) {
    store_tile_generic(tile, ts, c, i, j, mv, nv, alpha, acc, epi)
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn store_tile(tile: &[f32], ts: usize, c: Mat, i: usize, j: usize, mv: usize, nv: usize, alpha: f32, acc: bool, epi: Option<&Epi>) {
    store_tile_generic(tile, ts, c, i, j, mv, nv, alpha, acc, epi)
}

#[inline(always)]
unsafe fn store_tile_generic(tile: &[f32], ts: usize, c: Mat, i: usize, j: usize, mv: usize, nv: usize, alpha: f32, acc: bool, epi: Option<&Epi>) {
    let mut row = [0f32; MAX_TILE];
    for r in 0..mv {
        let t = &tile[r * ts..r * ts + nv];
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

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::{pack_b_rows, pack_b_t_scalar, Isa};
    use crate::core::lanes::{Y8, Z16};
    use crate::kernels::gemm::epilogue::RegEpi;
    use crate::kernels::gemm::Mat;
    use std::arch::x86_64::*;

    /// MR512×32 tiles (12×32: 24 zmm accumulators).
    #[derive(Clone, Copy)]
    pub struct Avx512;

    /// 6×16 tiles in 12 ymm accumulators (two 8-wide B vectors and one broadcast of A per
    /// step: 15 of the 16 registers), the shape that keeps both FMA pipes of Zen / Haswell-class
    /// cores busy with loads to spare.
    #[derive(Clone, Copy)]
    pub struct Avx2;

    impl Isa for Avx512 {
        const MR: usize = MR512;
        const NR: usize = 32;
        const KC: usize = 256;
        const MC: usize = 96;
        const B_ROWS: bool = true;
        #[inline(always)]
        unsafe fn kernel(kc: usize, a: *const f32, b: *const f32, c: *mut f32, rs: isize, alpha: f32, acc: bool) {
            kernel_avx512::<MR512, false>(kc, a, b, 32, c, rs, alpha, acc, (std::ptr::null(), 0))
        }
        #[inline(always)]
        unsafe fn kernel_rows(mv: usize, kc: usize, a: *const f32, b: *const f32, c: *mut f32, rs: isize, alpha: f32, acc: bool) -> bool {
            // every row count below MR512 (the match is exhaustive up to the largest MR512 tried)
            match mv {
                1 => kernel_avx512::<1, false>(kc, a, b, 32, c, rs, alpha, acc, (std::ptr::null(), 0)),
                2 => kernel_avx512::<2, false>(kc, a, b, 32, c, rs, alpha, acc, (std::ptr::null(), 0)),
                3 => kernel_avx512::<3, false>(kc, a, b, 32, c, rs, alpha, acc, (std::ptr::null(), 0)),
                4 => kernel_avx512::<4, false>(kc, a, b, 32, c, rs, alpha, acc, (std::ptr::null(), 0)),
                5 => kernel_avx512::<5, false>(kc, a, b, 32, c, rs, alpha, acc, (std::ptr::null(), 0)),
                6 => kernel_avx512::<6, false>(kc, a, b, 32, c, rs, alpha, acc, (std::ptr::null(), 0)),
                7 => kernel_avx512::<7, false>(kc, a, b, 32, c, rs, alpha, acc, (std::ptr::null(), 0)),
                8 if MR512 > 8 => kernel_avx512::<8, false>(kc, a, b, 32, c, rs, alpha, acc, (std::ptr::null(), 0)),
                9 if MR512 > 9 => kernel_avx512::<9, false>(kc, a, b, 32, c, rs, alpha, acc, (std::ptr::null(), 0)),
                10 if MR512 > 10 => kernel_avx512::<10, false>(kc, a, b, 32, c, rs, alpha, acc, (std::ptr::null(), 0)),
                11 if MR512 > 11 => kernel_avx512::<11, false>(kc, a, b, 32, c, rs, alpha, acc, (std::ptr::null(), 0)),
                12 if MR512 > 12 => kernel_avx512::<12, false>(kc, a, b, 32, c, rs, alpha, acc, (std::ptr::null(), 0)),
                13 if MR512 > 13 => kernel_avx512::<13, false>(kc, a, b, 32, c, rs, alpha, acc, (std::ptr::null(), 0)),
                _ => return false,
            }
            true
        }
        #[inline(always)]
        unsafe fn kernel_b_rows(mv: usize, kc: usize, a: *const f32, b: *const f32, bs: usize, c: *mut f32, rs: isize, alpha: f32, acc: bool) -> bool {
            rows_avx512::<false>(mv, kc, a, b, bs, c, rs, alpha, acc, (std::ptr::null(), 0));
            true
        }
        const EPI_IN_REGS: bool = true;
        #[inline(always)]
        unsafe fn kernel_epi(mv: usize, kc: usize, a: *const f32, b: *const f32, bs: usize, c: *mut f32, rs: isize, alpha: f32, acc: bool, e: &RegEpi, i: usize) -> bool {
            rows_avx512::<true>(mv, kc, a, b, bs, c, rs, alpha, acc, (e, i));
            true
        }
        #[inline(always)]
        unsafe fn pack_b_t(b: Mat, p0: usize, kc: usize, j0: usize, nv: usize, dst: *mut f32) {
            pack_b_t_avx512(b, p0, kc, j0, nv, dst)
        }
        #[inline(always)]
        unsafe fn pack_b_rows(b: Mat, p0: usize, kc: usize, g0: usize, g1: usize, n: usize, dst: *mut f32) {
            pack_b_rows_avx512(b, p0, kc, g0, g1, n, dst)
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn pack_b_rows_avx512(b: Mat, p0: usize, kc: usize, g0: usize, g1: usize, n: usize, dst: *mut f32) {
        pack_b_rows::<Avx512>(b, p0, kc, g0, g1, n, dst)
    }

    impl Isa for Avx2 {
        const MR: usize = 6;
        const NR: usize = 16;
        const KC: usize = 256;
        const MC: usize = 96;
        const B_ROWS: bool = true;
        #[inline(always)]
        unsafe fn kernel(kc: usize, a: *const f32, b: *const f32, c: *mut f32, rs: isize, alpha: f32, acc: bool) {
            kernel_avx2::<6, false>(kc, a, b, 16, c, rs, alpha, acc, (std::ptr::null(), 0))
        }
        #[inline(always)]
        unsafe fn kernel_rows(mv: usize, kc: usize, a: *const f32, b: *const f32, c: *mut f32, rs: isize, alpha: f32, acc: bool) -> bool {
            match mv {
                1 => kernel_avx2::<1, false>(kc, a, b, 16, c, rs, alpha, acc, (std::ptr::null(), 0)),
                2 => kernel_avx2::<2, false>(kc, a, b, 16, c, rs, alpha, acc, (std::ptr::null(), 0)),
                3 => kernel_avx2::<3, false>(kc, a, b, 16, c, rs, alpha, acc, (std::ptr::null(), 0)),
                4 => kernel_avx2::<4, false>(kc, a, b, 16, c, rs, alpha, acc, (std::ptr::null(), 0)),
                5 => kernel_avx2::<5, false>(kc, a, b, 16, c, rs, alpha, acc, (std::ptr::null(), 0)),
                _ => return false,
            }
            true
        }
        #[inline(always)]
        unsafe fn kernel_b_rows(mv: usize, kc: usize, a: *const f32, b: *const f32, bs: usize, c: *mut f32, rs: isize, alpha: f32, acc: bool) -> bool {
            rows_avx2::<false>(mv, kc, a, b, bs, c, rs, alpha, acc, (std::ptr::null(), 0));
            true
        }
        const EPI_IN_REGS: bool = true;
        #[inline(always)]
        unsafe fn kernel_epi(mv: usize, kc: usize, a: *const f32, b: *const f32, bs: usize, c: *mut f32, rs: isize, alpha: f32, acc: bool, e: &RegEpi, i: usize) -> bool {
            rows_avx2::<true>(mv, kc, a, b, bs, c, rs, alpha, acc, (e, i));
            true
        }
        #[inline(always)]
        unsafe fn pack_b_t(b: Mat, p0: usize, kc: usize, j0: usize, nv: usize, dst: *mut f32) {
            pack_b_t_avx2(b, p0, kc, j0, nv, dst)
        }
        #[inline(always)]
        unsafe fn pack_b_rows(b: Mat, p0: usize, kc: usize, g0: usize, g1: usize, n: usize, dst: *mut f32) {
            pack_b_rows_avx2(b, p0, kc, g0, g1, n, dst)
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn pack_b_rows_avx2(b: Mat, p0: usize, kc: usize, g0: usize, g1: usize, n: usize, dst: *mut f32) {
        pack_b_rows::<Avx2>(b, p0, kc, g0, g1, n, dst)
    }

    /// `kernel_avx512` for rows 0..mv (1 ≤ mv; MR512 and above: the whole tile), B's steps `bs`
    /// apart, with the epilogue `e` in registers when `E` (`kernel_b_rows`, `kernel_epi`).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    unsafe fn rows_avx512<const E: bool>(mv: usize, kc: usize, a: *const f32, b: *const f32, bs: usize, c: *mut f32, rs: isize, alpha: f32, acc: bool, e: (*const RegEpi, usize)) {
        match mv {
            1 => kernel_avx512::<1, E>(kc, a, b, bs, c, rs, alpha, acc, e),
            2 => kernel_avx512::<2, E>(kc, a, b, bs, c, rs, alpha, acc, e),
            3 => kernel_avx512::<3, E>(kc, a, b, bs, c, rs, alpha, acc, e),
            4 => kernel_avx512::<4, E>(kc, a, b, bs, c, rs, alpha, acc, e),
            5 => kernel_avx512::<5, E>(kc, a, b, bs, c, rs, alpha, acc, e),
            6 => kernel_avx512::<6, E>(kc, a, b, bs, c, rs, alpha, acc, e),
            7 => kernel_avx512::<7, E>(kc, a, b, bs, c, rs, alpha, acc, e),
            8 => kernel_avx512::<8, E>(kc, a, b, bs, c, rs, alpha, acc, e),
            9 => kernel_avx512::<9, E>(kc, a, b, bs, c, rs, alpha, acc, e),
            10 => kernel_avx512::<10, E>(kc, a, b, bs, c, rs, alpha, acc, e),
            11 => kernel_avx512::<11, E>(kc, a, b, bs, c, rs, alpha, acc, e),
            _ => kernel_avx512::<MR512, E>(kc, a, b, bs, c, rs, alpha, acc, e),
        }
    }

    /// `rows_avx512` for the 6 × 16 AVX2 tile.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    unsafe fn rows_avx2<const E: bool>(mv: usize, kc: usize, a: *const f32, b: *const f32, bs: usize, c: *mut f32, rs: isize, alpha: f32, acc: bool, e: (*const RegEpi, usize)) {
        match mv {
            1 => kernel_avx2::<1, E>(kc, a, b, bs, c, rs, alpha, acc, e),
            2 => kernel_avx2::<2, E>(kc, a, b, bs, c, rs, alpha, acc, e),
            3 => kernel_avx2::<3, E>(kc, a, b, bs, c, rs, alpha, acc, e),
            4 => kernel_avx2::<4, E>(kc, a, b, bs, c, rs, alpha, acc, e),
            5 => kernel_avx2::<5, E>(kc, a, b, bs, c, rs, alpha, acc, e),
            _ => kernel_avx2::<6, E>(kc, a, b, bs, c, rs, alpha, acc, e),
        }
    }

    /// Rows of the AVX-512 tile: MR512 × 32 accumulators in 2 × MR512 zmm registers, two for
    /// the step's B vectors and one for A's broadcast value. 12 rows (24 accumulators) against
    /// the former 8: fewer B loads per FMA; measured ahead of 8 at 1024³ and 256³ (1 thread).
    pub(crate) const MR512: usize = 12;

    /// Rows 0..R of an MR512×32 tile (R = MR512: the whole tile); A's packed panel has MR512
    /// rows a step.
    #[target_feature(enable = "avx512f")]
    unsafe fn kernel_avx512<const R: usize, const E: bool>(kc: usize, a: *const f32, b: *const f32, bs: usize, cp: *mut f32, rs: isize, alpha: f32, acc: bool, e: (*const RegEpi, usize)) {
        const MR: usize = MR512;
        for r in 0..R {
            let row = cp.wrapping_offset(r as isize * rs) as *const i8;
            // 128 bytes: up to three lines when the row is not line-aligned
            _mm_prefetch::<_MM_HINT_T0>(row);
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(64));
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(127));
        }
        let mut c = [[_mm512_setzero_ps(); 2]; R];
        let (mut a, mut b) = (a, b);
        for _ in 0..kc {
            // B's and A's lines eight steps ahead (hints: past the panels' ends they are
            // harmless): 1024³ went 0.78 -> 0.99x MKL, 64x784x512 0.80 -> 0.96x (1 thread)
            _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(8 * bs) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(8 * bs + 16) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(a.wrapping_add(8 * MR) as *const i8);
            let b0 = _mm512_loadu_ps(b);
            let b1 = _mm512_loadu_ps(b.add(16));
            for r in 0..R {
                let av = _mm512_set1_ps(*a.add(r));
                c[r][0] = _mm512_fmadd_ps(av, b0, c[r][0]);
                c[r][1] = _mm512_fmadd_ps(av, b1, c[r][1]);
            }
            a = a.add(MR);
            b = b.add(bs);
        }
        let al = _mm512_set1_ps(alpha);
        for r in 0..R {
            let p = cp.offset(r as isize * rs);
            let (mut v0, mut v1) = if acc {
                (_mm512_fmadd_ps(c[r][0], al, _mm512_loadu_ps(p)), _mm512_fmadd_ps(c[r][1], al, _mm512_loadu_ps(p.add(16))))
            } else if alpha == 1.0 {
                (c[r][0], c[r][1])
            } else {
                (_mm512_mul_ps(c[r][0], al), _mm512_mul_ps(c[r][1], al))
            };
            if E {
                (v0, v1) = epi_avx512(&*e.0, e.1 + r, v0, v1);
            }
            _mm512_storeu_ps(p, v0);
            _mm512_storeu_ps(p.add(16), v1);
        }
    }

    /// Row r (32 columns in two vectors; r counted from the row `e` was built at) through the
    /// epilogue `e`, in registers (`RegEpi::apply`).
    #[inline(always)]
    unsafe fn epi_avx512(e: &RegEpi, r: usize, v0: __m512, v1: __m512) -> (__m512, __m512) {
        (e.apply(r, 0, 16, Z16(v0)).0, e.apply(r, 16, 16, Z16(v1)).0)
    }

    /// Rows 0..R of a 6×16 tile (R = 6: the whole tile); A's packed panel has 6 rows a step.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn kernel_avx2<const R: usize, const E: bool>(kc: usize, a: *const f32, b: *const f32, bs: usize, cp: *mut f32, rs: isize, alpha: f32, acc: bool, e: (*const RegEpi, usize)) {
        const MR: usize = 6;
        // the tile of C is read (acc) or written once the loop is done: its lines are
        // requested now so that the miss overlaps the loop instead of following it
        for r in 0..R {
            let row = cp.wrapping_offset(r as isize * rs) as *const i8;
            _mm_prefetch::<_MM_HINT_T0>(row);
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(63));
        }
        let mut c = [[_mm256_setzero_ps(); 2]; R];
        let (mut a, mut b) = (a, b);
        // unrolled by two so the loop overhead is paid every 24 FMAs
        let mut p = 0;
        while p + 2 <= kc {
            for u in 0..2 {
                let b0 = _mm256_loadu_ps(b.add(bs * u));
                let b1 = _mm256_loadu_ps(b.add(bs * u + 8));
                for r in 0..R {
                    let av = _mm256_broadcast_ss(&*a.add(MR * u + r));
                    c[r][0] = _mm256_fmadd_ps(av, b0, c[r][0]);
                    c[r][1] = _mm256_fmadd_ps(av, b1, c[r][1]);
                }
            }
            a = a.add(2 * MR);
            b = b.add(2 * bs);
            p += 2;
        }
        if p < kc {
            let b0 = _mm256_loadu_ps(b);
            let b1 = _mm256_loadu_ps(b.add(8));
            for r in 0..R {
                let av = _mm256_broadcast_ss(&*a.add(r));
                c[r][0] = _mm256_fmadd_ps(av, b0, c[r][0]);
                c[r][1] = _mm256_fmadd_ps(av, b1, c[r][1]);
            }
        }
        let al = _mm256_set1_ps(alpha);
        for r in 0..R {
            let p = cp.offset(r as isize * rs);
            let (mut v0, mut v1) = if acc {
                (_mm256_fmadd_ps(c[r][0], al, _mm256_loadu_ps(p)), _mm256_fmadd_ps(c[r][1], al, _mm256_loadu_ps(p.add(8))))
            } else if alpha == 1.0 {
                (c[r][0], c[r][1])
            } else {
                (_mm256_mul_ps(c[r][0], al), _mm256_mul_ps(c[r][1], al))
            };
            if E {
                (v0, v1) = epi_avx2(&*e.0, e.1 + r, v0, v1);
            }
            _mm256_storeu_ps(p, v0);
            _mm256_storeu_ps(p.add(8), v1);
        }
    }

    /// `epi_avx512` for a row of 16 columns in two ymm vectors.
    #[inline(always)]
    unsafe fn epi_avx2(e: &RegEpi, r: usize, v0: __m256, v1: __m256) -> (__m256, __m256) {
        (e.apply(r, 0, 8, Y8(v0)).0, e.apply(r, 8, 8, Y8(v1)).0)
    }

    /// Transposes 8×8 blocks in registers: column j of B (contiguous along k) becomes lane j
    /// of the panel's rows.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn pack_b_t_avx2(b: Mat, p0: usize, kc: usize, j0: usize, nv: usize, dst: *mut f32) {
        const NR: usize = 16;
        let col = |j: usize| b.p.0.offset((j0 + j) as isize * b.cs + p0 as isize) as *const f32;
        let full_p = kc / 8 * 8;
        for h in 0..NR / 8 {
            let mut pp = 0;
            while pp < full_p {
                let mut r = [_mm256_setzero_ps(); 8];
                for (i, ri) in r.iter_mut().enumerate() {
                    let j = h * 8 + i;
                    if j < nv {
                        *ri = _mm256_loadu_ps(col(j).add(pp));
                    }
                }
                let rows = crate::core::transpose::transpose_8x8(&r);
                for (q, v) in rows.iter().enumerate() {
                    _mm256_storeu_ps(dst.add((pp + q) * NR + h * 8), *v);
                }
                pp += 8;
            }
        }
        pack_b_t_scalar(b, full_p, kc, p0, NR, j0, nv, dst);
    }

    /// Transposes 16×16 blocks in registers.
    #[target_feature(enable = "avx512f")]
    unsafe fn pack_b_t_avx512(b: Mat, p0: usize, kc: usize, j0: usize, nv: usize, dst: *mut f32) {
        const NR: usize = 32;
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
        pack_b_t_scalar(b, full_p, kc, p0, NR, j0, nv, dst);
    }
}

#[cfg(test)]
mod tests {
    /// Runs `$check::<I>()` for each ISA this CPU has (AVX2 too on an AVX-512 machine).
    macro_rules! on_every_isa {
        ($check:ident) => {
            #[cfg(target_arch = "x86_64")]
            {
                if crate::core::isa::has_avx2() {
                    $check::<x86::Avx2>();
                }
                if crate::core::isa::has_avx512() {
                    $check::<x86::Avx512>();
                }
            }
        };
    }

    use super::*;
    use crate::core::mem::SPtr;

    fn naive(m: usize, n: usize, k: usize, a: Mat, b: Mat) -> Vec<f32> {
        let mut c = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0f64;
                for p in 0..k {
                    unsafe {
                        s += *a.p.0.offset(i as isize * a.rs + p as isize * a.cs) as f64
                            * *b.p.0.offset(p as isize * b.rs + j as isize * b.cs) as f64;
                    }
                }
                c[i * n + j] = s as f32;
            }
        }
        c
    }

    /// The epilogue applied in the micro-kernel's registers (`Isa::kernel_epi`) gives the same
    /// bits as the product stored plainly and then run through `Epi::apply_row`: row and
    /// column biases with beta ≠ 1, relu, clamp, a residual with its own row stride and
    /// alpha, NaN / ±inf in A, partial row tiles, several k slices, accumulate, both loop
    /// orders and a B read in place, on every ISA this CPU has.
    #[test]
    fn epilogue_in_registers_matches_the_row_epilogue() {
        on_every_isa!(check_epi);
    }

    #[allow(dead_code)]
    fn check_epi<I: Isa>() {
        use crate::core::math::unary::Un;
        use crate::kernels::gemm::EpiOp;
        let shapes = [(I::MR, I::NR, 8), (2 * I::MR + 5, 3 * I::NR, 40), (I::MR - 1, 2 * I::NR + 3, I::KC + 9), (SMALL_M + 7, 2 * I::NR, 33)];
        for &(m, n, k) in &shapes {
            let mut av: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 13.0).collect();
            av[k] = f32::NAN;
            av[3 * k + 1] = f32::INFINITY;
            av[4 * k + 2] = f32::NEG_INFINITY;
            let bv: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 11.0).collect();
            let row_b: Vec<f32> = (0..2 * m).map(|i| (i % 7) as f32 * 0.25 - 0.7).collect();
            let col_b: Vec<f32> = (0..n).map(|j| (j % 5) as f32 * 0.3 - 0.6).collect();
            let res_rs = n + 5;
            let res: Vec<f32> = (0..m * res_rs).map(|i| (i % 9) as f32 * 0.1 - 0.4).collect();
            let p = |v: &Vec<f32>| SPtr(v.as_ptr() as *mut f32);
            let a = Mat { p: p(&av), rs: k as isize, cs: 1 };
            // B read in place (rows n + 1 apart) and the packed path (rows a multiple of 4 KiB)
            let b_rows = Mat { p: p(&bv), rs: n as isize, cs: 1 };
            let b_cols = Mat { p: p(&bv), rs: 1, cs: k as isize };
            let epis = [
                Epi::new(Some((Mat { p: p(&row_b), rs: 2, cs: 0 }, 0.5)), [EpiOp::Un(Un::Relu)]),
                Epi::new(Some((Mat { p: p(&col_b), rs: 0, cs: 1 }, 1.0)), [EpiOp::Un(Un::Clamp(-0.5, 0.75))]),
                Epi::new(
                    Some((Mat { p: p(&col_b), rs: 0, cs: 1 }, -2.0)),
                    [EpiOp::Add(Mat { p: p(&res), rs: res_rs as isize, cs: 1 }, 2.0), EpiOp::Un(Un::Copy), EpiOp::Un(Un::Relu)],
                ),
                Epi::new(None, [EpiOp::Add(Mat { p: p(&res), rs: res_rs as isize, cs: 1 }, 1.0), EpiOp::Un(Un::Clamp(0.0, 6.0))]),
            ];
            for (ei, e) in epis.iter().enumerate() {
                assert!(unsafe { e.in_registers(0, 0) }.is_some());
                for b in [b_rows, b_cols] {
                    for (alpha, acc) in [(1.0, false), (0.5, true)] {
                        for threads in [1, 2] {
                            let ldc = n + 3;
                            let mut got = vec![0.25f32; m * ldc];
                            let mut want = vec![0.25f32; m * ldc];
                            unsafe {
                                drive::<I>(m, n, k, a, b, Mat { p: SPtr(got.as_mut_ptr()), rs: ldc as isize, cs: 1 }, alpha, acc, threads, e);
                                drive::<I>(m, n, k, a, b, Mat { p: SPtr(want.as_mut_ptr()), rs: ldc as isize, cs: 1 }, alpha, acc, threads, &Epi::default());
                                for i in 0..m {
                                    e.apply_row(&mut want[i * ldc..i * ldc + n], i, 0);
                                }
                            }
                            for i in 0..m {
                                for j in 0..ldc {
                                    let (g, w) = (got[i * ldc + j], want[i * ldc + j]);
                                    assert!(g.to_bits() == w.to_bits() || g.is_nan() && w.is_nan(), "{m}x{n}x{k} epi {ei} b.rs={} alpha {alpha} t{threads} ({i},{j}): {g} vs {w}", b.rs);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Every ISA's kernel, both loop orders (few and many rows), every operand layout, with
    /// edges in m, n and k around the tile and block sizes, against a float64 reference.
    #[test]
    fn own_kernels_match_naive_across_layouts_and_edges() {
        on_every_isa!(check);
    }

    /// `sgemm_packed_ab`'s layout, packed here by hand, on every ISA this CPU has (AVX2 too on
    /// an AVX-512 machine), k split into several slices, a partial last panel.
    #[test]
    fn packed_b_matches_naive() {
        on_every_isa!(check_packed);
    }

    #[allow(dead_code)]
    fn check_packed<I: Isa>() {
        for &(m, n, k) in &[(64usize, 3 * I::NR + 5, 2 * I::KC + 7), (I::MR + 3, I::NR, 9), (1, 1, 1)] {
            let av: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 13.0).collect();
            let bv: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 11.0).collect();
            let a = Mat { p: SPtr(av.as_ptr() as *mut f32), rs: k as isize, cs: 1 };
            let b = Mat { p: SPtr(bv.as_ptr() as *mut f32), rs: n as isize, cs: 1 };
            let want = naive(m, n, k, a, b);
            let kc_ = k.div_ceil(k.div_ceil(blocking::<I>().0));
            let npan = n.div_ceil(I::NR);
            let mut pb = vec![f32::NAN; k * npan * I::NR];
            for p in 0..k {
                let (slice, r) = (p / kc_, p % kc_);
                let kc = kc_.min(k - slice * kc_);
                for j in 0..npan * I::NR {
                    pb[slice * kc_ * npan * I::NR + (j / I::NR) * kc * I::NR + r * I::NR + j % I::NR] = if j < n { bv[p * n + j] } else { 0.0 };
                }
            }
            let mut pa = vec![f32::NAN; m.div_ceil(I::MR) * I::MR * k];
            let mut c = vec![0f32; m * n];
            unsafe {
                pack_a_slices_for::<I>(a, m, k, pa.as_mut_ptr());
                drive_packed_ab::<I>(m, n, k, pa.as_ptr(), pb.as_ptr(), Mat { p: SPtr(c.as_mut_ptr()), rs: n as isize, cs: 1 }, 1.0, &Epi::default())
            };
            for (i, (x, y)) in c.iter().zip(&want).enumerate() {
                assert!((x - y).abs() < 1e-3 * (1.0 + y.abs()), "{m}x{n}x{k} [{i}]: {x} vs {y}");
            }
        }
    }

    #[allow(dead_code)]
    fn check<I: Isa>() {
        let shapes = [
            (1usize, 1usize, 1usize),
            (I::MR, I::NR, 8),
            (I::MR + 1, I::NR - 1, 7),
            (5, 3 * I::NR + 5, 300),
            // last row tiles of 2 and 3 rows at full width (`kernel_rows`)
            (I::MR + 2, I::NR, 33),
            (2 * I::MR + 3, 2 * I::NR, 40),
            // several PANEL_GROUPs of column panels, the last group and panel partial
            (7, (2 * PANEL_GROUP + 1) * I::NR + 3, 270),
            (37, 29, 53),
            (SMALL_M, 40, 9),
            (SMALL_M + 1, 2 * I::NR + 3, 257),
            (300, 17, 520),
        ];
        for &(m, n, k) in &shapes {
            let av: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 13.0).collect();
            let bv: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 11.0).collect();
            let p = |v: &Vec<f32>| SPtr(v.as_ptr() as *mut f32);
            // row-major and column-major views of the same buffers (the matrices differ, the
            // reference is computed per layout)
            let a_layouts = [Mat { p: p(&av), rs: k as isize, cs: 1 }, Mat { p: p(&av), rs: 1, cs: m as isize }];
            let b_layouts = [Mat { p: p(&bv), rs: n as isize, cs: 1 }, Mat { p: p(&bv), rs: 1, cs: k as isize }];
            for (ai, &a) in a_layouts.iter().enumerate() {
                for &b in &b_layouts {
                    let want = naive(m, n, k, a, b);
                    for threads in [1, 2, 3] {
                        for acc in [false, true] {
                            // C with a padded row stride
                            let ldc = n + 3;
                            let mut c = vec![0.5f32; m * ldc];
                            unsafe {
                                drive::<I>(m, n, k, a, b, Mat { p: SPtr(c.as_mut_ptr()), rs: ldc as isize, cs: 1 }, 2.0, acc, threads, &Epi::default());
                            }
                            for i in 0..m {
                                for j in 0..n {
                                    let w = 2.0 * want[i * n + j] + if acc { 0.5 } else { 0.0 };
                                    let got = c[i * ldc + j];
                                    assert!((got - w).abs() < 1e-3 * (1.0 + w.abs()), "{m}x{n}x{k} a{ai} b.rs={} t{threads} acc={acc} ({i},{j}): {got} vs {w}", b.rs);
                                }
                                for j in n..ldc {
                                    assert_eq!(c[i * ldc + j], 0.5, "padding written");
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
