//! GEMMs whose operands or result are bfloat16 / float16 (storage) with float32 accumulation:
//! the `gemm` step when any of its tensors is not float32.
//!
//! Two ways, chosen per call:
//!
//! - **Pairs (`vdpbf16ps`)**, where the CPU has AVX-512 BF16, the own kernel is the GEMM
//!   backend, both factors are bfloat16 and both are contiguous along k (A row-major, B = `W.T`
//!   of a row-major weight: the `Linear` layout) with k even. Two bfloat16 values adjacent
//!   along k are one 32-bit word, so A and B *are* float32-sized matrices of k/2 "pairs": the
//!   own kernel's driver, packing (register transposes included) and threading run on them
//!   unchanged, and only the micro-kernel differs: `vdpbf16ps` multiplies 16 column pairs by a
//!   broadcast row pair and adds both products into float32 accumulators. The weights are read
//!   as they are stored (half the bytes of float32) and never widened. A row-major B (`x @ W`
//!   with W k×n, GPT-2's `Conv1D`) is packed in 32-column panels of row pairs (rows 2p and
//!   2p + 1 interleaved, one pass over the weight per call) for the same micro-kernel, or for
//!   the AMX tiles where the CPU has them.
//! - **Widen**, everywhere else (AVX2-only CPUs, float16, other layouts, odd k, another
//!   backend): each low-precision operand is widened into a float32 scratch copy (vectorised,
//!   `cast::vector_cast`) and the float32 GEMM runs on those.
//!
//! Either way the product, bias, activations and residual are computed in float32, and a
//! bfloat16 / float16 result is rounded once (to nearest even) from the float32 tile, as eager
//! PyTorch rounds its bfloat16 `addmm`.

use crate::core::mem::{Mem, SPtr};
use crate::core::tensor::{DType, View};
use crate::kernels::gemm::{sgemm_epi, Epi, EpiOp, EpiSpec, Mat};

/// A low-precision dtype this module takes.
pub fn is_low(d: DType) -> bool {
    matches!(d, DType::BF16 | DType::F16)
}

/// Elements a strided view spans from its first element (0 when empty).
fn span(v: &View) -> usize {
    if v.sizes.contains(&0) {
        return 0;
    }
    1 + v.sizes.iter().zip(&v.strides).map(|(&s, &st)| (s - 1) * st).sum::<usize>()
}

/// A view as float32: the buffer itself when it is float32, else a widened copy of the span it
/// covers (same strides, so every element keeps its offset).
struct F32Of {
    p: SPtr<f32>,
    _own: Vec<f32>,
}

unsafe fn f32_of(mem: &Mem, v: &View) -> F32Of {
    if v.dtype == DType::F32 {
        return F32Of { p: mem.ptr::<f32>(v), _own: Vec::new() };
    }
    let n = span(v);
    let mut own = vec![0f32; n.max(1)];
    let f = crate::kernels::cast::vector_cast(v.dtype, DType::F32).expect("a low-precision float dtype");
    crate::kernels::cast::par_cast(f, mem.byte_ptr(v), 2, own.as_mut_ptr() as *mut u8, 4, n);
    F32Of { p: SPtr(own.as_mut_ptr()), _own: own }
}

/// Rounds the float32 result `src` (laid out as `c`, from its first element) into `c`.
unsafe fn narrow_into(mem: &Mem, src: *const f32, c: &View) {
    let f = crate::kernels::cast::vector_cast(DType::F32, c.dtype).expect("a low-precision float dtype");
    let dst = mem.byte_ptr(c);
    let n = span(c);
    if n == c.numel() {
        // dense (any order): the span is exactly the view's elements
        return crate::kernels::cast::par_cast(f, src as *const u8, 4, dst, 2, n);
    }
    crate::core::strided::for_each(&c.sizes, [&c.strides], |[o]| f(src.add(o) as *const u8, dst.add(2 * o), 1));
}

/// Whether the pair kernel runs on this CPU (AVX-512 BF16) with the own GEMM backend.
pub fn pairs_available() -> bool {
    crate::core::isa::has_avx512bf16() && crate::kernels::gemm::resolved() == 2
}

/// `c = alpha * a @ b + beta * bias`, then `epi`, for the `gemm` step with a low-precision
/// tensor among its operands (checked by the step: ranks, shapes, dtypes float32 / bfloat16 /
/// float16).
///
/// # Safety
/// The views valid in `mem` (validated by the executor), c overlapping no operand.
pub unsafe fn gemm(mem: &Mem, a: &View, b: &View, c: &View, bias: Option<&View>, res: Option<&View>, alpha: f32, beta: f32, epi: &[EpiSpec]) {
    let r = c.rank();
    let (m, k, n) = (a.sizes[r - 2], a.sizes[r - 1], b.sizes[r - 1]);
    let batch = if r == 3 { c.sizes[0] } else { 1 };
    if c.numel() == 0 {
        return;
    }
    let layout = if pairs_available() { pair_layout(mem, a, b, k) } else { None };
    let pairs = layout.is_some();
    let row_major_b = layout == Some(true);
    // operands the chosen way reads as float32
    let fa = if pairs { None } else { Some(f32_of(mem, a)) };
    let fb = if pairs { None } else { Some(f32_of(mem, b)) };
    let fbias = bias.map(|v| f32_of(mem, v));
    let fres = res.map(|v| f32_of(mem, v));
    // the float32 result: c itself, or a scratch laid out as c
    let mut scratch = if c.dtype == DType::F32 { Vec::new() } else { take_scratch(span(c)) };
    if k == 0 {
        scratch.fill(0.0); // an empty sum: whatever the GEMM path does with k = 0 starts from zeros
    }
    let pc = if c.dtype == DType::F32 { mem.ptr::<f32>(c) } else { SPtr(scratch.as_mut_ptr()) };
    let mat = |p: SPtr<f32>, v: &View, i: usize| {
        let off = if r == 3 { i * v.strides[0] } else { 0 };
        Mat { p: SPtr(p.add(off)), rs: v.strides[r - 2] as isize, cs: v.strides[r - 1] as isize }
    };
    let threads = crate::core::par::threads();
    let (a_raw, b_raw) = (SPtr(mem.byte_ptr(a)), SPtr(mem.byte_ptr(b)));
    let one = |i: usize, t: usize| {
        let e = Epi::new(
            fbias.as_ref().map(|f| (mat(f.p, bias.expect("bias"), i), beta)),
            epi.iter().map(|s| match *s {
                EpiSpec::Un(u) => EpiOp::Un(u),
                EpiSpec::Residual => EpiOp::Add(mat(fres.as_ref().expect("checked when built").p, res.expect("res"), i), 1.0),
            }),
        );
        let cm = mat(pc, c, i);
        match (&fa, &fb) {
            (Some(fa), Some(fb)) => sgemm_epi(m, n, k, mat(fa.p, a, i), mat(fb.p, b, i), cm, alpha, false, t, &e),
            _ => pair_gemm(a_raw, b_raw, a, b, row_major_b, i, m, n, k, cm, alpha, t, &e),
        }
    };
    if batch > 1 && m * n * k < 256 * 256 * 256 {
        crate::core::par::for_each(batch, |i| one(i, 1));
    } else {
        for i in 0..batch {
            one(i, threads);
        }
    }
    if c.dtype != DType::F32 {
        narrow_into(mem, pc.0, c);
        give_back_scratch(scratch);
    }
}

