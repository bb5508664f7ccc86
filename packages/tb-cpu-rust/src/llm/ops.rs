//! The small per-token kernels of a decoder step, on f32 rows: RMSNorm, the gated activation
//! of the MLP, RoPE, and attention of a few query positions over the KV cache.
//!
//! They are memory-light; what they save is the handful of PyTorch dispatches each would take.
//! Reductions accumulate in f32 with 8 partial sums (vectorizable, and closer to PyTorch's
//! pairwise sums than one long chain).

use rayon::prelude::*;

fn sum_sq(x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut it = x.chunks_exact(8);
    for c in &mut it {
        for i in 0..8 {
            acc[i] += c[i] * c[i];
        }
    }
    let tail: f32 = it.remainder().iter().map(|v| v * v).sum();
    acc.iter().sum::<f32>() + tail
}

/// `out = x / rms(x) * (offset + w)` per row of `d` values.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, offset: f32, out: &mut [f32]) {
    let d = w.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let inv = 1.0 / (sum_sq(xr) / d as f32 + eps).sqrt();
        for i in 0..d {
            or[i] = xr[i] * inv * (offset + w[i]);
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    Silu,
    Gelu,
    GeluTanh,
}

impl Act {
    pub fn parse(name: &str) -> Result<Act, String> {
        match name {
            "silu" => Ok(Act::Silu),
            "gelu" => Ok(Act::Gelu),
            "gelu_tanh" | "gelu_pytorch_tanh" => Ok(Act::GeluTanh),
            other => Err(format!("unknown activation {other:?}: silu, gelu or gelu_tanh")),
        }
    }
}

/// `out = act(gate) * up`.
///
/// SiLU takes the crate's AVX2 sigmoid (`vmath`, within a few ulp of `1 / (1 + e^-x)`) where the
/// CPU has it: the scalar loop calls libm's `expf` per value (~4 ns; a 512-token prefill of
/// the 0.5B benchmark model spends 0.25 s of CPU here).
pub fn gated_act(gate: &[f32], up: &[f32], act: Act, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if act == Act::Silu && matches!(super::gemv::detect(), super::gemv::Isa::Avx2 | super::gemv::Isa::Avx512 | super::gemv::Isa::Vnni) {
        let n = out.len();
        assert!(gate.len() >= n && up.len() >= n);
        for ((o, g), u) in out.chunks_mut(1024).zip(gate.chunks(1024)).zip(up.chunks(1024)) {
            // SAFETY: `detect` saw AVX2 and FMA.
            unsafe { crate::core::math::vector::un_avx2(crate::core::math::unary::Un::Silu, o, &g[..o.len()]) };
            for (v, &w) in o.iter_mut().zip(u) {
                *v *= w;
            }
        }
        return;
    }
    for i in 0..out.len() {
        let g = gate[i];
        let a = match act {
            Act::Silu => g / (1.0 + (-g).exp()),
            Act::Gelu => 0.5 * g * (1.0 + libm::erff(g * std::f32::consts::FRAC_1_SQRT_2)),
            Act::GeluTanh => 0.5 * g * (1.0 + (0.797_884_6 * (g + 0.044715 * g * g * g)).tanh()),
        };
        out[i] = a * up[i];
    }
}

/// A strided 4-d f32 view, validated by the caller: every index below `sizes` stays in bounds.
#[derive(Clone, Copy)]
pub struct V4 {
    pub ptr: *const f32,
    pub sizes: [usize; 4],
    pub strides: [usize; 4],
}
// SAFETY: read-only views of tensors that the caller keeps alive for the call.
unsafe impl Send for V4 {}
unsafe impl Sync for V4 {}

impl V4 {
    /// # Safety
    /// The view must be valid for reads at every index within `sizes`.
    pub unsafe fn row(&self, a: usize, b: usize, c: usize) -> &[f32] {
        let off = a * self.strides[0] + b * self.strides[1] + c * self.strides[2];
        debug_assert_eq!(self.strides[3], 1);
        std::slice::from_raw_parts(self.ptr.add(off), self.sizes[3])
    }
}

/// RoPE in "rotate half" order on the first `R` dims: `x` `[B, H, T, D]`, `cos`/`sin`
/// `[B, 1, T, R]`; `out` contiguous `[B, H, T, D]`.
///
/// # Safety
/// The views must be valid (see `V4`) and have unit stride in the last dim.
pub unsafe fn rope(x: V4, cos: V4, sin: V4, out: &mut [f32]) {
    let [b, h, t, d] = x.sizes;
    let r = cos.sizes[3];
    let half = r / 2;
    let mut o = 0;
    for bi in 0..b {
        for hi in 0..h {
            for ti in 0..t {
                let xr = x.row(bi, hi, ti);
                let (c, s) = (cos.row(bi, 0, ti), sin.row(bi, 0, ti));
                let orow = &mut out[o..o + d];
                for i in 0..half {
                    orow[i] = xr[i] * c[i] - xr[i + half] * s[i];
                    orow[i + half] = xr[i + half] * c[i + half] + xr[i] * s[i + half];
                }
                orow[r..].copy_from_slice(&xr[r..]);
                o += d;
            }
        }
    }
}

