//! Runtime instruction-set detection, done once per process: the wheel targets the portable
//! baseline and picks AVX-512 / AVX2+FMA code paths when the CPU it runs on has them. The engine
//! kernels ask `has_avx2` / `has_avx512`; the LLM kernels dispatch on an `Isa` level.

use std::sync::OnceLock;

/// The CPU features any kernel of the crate dispatches on.
#[derive(Clone, Copy, Default, Debug)]
struct Features {
    avx: bool,
    avx2_fma: bool,
    f16c: bool,
    avx512f_vl: bool,
    avx512bw: bool,
    avx512vnni: bool,
    avx512bf16: bool,
}

fn features() -> &'static Features {
    static FEATURES: OnceLock<Features> = OnceLock::new();
    FEATURES.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            Features {
                avx: has!("avx"),
                avx2_fma: has!("avx2") && has!("fma"),
                f16c: has!("f16c"),
                avx512f_vl: has!("avx512f") && has!("avx512vl"),
                avx512bw: has!("avx512bw"),
                avx512vnni: has!("avx512vnni"),
                avx512bf16: has!("avx512bf16"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            Features::default()
        }
    })
}

/// AVX (the 8×8 register transpose).
#[inline]
pub fn has_avx() -> bool {
    features().avx
}

/// AVX2 and FMA: the engine's 256-bit kernels.
#[inline]
pub fn has_avx2() -> bool {
    features().avx2_fma
}

/// AVX-512 F and VL: the engine's 512-bit kernels.
#[inline]
pub fn has_avx512() -> bool {
    features().avx512f_vl
}

/// F16C: the vector float16 <-> float32 conversions.
#[inline]
pub fn has_f16c() -> bool {
    features().f16c
}

/// AVX-512 F, VL, BW and BF16 (`vdpbf16ps`): the bfloat16 GEMM's pair micro-kernel.
#[inline]
pub fn has_avx512bf16() -> bool {
    let f = features();
    f.avx512f_vl && f.avx512bw && f.avx512bf16
}

/// AVX-512 F, VL and BW (the 16-bit lane operations of the vector casts).
#[inline]
pub fn has_avx512bw() -> bool {
    let f = features();
    f.avx512f_vl && f.avx512bw
}

/// The levels the LLM kernels come in, lowest first. Every SIMD level includes AVX2 + FMA and
/// F16C (int4's float16 scales): kernels without an AVX-512 form (int4, attention) run their
/// AVX2 one on any non-scalar level.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Isa {
    Scalar,
    Avx2,
    Avx512,
    Vnni,
}

impl Isa {
    /// The highest level this CPU runs.
    pub fn best() -> Isa {
        let f = features();
        if !(f.avx2_fma && f.f16c) {
            Isa::Scalar
        } else if !(f.avx512f_vl && f.avx512bw) {
            Isa::Avx2
        } else if !f.avx512vnni {
            Isa::Avx512
        } else {
            Isa::Vnni
        }
    }

    /// Every level this CPU runs, lowest first (the kernel tests run each one).
    pub fn supported() -> Vec<Isa> {
        let best = Isa::best();
        [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Vnni].into_iter().filter(|&l| l <= best).collect()
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Vnni => "avx512-vnni",
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2+fma",
            Isa::Scalar => "scalar",
        }
    }
}

/// The instruction set the engine kernels dispatch to. Only ISAs with kernels of their own are
/// named, besides the baseline the portable code is compiled for (SSE2 on x86-64); there is no
/// NEON kernel, so aarch64 reports "scalar" like every other target.
pub fn describe() -> &'static str {
    if has_avx512() {
        "avx512"
    } else if has_avx2() {
        "avx2+fma"
    } else if cfg!(target_arch = "x86_64") {
        "sse2"
    } else {
        "scalar"
    }
}