thread_local! {
    /// The float32 result scratch of the last low-precision GEMM on this thread, kept: a fresh
    /// zeroed allocation per call (megabytes: fresh pages from the kernel each time) cost more
    /// than the rounding sweep it feeds.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A float32 scratch of `n` elements (contents unspecified: every element the GEMM reads back
/// is written first), from this thread's pool.
fn take_scratch(n: usize) -> Vec<f32> {
    let mut v = SCRATCH.with(|c| c.try_borrow_mut().map(|mut v| std::mem::take(&mut *v)).unwrap_or_default());
    if v.len() < n.max(1) {
        v.resize(n.max(1), 0.0);
    }
    v
}

fn give_back_scratch(v: Vec<f32>) {
    SCRATCH.with(|c| {
        if let Ok(mut slot) = c.try_borrow_mut() {
            if slot.capacity() < v.capacity() {
                *slot = v;
            }
        }
    });
}

/// Whether a and b suit the pair kernels: both bfloat16, A contiguous along k, k even, every
/// row (and batch) of A starting on a 32-bit boundary, and B either contiguous along k too
/// (`Some(false)`: the `Linear` layout; B's rows aligned likewise) or row-major
/// (`Some(true)`: `x @ W` with `W` k×n, as GPT-2's Conv1D).
unsafe fn pair_layout(mem: &Mem, a: &View, b: &View, k: usize) -> Option<bool> {
    if a.dtype != DType::BF16 || b.dtype != DType::BF16 || k == 0 || !k.is_multiple_of(2) {
        return None;
    }
    let r = a.rank();
    let (m, n) = (a.sizes[r - 2], b.sizes[r - 1]);
    let aligned = |v: &View| (mem.byte_ptr(v) as usize).is_multiple_of(4);
    let even = |st: usize, size: usize| size <= 1 || st.is_multiple_of(2);
    let a_ok = a.strides[r - 1] == 1 && even(a.strides[r - 2], m) && (r == 2 || even(a.strides[0], a.sizes[0])) && aligned(a);
    if !a_ok {
        return None;
    }
    if b.strides[r - 2] == 1 && even(b.strides[r - 1], n) && (r == 2 || even(b.strides[0], b.sizes[0])) && aligned(b) {
        return Some(false);
    }
    if b.strides[r - 1] == 1 || n == 1 {
        return Some(true);
    }
    None
}

/// One product of the batch through the pair kernel: A and B seen as matrices of 32-bit pairs.
#[allow(clippy::too_many_arguments)]
unsafe fn pair_gemm(a_raw: SPtr<u8>, b_raw: SPtr<u8>, a: &View, b: &View, row_major_b: bool, i: usize, m: usize, n: usize, k: usize, c: Mat, alpha: f32, threads: usize, epi: &Epi) {
    #[cfg(target_arch = "x86_64")]
    {
        let r = a.rank();
        let base = |raw: SPtr<u8>, v: &View| {
            let off = if r == 3 { i * v.strides[0] } else { 0 };
            SPtr(raw.add(2 * off) as *mut f32)
        };
        let half = |st: usize, size: usize| if size <= 1 { 0 } else { (st / 2) as isize };
        let pa = Mat { p: base(a_raw, a), rs: half(a.strides[r - 2], m), cs: 1 };
        if row_major_b {
            let ldb = if k <= 1 { 0 } else { b.strides[r - 2] };
            let pb = base(b_raw, b).0 as *const u16;
            if k.is_multiple_of(32) && amx::available() {
                return amx::gemm_nn(m, n, k / 2, pa, pb, ldb, c, alpha, threads, epi);
            }
            return x86::gemm_nn(m, n, k / 2, pa, pb, ldb, c, alpha, threads, epi);
        }
        let pb = Mat { p: base(b_raw, b), rs: 1, cs: half(b.strides[r - 1], n) };
        if crate::kernels::gemm::gemv_pairs::gemv(m, n, k / 2, pa, pb, c, alpha, threads, epi) {
            return;
        }
        if m >= amx::MIN_ROWS && k >= 32 && amx::available() {
            return amx::gemm(m, n, k / 2, pa, pb, c, alpha, threads, epi);
        }
        crate::kernels::gemm::own::drive::<x86::Pairs>(m, n, k / 2, pa, pb, c, alpha, false, threads, epi);
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (a_raw, b_raw, a, b, row_major_b, i, m, n, k, c, alpha, threads, epi);
        unreachable!("the pair kernel is x86-64 only");
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx {
    //! AMX-BF16 tiles, where the CPU has them and Linux grants this process the tile state
    //! (`arch_prctl(ARCH_REQ_XCOMP_PERM)`, as oneDNN asks for it): `tdpbf16ps` multiplies a
    //! 16×32 bfloat16 tile by a 32×16 one (16 k pairs × 16 columns, the pair panels' layout)
    //! into 16×16 float32 accumulators. The weight is read in place and the activations packed
    //! (see `gemm`); C goes through a 32×32 float32 tile where the epilogue runs.

    use crate::core::mem::SPtr;
    use crate::kernels::gemm::own::x86::Avx512;
    use crate::kernels::gemm::own::Isa;
    use crate::kernels::gemm::{Epi, Mat};
    use std::arch::asm;

    /// From this many rows of A on, the tiles run (the weight is read in place: even one row
    /// of A is faster on tiles than through the pair kernel's packing of the weight).
    pub const MIN_ROWS: usize = 1;
    const NR: usize = 32;

    /// CPUID says AMX-TILE and AMX-BF16 (and AVX-512 BF16), and the kernel granted the tile state.
    pub fn available() -> bool {
        static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *OK.get_or_init(|| {
            if !crate::core::isa::has_avx512bf16() {
                return false;
            }
            let l = std::arch::x86_64::__cpuid_count(7, 0);
            if l.edx & (1 << 22) == 0 || l.edx & (1 << 24) == 0 {
                return false;
            }
            #[cfg(target_os = "linux")]
            {
                const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
                const XFEATURE_XTILEDATA: libc::c_long = 18;
                // SAFETY: a request for a permission; it changes nothing else.
                unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
            }
            #[cfg(not(target_os = "linux"))]
            false
        })
    }

    #[repr(C, align(64))]
    struct TileCfg {
        palette: u8,
        start_row: u8,
        reserved: [u8; 14],
        colsb: [u16; 16],
        rows: [u8; 16],
    }

    /// out (32×32 float32, row stride 32) = rows 0..mv (≤ 32) of A times a packed pair panel
    /// (k2 pairs × 32 columns, k2 a multiple of 16); A's rows `lda` bytes apart, 16 pairs of
    /// each read per step. Not `wide`: the panel's columns 16..32 are zero and are skipped
    /// (columns 16..32 of `out` are left as they were).
    pub(crate) unsafe fn block(a: *const u8, lda: usize, mv: usize, panel: *const u32, k2: usize, out: *mut f32, wide: bool) {
        configure(mv, wide);
        block_configured(a, lda, mv, panel, k2, out, wide);
        asm!("tilerelease", options(nostack, nomem));
    }

    /// Loads the tile configuration `block_configured(.., mv, .., wide)` runs with (`ldtilecfg`
    /// also zeroes every tile). A caller running many blocks of one shape configures once and
    /// releases (`tilerelease`) once when done, on the same thread, with no other code in between
    /// that could load another configuration (oneDNN does, on its own calls).
    unsafe fn configure(mv: usize, wide: bool) {
        let (r0, r1) = (mv.min(16), mv.saturating_sub(16));
        let mut cfg = TileCfg { palette: 1, start_row: 0, reserved: [0; 14], colsb: [0; 16], rows: [0; 16] };
        // tmm0 / tmm1: C rows 0..16, columns 0..16 / 16..32; tmm2 / tmm3: rows 16..32;
        // tmm4 / tmm5: A rows 0..16 / 16..32; tmm6 / tmm7: B columns 0..16 / 16..32
        let mut set = |t: usize, rows: usize| {
            cfg.rows[t] = rows as u8;
            cfg.colsb[t] = 64;
        };
        set(0, r0);
        set(4, r0);
        set(6, 16);
        if wide {
            set(1, r0);
            set(7, 16);
        }
        if r1 > 0 {
            set(2, r1);
            set(5, r1);
            if wide {
                set(3, r1);
            }
        }
        asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly));
    }

    /// `block` with the tiles already configured for this `mv` and `wide` (`configure`).
    unsafe fn block_configured(a: *const u8, lda: usize, mv: usize, panel: *const u32, k2: usize, out: *mut f32, wide: bool) {
        let r1 = mv.saturating_sub(16);
        asm!("tilezero tmm0", options(nostack, nomem));
        if wide {
            asm!("tilezero tmm1", options(nostack, nomem));
        }
        if r1 > 0 {
            asm!("tilezero tmm2", options(nostack, nomem));
            if wide {
                asm!("tilezero tmm3", options(nostack, nomem));
            }
        }
        let a1 = a.add(16 * lda);
        let bs = 4 * NR;
        let mut p = 0;
        while p < k2 {
            let (ap, bp) = (a.add(4 * p), panel.add(NR * p) as *const u8);
            asm!(
                "tileloadd tmm6, [{b} + {bs}*1]",
                "tileloadd tmm4, [{a} + {s}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                b = in(reg) bp, bs = in(reg) bs, a = in(reg) ap, s = in(reg) lda,
                options(nostack, readonly)
            );
            if wide {
                asm!(
                    "tileloadd tmm7, [{b} + {bs}*1]",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    b = in(reg) bp.add(64), bs = in(reg) bs,
                    options(nostack, readonly)
                );
            }
            if r1 > 0 {
                asm!(
                    "tileloadd tmm5, [{a} + {s}*1]",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    a = in(reg) a1.add(4 * p), s = in(reg) lda,
                    options(nostack, readonly)
                );
                if wide {
                    asm!("tdpbf16ps tmm3, tmm5, tmm7", options(nostack, nomem));
                }
            }
            p += 16;
        }
        let os = 4 * NR;
        asm!("tilestored [{c} + {s}*1], tmm0", c = in(reg) out, s = in(reg) os, options(nostack));
        if wide {
            asm!("tilestored [{c} + {s}*1], tmm1", c = in(reg) out.add(16), s = in(reg) os, options(nostack));
        }
        if r1 > 0 {
            asm!("tilestored [{c} + {s}*1], tmm2", c = in(reg) out.add(16 * NR), s = in(reg) os, options(nostack));
            if wide {
                asm!("tilestored [{c} + {s}*1], tmm3", c = in(reg) out.add(16 * NR + 16), s = in(reg) os, options(nostack));
            }
        }
    }

    /// out[r][0..16] (and [16..32] when `wide`) += the products of pairs 0..kt of weight row r
    /// (`ldw` bytes apart, 0 ≤ r < nv) with rows 0..kt of a packed panel: the k remainder the
    /// tiles (16 pairs a step) leave, on `vdpbf16ps` (kt < 16, so at most 16 × 2 per row).
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn tail(w: *const u8, ldw: usize, nv: usize, panel: *const u32, kt: usize, out: &mut [f32; 32 * NR], wide: bool) {
        use std::arch::x86_64::*;
        for r in 0..nv {
            let (wr, o) = (w.add(r * ldw) as *const i32, out.as_mut_ptr().add(r * NR));
            let mut c0 = _mm512_loadu_ps(o);
            let mut c1 = if wide { _mm512_loadu_ps(o.add(16)) } else { _mm512_setzero_ps() };
            for p in 0..kt {
                let wv: __m512bh = std::mem::transmute(_mm512_set1_epi32(wr.add(p).read_unaligned()));
                let row = panel.add(p * NR) as *const i32;
                c0 = _mm512_dpbf16_ps(c0, wv, std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(row as *const _)));
                if wide {
                    c1 = _mm512_dpbf16_ps(c1, wv, std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(row.add(16) as *const _)));
                }
            }
            _mm512_storeu_ps(o, c0);
            if wide {
                _mm512_storeu_ps(o.add(16), c1);
            }
        }
    }

    /// `a` (m×k2 pairs, unit column stride) transposed into the tiles' B operand: 32-column
    /// panels of k2 rows (panel q = rows 32q.. of `a`, zero columns past m), panel after panel;
    /// the panels split over `threads`.
    ///
    /// # Safety
    /// `a` valid for m×k2 words; AVX-512 (`available()`).
    pub(crate) unsafe fn pack_t(a: Mat, m: usize, k2: usize, threads: usize) -> Vec<u32> {
        let mpan = m.div_ceil(NR);
        let at = Mat { p: a.p, rs: 1, cs: a.rs };
        let mut packed = vec![0u32; mpan * k2 * NR];
        let pk = SPtr(packed.as_mut_ptr());
        let pack = |q: usize| {
            let mut p0 = 0;
            while p0 < k2 {
                let kc = 256.min(k2 - p0);
                // SAFETY: panel q holds k2 rows of NR words
                unsafe { <Avx512 as Isa>::pack_b_t(at, p0, kc, q * NR, NR.min(m - q * NR), pk.get().add(q * k2 * NR + p0 * NR) as *mut f32) };
                p0 += kc;
            }
        };
        if threads > 1 && mpan > 1 {
            crate::core::par::for_each(mpan, pack);
        } else {
            (0..mpan).for_each(pack);
        }
        packed
    }

    /// c = alpha * a @ b, then `epi`, for pair matrices (k2 ≥ 16 pairs deep): `a` m×k2 with unit
    /// column stride, `b` k2×n with unit row stride (as the pair kernel takes them). The tiles
    /// take k2 in steps of 16 pairs; a remainder (k not a multiple of 32, as a 784-wide layer)
    /// is added to each 32×32 tile by `tail` before the epilogue.
    ///
    /// The tiles compute C's transpose, `Cᵀ = Bᵀ · Aᵀ`: `Bᵀ` is the weight `W` (n rows, k
    /// contiguous), which `tileloadd` reads in place, 16 rows of 16 pairs at a time, and `Aᵀ`
    /// (the activations, usually far smaller) is what gets packed, once per call, into 32-column
    /// pair panels. So the weight is read once, as stored, and never copied.
    ///
    /// # Safety
    /// As the pair kernel's driver; `available()` must be true.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm(m: usize, n: usize, k2: usize, a: Mat, b: Mat, c: Mat, alpha: f32, threads: usize, epi: &Epi) {
        let threads = threads.clamp(1, ((m * n * k2) >> 19).max(1));
        let k2t = k2 / 16 * 16; // the pairs the tiles take; the rest by `tail`
        let packed = pack_t(a, m, k2, threads);
        let pk = SPtr(packed.as_ptr() as *mut u32);
        let mpan = m.div_ceil(NR);
        let nblocks = n.div_ceil(32);
        let tasks = if threads > 1 { (threads * 3).min(nblocks) } else { 1 };
        let ldw = 4 * b.cs as usize;
        let w0 = SPtr(b.p.0 as *mut u8);
        let task = |t: usize| {
            let (b0, b1) = (nblocks * t / tasks, nblocks * (t + 1) / tasks);
            let mut out = [0f32; 32 * NR];
            // the tiles are configured once per shape of block (edges change it), released at the end
            let mut shape = None;
            for jb in b0..b1 {
                let j = jb * 32;
                let nv = 32.min(n - j);
                for q in 0..mpan {
                    let i = q * NR;
                    let mv = NR.min(m - i);
                    // SAFETY: rows j..j+nv of W and panel q are valid; `out` holds 32×32; the
                    // tiles are configured for (nv, wide) before the block runs
                    unsafe {
                        let (w, panel) = (w0.get().add(j * ldw), pk.get().add(q * k2 * NR));
                        if shape != Some((nv, mv > 16)) {
                            configure(nv, mv > 16);
                            shape = Some((nv, mv > 16));
                        }
                        block_configured(w, ldw, nv, panel, k2t, out.as_mut_ptr(), mv > 16);
                        if k2t < k2 {
                            tail(w.add(4 * k2t), ldw, nv, panel.add(k2t * NR), k2 - k2t, &mut out, mv > 16);
                        }
                        store_t(&out, nv, mv, c, i, j, alpha, epi);
                    }
                }
            }
            if shape.is_some() {
                // SAFETY: this thread configured the tiles above
                unsafe { asm!("tilerelease", options(nostack, nomem)) };
            }
        };
        if tasks > 1 {
            crate::core::par::for_each(tasks, task);
        } else {
            task(0);
        }
    }

    /// c = alpha * a @ b, then `epi`, with `a` an m×k2 pair matrix (unit column stride) read in
    /// place and `b` a row-major bfloat16 k×n matrix (rows `ldb` elements apart, k = 2 * k2, a
    /// multiple of 32): B's 32-column panels are packed as pairs (rows 2p and 2p + 1
    /// interleaved), once per task, and the tiles compute C directly.
    ///
    /// # Safety
    /// As `gemm`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm_nn(m: usize, n: usize, k2: usize, a: Mat, b: *const u16, ldb: usize, c: Mat, alpha: f32, threads: usize, epi: &Epi) {
        let npan = n.div_ceil(NR);
        let threads = threads.clamp(1, ((m * n * k2) >> 19).max(1));
        let tasks = if threads > 1 { (threads * 3).min(npan) } else { 1 };
        let lda = 4 * a.rs as usize;
        let (a0, b0) = (SPtr(a.p.0 as *mut u8), SPtr(b as *mut u16));
        let task = |t: usize| {
            let (j0, j1) = (npan * t / tasks, npan * (t + 1) / tasks);
            let mut panel = vec![0u32; k2 * NR];
            let mut out = [0f32; 32 * NR];
            for jp in j0..j1 {
                let j = jp * NR;
                let nv = NR.min(n - j);
                // SAFETY: rows 0..2 * k2, columns j..j+nv of B are valid; AMX implies AVX-512F
                unsafe {
                    if nv == NR {
                        super::x86::pack_pairs_full(b0.get().add(j), ldb, k2, &mut panel)
                    } else {
                        super::x86::pack_pairs(b0.get().add(j), ldb, k2, nv, &mut panel)
                    }
                };
                let mut i = 0;
                while i < m {
                    let mv = 32.min(m - i);
                    // SAFETY: rows i..i+mv of A and the panel are valid; `out` holds 32×32
                    unsafe {
                        block(a0.get().add(i * lda), lda, mv, panel.as_ptr(), k2, out.as_mut_ptr(), nv > 16);
                        store(&out, mv, nv, c, i, j, alpha, epi);
                    }
                    i += mv;
                }
            }
        };
        if tasks > 1 {
            crate::core::par::for_each(tasks, task);
        } else {
            task(0);
        }
    }

    /// Rows 0..mv, columns 0..nv of the tile into C at (i, j): scaled, epilogue applied. A
    /// row of C with unit stride is written with two masked 16-lane stores (a `memcpy` call per
    /// 128-byte row took 15 % of a 256 × 256 × 768 product).
    #[allow(clippy::too_many_arguments)]
    unsafe fn store(out: &[f32; 32 * NR], mv: usize, nv: usize, c: Mat, i: usize, j: usize, alpha: f32, epi: &Epi) {
        let mut row = [0f32; NR];
        for r in 0..mv {
            let cp = c.p.0.offset((i + r) as isize * c.rs + j as isize * c.cs);
            if epi.is_empty() && c.cs == 1 {
                put_row(out.as_ptr().add(r * NR), cp, nv, alpha);
                continue;
            }
            put_row(out.as_ptr().add(r * NR), row.as_mut_ptr(), nv, alpha);
            let row = &mut row[..nv];
            if !epi.is_empty() {
                epi.apply_row(row, i + r, j);
            }
            if c.cs == 1 {
                put_row(row.as_ptr(), cp, nv, 1.0);
            } else {
                for (q, &x) in row.iter().enumerate() {
                    *cp.offset(q as isize * c.cs) = x;
                }
            }
        }
    }

    /// dst[0..nv] = alpha * src[0..nv] (nv ≤ 32), in masked 16-lane loads and stores.
    #[target_feature(enable = "avx512f")]
    unsafe fn put_row(src: *const f32, dst: *mut f32, nv: usize, alpha: f32) {
        use std::arch::x86_64::*;
        let a = _mm512_set1_ps(alpha);
        let mask = |n: usize| if n >= 16 { 0xffff } else { ((1u32 << n) - 1) as __mmask16 };
        let m0 = mask(nv);
        _mm512_mask_storeu_ps(dst, m0, _mm512_mul_ps(a, _mm512_maskz_loadu_ps(m0, src)));
        if nv > 16 {
            let m1 = mask(nv - 16);
            _mm512_mask_storeu_ps(dst.add(16), m1, _mm512_mul_ps(a, _mm512_maskz_loadu_ps(m1, src.add(16))));
        }
    }

    /// The transposed tile (rows: columns j.. of C, columns: rows i.. of C) into C: transposed
    /// back in 16×16 register blocks (the float32 kernel's B packing, which moves exactly this:
    /// row q of the tile is "column" q), then stored as `store` does, scaled, epilogue applied.
    /// (An element-by-element transpose here cost several times the tiles' own work at k = 256.)
    #[allow(clippy::too_many_arguments)]
    unsafe fn store_t(out: &[f32; 32 * NR], nv: usize, mv: usize, c: Mat, i: usize, j: usize, alpha: f32, epi: &Epi) {
        let mut t = [0f32; 32 * NR];
        let tile = Mat { p: SPtr(out.as_ptr() as *mut f32), rs: 1, cs: NR as isize };
        <Avx512 as Isa>::pack_b_t(tile, 0, mv, 0, nv, t.as_mut_ptr());
        store(&t, mv, nv, c, i, j, alpha, epi);
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use crate::core::lanes::Z16;
    use crate::core::mem::SPtr;
    use crate::kernels::gemm::epilogue::RegEpi;
    use crate::kernels::gemm::own::x86::Avx512;
    use crate::kernels::gemm::own::{drive_packed_ab, pack_a_slices_for, Isa};
    use crate::kernels::gemm::{Epi, Mat};
    use std::arch::x86_64::*;

    /// Each float of `v` rounded to bfloat16 (nearest even; subnormals flushed, NaN kept), in
    /// the low half of its 32-bit lane: one half of a pair (shift it left 16 for the high half).
    /// For the callers' `#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]` code.
    #[inline(always)]
    pub(crate) unsafe fn bf16_lanes(v: __m512) -> __m512i {
        _mm512_cvtepu16_epi32(std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(v)))
    }

    /// Columns of a pair panel (`Pairs::NR`).
    const NR: usize = 32;

    /// No in-register epilogue (`kernel_dp`'s `E` false).
    const NO_EPI: (*const RegEpi, usize) = (std::ptr::null(), 0);

    /// 8×32 tiles of float32 accumulators fed by `vdpbf16ps`: each step of the packed panels is
    /// one k pair (A: 8 row pairs, B: 32 column pairs, as the float32 kernel's 8 and 32 floats).
    #[derive(Clone, Copy)]
    pub struct Pairs;

    impl Isa for Pairs {
        const MR: usize = 8;
        const NR: usize = NR;
        /// 256 pairs: a 32 KiB B panel (L1)
        const KC: usize = 256;
        const MC: usize = 64;
        #[inline(always)]
        unsafe fn kernel(kc: usize, a: *const f32, b: *const f32, c: *mut f32, rs: isize, alpha: f32, acc: bool) {
            kernel_dp::<8, false>(kc, a, b, c, rs, alpha, acc, NO_EPI)
        }
        #[inline(always)]
        unsafe fn kernel_rows(mv: usize, kc: usize, a: *const f32, b: *const f32, c: *mut f32, rs: isize, alpha: f32, acc: bool) -> bool {
            mv < 8 && rows_dp::<false>(mv, kc, a, b, c, rs, alpha, acc, NO_EPI)
        }
        const EPI_IN_REGS: bool = true;
        /// Packed panels only (`bs` = NR): the epilogue on the accumulators before the single
        /// store (an NCHW convolution's rows are a plane apart: storing and reading them back
        /// for the epilogue missed L1).
        #[inline(always)]
        unsafe fn kernel_epi(mv: usize, kc: usize, a: *const f32, b: *const f32, bs: usize, c: *mut f32, rs: isize, alpha: f32, acc: bool, e: &RegEpi, i: usize) -> bool {
            bs == 32 && rows_dp::<true>(mv, kc, a, b, c, rs, alpha, acc, (e, i))
        }
        #[inline(always)]
        unsafe fn pack_b_t(b: Mat, p0: usize, kc: usize, j0: usize, nv: usize, dst: *mut f32) {
            // the float32 kernel's 16×16 register transpose moves 32-bit words: pairs too
            <Avx512 as Isa>::pack_b_t(b, p0, kc, j0, nv, dst)
        }
    }

    /// panel[p * 32 + j] = B[2p, j] | B[2p + 1, j] << 16 for j < nv, zero for nv ≤ j < 32.
    #[inline(always)]
    pub(crate) unsafe fn pack_pairs(b: *const u16, ldb: usize, k2: usize, nv: usize, panel: &mut [u32]) {
        for p in 0..k2 {
            let (r0, r1) = (b.add(2 * p * ldb), b.add((2 * p + 1) * ldb));
            let row = &mut panel[p * NR..p * NR + NR];
            for (q, d) in row.iter_mut().enumerate() {
                *d = if q < nv { *r0.add(q) as u32 | (*r1.add(q) as u32) << 16 } else { 0 };
            }
        }
    }

    /// `pack_pairs` of a whole panel (32 columns), 16 pairs per instruction: the weight is
    /// re-packed on every call, so this runs once per weight element per call.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn pack_pairs_full(b: *const u16, ldb: usize, k2: usize, panel: &mut [u32]) {
        debug_assert!(panel.len() >= k2 * NR);
        let out = panel.as_mut_ptr();
        for p in 0..k2 {
            let (r0, r1) = (b.add(2 * p * ldb), b.add((2 * p + 1) * ldb));
            for h in 0..2 {
                let lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(r0.add(16 * h) as *const __m256i));
                let hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256(r1.add(16 * h) as *const __m256i));
                _mm512_storeu_si512(out.add(p * NR + 16 * h) as *mut _, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
            }
        }
    }

    /// c = alpha * a @ b, then `epi`, on the pair micro-kernel: `a` an m×k2 pair matrix (unit
    /// column stride), packed once in MR-row panels; `b` a row-major bfloat16 k×n matrix (rows
    /// `ldb` elements apart, k = 2 * k2) whose 32-column panels are packed as pairs (rows 2p and
    /// 2p + 1 interleaved), each once per call, by the task that computes those columns.
    ///
    /// # Safety
    /// As `gemm`; AVX-512 BF16.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn gemm_nn(m: usize, n: usize, k2: usize, a: Mat, b: *const u16, ldb: usize, c: Mat, alpha: f32, threads: usize, epi: &Epi) {
        let npan = n.div_ceil(NR);
        // below ~1M multiply-adds per thread the fork/join costs more than it saves
        let threads = threads.clamp(1, ((m * n * k2) >> 19).max(1));
        let tasks = if threads > 1 { (threads * 3).min(npan) } else { 1 };
        let m_pad = m.div_ceil(<Pairs as Isa>::MR) * <Pairs as Isa>::MR;
        PACKED_A.with(|cell| {
            let mut pa = cell.take();
            pa.resize(m_pad * k2, 0.0);
            pack_a_slices_for::<Pairs>(a, m, k2, pa.as_mut_ptr());
            let (pap, b0) = (SPtr(pa.as_mut_ptr()), SPtr(b as *mut u16));
            let task = |t: usize| {
                let (j0, j1) = (npan * t / tasks, npan * (t + 1) / tasks);
                let mut panel = vec![0u32; k2 * NR];
                for jp in j0..j1 {
                    let j = jp * NR;
                    let nv = NR.min(n - j);
                    // SAFETY: rows 0..2 * k2, columns j..j+nv of B are valid; the panel one
                    // k2 × 32 slice stack (a single panel: each slice of it is its rows)
                    unsafe {
                        if nv == NR {
                            pack_pairs_full(b0.get().add(j), ldb, k2, &mut panel)
                        } else {
                            pack_pairs(b0.get().add(j), ldb, k2, nv, &mut panel)
                        }
                        let cj = Mat { p: SPtr(c.p.get().offset(j as isize * c.cs)), ..c };
                        drive_packed_ab::<Pairs>(m, nv, k2, pap.get(), panel.as_ptr() as *const f32, cj, alpha, &epi.at(0, j));
                    }
                }
            };
            if tasks > 1 {
                crate::core::par::for_each(tasks, task);
            } else {
                task(0);
            }
            cell.set(pa);
        });
    }

    thread_local! {
        /// `gemm_nn`'s packed A, kept between calls (fresh pages per call cost more than the packing).
        static PACKED_A: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    }

    /// `kernel_dp` for 1 ≤ mv ≤ 8 rows; false (nothing run) for another count.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    unsafe fn rows_dp<const E: bool>(mv: usize, kc: usize, a: *const f32, b: *const f32, c: *mut f32, rs: isize, alpha: f32, acc: bool, e: (*const RegEpi, usize)) -> bool {
        match mv {
            1 => kernel_dp::<1, E>(kc, a, b, c, rs, alpha, acc, e),
            2 => kernel_dp::<2, E>(kc, a, b, c, rs, alpha, acc, e),
            3 => kernel_dp::<3, E>(kc, a, b, c, rs, alpha, acc, e),
            4 => kernel_dp::<4, E>(kc, a, b, c, rs, alpha, acc, e),
            5 => kernel_dp::<5, E>(kc, a, b, c, rs, alpha, acc, e),
            6 => kernel_dp::<6, E>(kc, a, b, c, rs, alpha, acc, e),
            7 => kernel_dp::<7, E>(kc, a, b, c, rs, alpha, acc, e),
            8 => kernel_dp::<8, E>(kc, a, b, c, rs, alpha, acc, e),
            _ => return false,
        }
        true
    }

    /// Rows 0..R of an 8×32 tile: C[r, j] = [C +] alpha * sum over pairs p of
    /// A[p][r].lo * B[p][j].lo + A[p][r].hi * B[p][j].hi (bfloat16 products, float32 sums);
    /// with `E`, the epilogue `e` (built at row `e.1` of the tile's first row) on each row
    /// before it is stored.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn kernel_dp<const R: usize, const E: bool>(kc: usize, a: *const f32, b: *const f32, cp: *mut f32, rs: isize, alpha: f32, acc: bool, e: (*const RegEpi, usize)) {
        const MR: usize = 8;
        for r in 0..R {
            let row = cp.wrapping_offset(r as isize * rs) as *const i8;
            _mm_prefetch::<_MM_HINT_T0>(row);
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(64));
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(127));
        }
        let mut c = [[_mm512_setzero_ps(); 2]; R];
        let (mut a, mut b) = (a as *const i32, b as *const i32);
        for _ in 0..kc {
            let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(b as *const _));
            let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(b.add(16) as *const _));
            for r in 0..R {
                let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(*a.add(r)));
                c[r][0] = _mm512_dpbf16_ps(c[r][0], av, b0);
                c[r][1] = _mm512_dpbf16_ps(c[r][1], av, b1);
            }
            a = a.add(MR);
            b = b.add(32);
        }
        let al = _mm512_set1_ps(alpha);
        for r in 0..R {
            let p = cp.offset(r as isize * rs);
            let (mut v0, mut v1) = (_mm512_mul_ps(c[r][0], al), _mm512_mul_ps(c[r][1], al));
            if acc {
                v0 = _mm512_add_ps(v0, _mm512_loadu_ps(p));
                v1 = _mm512_add_ps(v1, _mm512_loadu_ps(p.add(16)));
            }
            if E {
                let ep = &*e.0;
                v0 = ep.apply(e.1 + r, 0, 16, Z16(v0)).0;
                v1 = ep.apply(e.1 + r, 16, 16, Z16(v1)).0;
            }
            _mm512_storeu_ps(p, v0);
            _mm512_storeu_ps(p.add(16), v1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::element::{bf16_to_f32, f32_to_bf16};

    fn data(len: usize, mul: usize, md: usize) -> Vec<u16> {
        (0..len).map(|i| f32_to_bf16(((i * mul % md) as f32 - (md / 2) as f32) / md as f32 * 1.7)).collect()
    }

    /// Both ways (pairs where the CPU has them, widening always) against a float64 product of
    /// the bfloat16 values, for the Linear layout (B = W.T), a row-major B, transposed A, odd
    /// k, edges around the tile sizes, batches, bias, activation and residual, float32 and
    /// bfloat16 results.
    #[test]
    fn low_precision_gemm_matches_a_float64_reference() {
        let _g = crate::kernels::gemm::tests::LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let mut backends = vec!["gemm"];
        if crate::kernels::gemm::own::available() {
            backends.push("own");
        }
        // k ≥ 32 runs on AMX tiles where the CPU has them (row tails of 16 and 32-row blocks,
        // column tails of the 32-column panels, k remainders past the tiles' 32: 514, 784, 40);
        // 1-4 rows on the pair GEMV (gemv_pairs); a row-major B without AMX on the pair kernel
        // (x86::gemm_nn: column panels over tasks, partial panels, k past one 256-pair slice)
        let shapes = [(64usize, 100usize, 784usize), (37, 200, 100), (1usize, 1usize, 2usize), (1, 40, 64), (3, 33, 30), (8, 32, 512), (9, 70, 100), (37, 65, 514), (300, 17, 2 * 256 + 6), (5, 7, 9), (16, 32, 32), (37, 65, 544), (50, 100, 64), (261, 33, 96), (8, 1000, 64), (64, 50, 784), (4, 70, 784), (2, 300, 512), (20, 33, 40), (17, 48, 46)];
        for be in backends {
            crate::kernels::gemm::set_backend(be).unwrap();
            for &(m, n, k) in &shapes {
                for batch in [1usize, 2] {
                    for (layout, out_dt) in [(0, DType::BF16), (1, DType::F32), (2, DType::BF16), (0, DType::F32), (1, DType::BF16)] {
                        check(m, n, k, batch, layout, out_dt, be);
                    }
                }
            }
        }
        crate::kernels::gemm::set_backend("auto").unwrap();
    }

    /// layout 0: A row-major, B = W.T (W row-major n×k); 1: B row-major k×n; 2: A transposed.
    fn check(m: usize, n: usize, k: usize, batch: usize, layout: u8, out_dt: DType, be: &str) {
        let rank3 = batch > 1;
        let av = data(batch * m * k, 7, 13);
        let wv = data(batch * n * k, 5, 11);
        let bias = data(n, 3, 7);
        let resv: Vec<f32> = (0..batch * m * n).map(|i| ((i * 11 % 17) as f32 - 8.0) / 17.0).collect();
        let (a_st, b_st) = match layout {
            0 => ((m * k, k, 1), (n * k, 1, k)),
            1 => ((m * k, k, 1), (k * n, n, 1)),
            _ => ((m * k, 1, m), (n * k, 1, k)),
        };
        let view = |buf: usize, sizes: [usize; 3], st: (usize, usize, usize), dtype| {
            if rank3 {
                View { buf, offset: 0, sizes: sizes.to_vec(), strides: vec![st.0, st.1, st.2], dtype }
            } else {
                View { buf, offset: 0, sizes: sizes[1..].to_vec(), strides: vec![st.1, st.2], dtype }
            }
        };
        let a = view(0, [batch, m, k], a_st, DType::BF16);
        let b = view(1, [batch, k, n], b_st, DType::BF16);
        let bv = view(2, [batch, m, n], (0, 0, 1), DType::BF16);
        let rv = view(3, [batch, m, n], (m * n, n, 1), DType::F32);
        let cv = view(4, [batch, m, n], (m * n, n, 1), out_dt);
        let mut c32 = vec![f32::NAN; batch * m * n];
        let mut c16 = vec![0xffffu16; batch * m * n];
        let cptr = if out_dt == DType::F32 { c32.as_mut_ptr() as *mut u8 } else { c16.as_mut_ptr() as *mut u8 };
        let mem = Mem { ptrs: vec![av.as_ptr() as *mut u8, wv.as_ptr() as *mut u8, bias.as_ptr() as *mut u8, resv.as_ptr() as *mut u8, cptr] };
        let epi = [EpiSpec::Un(crate::core::math::unary::Un::Relu), EpiSpec::Residual];
        unsafe { gemm(&mem, &a, &b, &cv, Some(&bv), Some(&rv), 0.5, 2.0, &epi) };
        let at = |v: &View, d: &[u16], bi: usize, i: usize, j: usize| {
            let off = if rank3 { bi * v.strides[0] } else { 0 } + i * v.strides[v.rank() - 2] + j * v.strides[v.rank() - 1];
            bf16_to_f32(d[off]) as f64
        };
        for bi in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    let dot: f64 = (0..k).map(|p| at(&a, &av, bi, i, p) * at(&b, &wv, bi, p, j)).sum();
                    let want = (0.5 * dot + 2.0 * bf16_to_f32(bias[j]) as f64).max(0.0) + resv[bi * m * n + i * n + j] as f64;
                    let o = bi * m * n + i * n + j;
                    let got = if out_dt == DType::F32 { c32[o] as f64 } else { bf16_to_f32(c16[o]) as f64 };
                    let tol = if out_dt == DType::F32 { 1e-4 } else { 8e-3 } * (1.0 + want.abs());
                    assert!((got - want).abs() <= tol, "{be} {m}x{n}x{k} batch {batch} layout {layout} {out_dt:?} ({bi},{i},{j}): {got} vs {want}");
                }
            }
        }
    }

    #[test]
    fn pair_layout_needs_bf16_even_k_and_k_contiguous_operands() {
        let a = View { buf: 0, offset: 0, sizes: vec![4, 6], strides: vec![6, 1], dtype: DType::BF16 };
        let b = View { buf: 1, offset: 0, sizes: vec![6, 3], strides: vec![1, 6], dtype: DType::BF16 };
        let bufs = vec![0u32; 64];
        let mem = Mem { ptrs: vec![bufs.as_ptr() as *mut u8, bufs.as_ptr() as *mut u8] };
        unsafe {
            assert_eq!(pair_layout(&mem, &a, &b, 6), Some(false));
            let odd_k = View { sizes: vec![4, 5], strides: vec![5, 1], ..a.clone() };
            assert_eq!(pair_layout(&mem, &odd_k, &View { sizes: vec![5, 3], strides: vec![1, 5], ..b.clone() }, 5), None);
            // row-major B: packed in row pairs (any even k)
            assert_eq!(pair_layout(&mem, &a, &View { strides: vec![3, 1], ..b.clone() }, 6), Some(true));
            assert_eq!(pair_layout(&mem, &a, &View { strides: vec![6, 2], ..b.clone() }, 6), None);
            assert_eq!(pair_layout(&mem, &View { dtype: DType::F16, ..a.clone() }, &b, 6), None);
            assert_eq!(pair_layout(&mem, &View { offset: 1, ..a.clone() }, &b, 6), None);
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod bench {
    use super::*;

    /// `cargo test --profile ci-test --lib gemm::bf16::bench -- --ignored --nocapture`: the
    /// micro-kernels' and whole products' throughput on this CPU.
    #[test]
    #[ignore]
    fn throughput() {
        use crate::kernels::gemm::own::Isa;
        let kc = 256;
        let a = vec![0.5f32; kc * 8];
        let b = vec![0.25f32; kc * 32];
        let mut c = vec![0f32; 8 * 32];
        let reps = 20000;
        let t = std::time::Instant::now();
        for _ in 0..reps {
            unsafe { <crate::kernels::gemm::own::x86::Avx512 as Isa>::kernel(kc, a.as_ptr(), b.as_ptr(), c.as_mut_ptr(), 32, 1.0, false) };
        }
        let s = t.elapsed().as_secs_f64();
        println!("f32 8x32 kernel: {:.0} GFLOP/s", (2 * 8 * 32 * kc * reps) as f64 / s / 1e9);
        if crate::core::isa::has_avx512bf16() {
            let t = std::time::Instant::now();
            for _ in 0..reps {
                unsafe { <x86::Pairs as Isa>::kernel(kc, a.as_ptr(), b.as_ptr(), c.as_mut_ptr(), 32, 1.0, false) };
            }
            let s = t.elapsed().as_secs_f64();
            println!("bf16 pair 8x32 kernel: {:.0} GFLOP/s", (2 * 2 * 8 * 32 * kc * reps) as f64 / s / 1e9);
        }
        if amx::available() {
            let k2 = 512;
            let a = vec![0x3f80u16; 32 * 2 * k2];
            let panel = vec![0x3f80_3f80u32; k2 * 32];
            let mut out = [0f32; 32 * 32];
            let reps = 2000;
            let t = std::time::Instant::now();
            for _ in 0..reps {
                unsafe { amx::block(a.as_ptr() as *const u8, 4 * k2, 32, panel.as_ptr(), k2, out.as_mut_ptr(), true) };
            }
            let s = t.elapsed().as_secs_f64();
            println!("amx 32x32 block, k {}: {:.2} us, {:.0} GFLOP/s", 2 * k2, s / reps as f64 * 1e6, (2 * 32 * 32 * 2 * k2 * reps) as f64 / s / 1e9);
        }
        for &(m, k, n) in &[(32usize, 512usize, 1024usize), (256, 1024, 1024)] {
            let av = vec![0x3f80u16; m * k];
            let wv = vec![0x3f80u16; n * k];
            let mut cv = vec![0u16; m * n];
            let a = View { buf: 0, offset: 0, sizes: vec![m, k], strides: vec![k, 1], dtype: DType::BF16 };
            let b = View { buf: 1, offset: 0, sizes: vec![k, n], strides: vec![1, k], dtype: DType::BF16 };
            let c = View { buf: 2, offset: 0, sizes: vec![m, n], strides: vec![n, 1], dtype: DType::BF16 };
            let mem = Mem { ptrs: vec![av.as_ptr() as *mut u8, wv.as_ptr() as *mut u8, cv.as_mut_ptr() as *mut u8] };
            for be in ["own", "gemm"] {
                crate::kernels::gemm::set_backend(be).unwrap();
                let reps = 20;
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    unsafe { gemm(&mem, &a, &b, &c, None, None, 1.0, 1.0, &[]) };
                }
                let s = t.elapsed().as_secs_f64() / reps as f64;
                println!("{m}x{k}x{n} bf16 via {be}: {:.0} us, {:.0} GFLOP/s", s * 1e6, (2 * m * n * k) as f64 / s / 1e9);
            }
        }
        crate::kernels::gemm::set_backend("auto").unwrap();
    }
}