/// Grouped-query attention: `q` `[B, H, T, D]`, `k`/`v` `[B, KV, S, D]`, `mask` bool
/// `[B, T, S]` (row-major, true = may attend); `out` contiguous `[B, H, T, D]`.
///
/// # Safety
/// The views must be valid (see `V4`) with unit stride in the last dim; `mask` holds
/// `B * T * S` bytes that are 0 or 1.
pub unsafe fn attention(q: V4, k: V4, v: V4, mask: &[u8], scale: f32, softcap: Option<f32>, out: &mut [f32]) {
    let [b, h, t, d] = q.sizes;
    let (kvh, s) = (k.sizes[1], k.sizes[2]);
    let group = h / kvh;
    let work = b * h * t * s * d;
    let task = |(bh, o): (usize, &mut [f32])| {
        let (bi, hi) = (bh / h, bh % h);
        let kh = hi / group;
        let mut p = vec![0f32; s];
        for ti in 0..t {
            let qr = q.row(bi, hi, ti);
            let mr = &mask[(bi * t + ti) * s..(bi * t + ti + 1) * s];
            let mut mx = f32::NEG_INFINITY;
            for si in 0..s {
                if mr[si] == 0 {
                    p[si] = f32::NEG_INFINITY;
                    continue;
                }
                let kr = k.row(bi, kh, si);
                let mut acc = [0f32; 8];
                let mut i = 0;
                while i + 8 <= d {
                    for l in 0..8 {
                        acc[l] += qr[i + l] * kr[i + l];
                    }
                    i += 8;
                }
                let mut sc = acc.iter().sum::<f32>();
                while i < d {
                    sc += qr[i] * kr[i];
                    i += 1;
                }
                sc *= scale;
                if let Some(cap) = softcap {
                    sc = cap * (sc / cap).tanh();
                }
                p[si] = sc;
                mx = mx.max(sc);
            }
            let orow = &mut o[ti * d..(ti + 1) * d];
            orow.fill(0.0);
            if mx == f32::NEG_INFINITY {
                continue; // no key visible: zeros (tb-llm never asks for this)
            }
            let mut total = 0f32;
            for si in 0..s {
                let e = if p[si] == f32::NEG_INFINITY { 0.0 } else { (p[si] - mx).exp() };
                p[si] = e;
                total += e;
            }
            let inv = 1.0 / total;
            for si in 0..s {
                if p[si] == 0.0 {
                    continue;
                }
                let (vr, w) = (v.row(bi, kh, si), p[si] * inv);
                for i in 0..d {
                    orow[i] += w * vr[i];
                }
            }
        }
    };
    if work < 1 << 16 {
        out.chunks_mut(t * d).enumerate().for_each(&task);
    } else {
        out.par_chunks_mut(t * d).enumerate().for_each(task);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_unit_rows() {
        let x = [3.0f32, 4.0, 0.0, 0.0];
        let mut out = [0f32; 4];
        rms_norm(&x, &[1.0, 1.0], 1e-12, 0.0, &mut out);
        let r = (12.5f32).sqrt();
        assert!((out[0] - 3.0 / r).abs() < 1e-6 && (out[1] - 4.0 / r).abs() < 1e-6);
        assert_eq!(&out[2..], &[0.0, 0.0]);
    }

    #[test]
    fn gated_silu() {
        let mut out = [0f32; 2];
        gated_act(&[0.0, 1.0], &[5.0, 2.0], Act::Silu, &mut out);
        assert_eq!(out[0], 0.0);
        assert!((out[1] - 2.0 / (1.0 + (-1f32).exp())).abs() < 1e-6);
        assert!(Act::parse("relu").is_err());
    }

    #[test]
    fn attention_single_key_returns_value() {
        let q = [1f32, 0.0];
        let k = [0.5f32, 0.5, 9.0, 9.0];
        let v = [1f32, 2.0, 7.0, 7.0];
        let view = |p: &[f32], s| V4 { ptr: p.as_ptr(), sizes: [1, 1, s, 2], strides: [2 * s, 2 * s, 2, 1] };
        let mut out = [0f32; 2];
        unsafe { attention(view(&q, 1), view(&k, 2), view(&v, 2), &[1, 0], 1.0, None, &mut out) };
        assert_eq!(out, [1.0, 2.0]);
    }
}
