//! Decode kernels for tb-llm's `native_cpu` backend (see `tb_cpu_rust.llm`).
//!
//! Weights are packed once at load time into layouts the SIMD loops read straight through
//! (`packed`); activations are quantized per 32-value block (`act_quant`) so int8 / int4
//! weights meet them in integer dot products (AVX-512 VNNI); `gemv` runs the matrix-vector
//! products over output rows with rayon; `ops` has the small per-token kernels (RMSNorm,
//! SiLU-gate, RoPE, the scalar reference attention); `attn_decode` / `attn` attend over the KV
//! cache for a few / many query positions; its pyo3 layer is `py::llm`.

pub mod act_quant;
pub mod attn;
pub mod attn_decode;
pub mod dense_gemm;
pub mod qgemm;
pub mod gemv;
pub mod half;
pub mod huge;
pub mod model;
pub mod ops;
pub mod packed;
pub mod panel;
pub mod tiles;

pub mod quant;

/// Deterministic test inputs shared by the kernel tests.
#[cfg(test)]
mod test_util {
    /// A uniform value in [-0.5, 0.5) from a 64-bit LCG.
    pub fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

    /// A `[b, t, s]` attention mask of ones where `see(query, key)`; with `pad`, batch row
    /// 1 also cannot see its first two keys and its first query sees nothing (a zero row).
    pub fn mask(b: usize, t: usize, s: usize, pad: bool, see: impl Fn(usize, usize) -> bool) -> Vec<u8> {
        let mut mask = vec![0u8; b * t * s];
        for bi in 0..b {
            for ti in 0..t {
                for si in 0..s {
                    mask[(bi * t + ti) * s + si] = (see(ti, si) && !(pad && bi == 1 && (si < 2 || ti == 0))) as u8;
                }
            }
        }
        mask
    }
}
