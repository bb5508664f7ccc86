//! Weight layouts of the LLM kernels, built once at load time from tb-llm's `QuantWeight`
//! layouts (`tb_llm.quant`) and owned by Rust.
//!
//! * `Int8`: row `n` is `kp` bytes (`kp` = K rounded up to 128) holding `w + 128` as `u8`, so
//!   a VNNI `vpdpbusd` (unsigned × signed) multiplies it with signed int8 activations; the
//!   `+128` adds `128 × Σ xq` per activation block, which the kernel subtracts once per row of
//!   activations, not per weight row. One f32 scale per row.
//! * `Int4`: row `n` is `kp / 2` bytes; in each 64-byte chunk (128 weights) byte `i` holds
//!   weight `i` in its low nibble and weight `64 + i` in its high nibble, so one AND and one
//!   shift give two 64-weight vectors in order (tb-llm's layout interleaves even/odd columns).
//!   Nibbles stay unsigned 0..15; scales and zeros are f32 `[N, K / G]`.
//! * `Bf16` / `F32`: row-major `[N, K]` as given.

use super::act_quant::round_up;
use rayon::prelude::*;

pub enum Packed {
    Int8 { n: usize, k: usize, kp: usize, w: Vec<u8>, scale: Vec<f32> },
    Int4 { n: usize, k: usize, kp: usize, group: usize, w: Vec<u8>, scale: Vec<f32>, zero: Vec<f32> },
    Bf16 { n: usize, k: usize, w: Vec<u16> },
    F32 { n: usize, k: usize, w: Vec<f32> },
}

pub type Result<T> = std::result::Result<T, String>;

/// A filled `Vec` whose big allocations ask Linux for transparent huge pages before the first
/// touch: a GEMV streams hundreds of MB once per token, and with 4 KiB pages the TLB misses
/// cost a large share of the bandwidth (PyTorch's allocator does the same for its tensors).
pub fn big_vec<T: Copy>(n: usize, fill: T) -> Vec<T> {
    let mut v: Vec<T> = Vec::with_capacity(n);
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let bytes = n * std::mem::size_of::<T>();
        if bytes >= 4 * HUGE {
            extern "C" {
                fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: i32) -> i32;
            }
            let start = (v.as_ptr() as usize).div_ceil(HUGE) * HUGE;
            let end = (v.as_ptr() as usize + bytes) / HUGE * HUGE;
            if end > start {
                // SAFETY: the range lies inside the allocation; MADV_HUGEPAGE (14) only
                // changes how the kernel backs it. Failure is harmless (4 KiB pages).
                unsafe { madvise(start as *mut std::ffi::c_void, end - start, 14) };
            }
        }
    }
    v.resize(n, fill);
    v
}

impl Packed {
    pub fn shape(&self) -> (usize, usize) {
        match self {
            Packed::Int8 { n, k, .. } | Packed::Int4 { n, k, .. } | Packed::Bf16 { n, k, .. } | Packed::F32 { n, k, .. } => {
                (*n, *k)
            }
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Packed::Int8 { .. } => "int8",
            Packed::Int4 { .. } => "int4",
            Packed::Bf16 { .. } => "bf16",
            Packed::F32 { .. } => "fp32",
        }
    }

    /// Bytes a GEMV streams: the packed weights and their scales.
    pub fn nbytes(&self) -> usize {
        match self {
            Packed::Int8 { w, scale, .. } => w.len() + 4 * scale.len(),
            Packed::Int4 { w, scale, zero, .. } => w.len() + 4 * (scale.len() + zero.len()),
            Packed::Bf16 { w, .. } => 2 * w.len(),
            Packed::F32 { w, .. } => 4 * w.len(),
        }
    }

    pub fn int8(n: usize, k: usize, q: &[i8], scale: &[f32]) -> Result<Packed> {
        check_len("qweight", q.len(), n * k)?;
        check_len("scales", scale.len(), n)?;
        if let Some(i) = q.iter().position(|&v| v == i8::MIN) {
            let r = i / k;
            return Err(format!("int8 weight row {r} holds -128; tb-llm's int8 layout is symmetric in [-127, 127]"));
        }
        let kp = round_up(k.max(1), 128);
        let mut w = big_vec(n * kp, 128u8);
        w.par_chunks_mut(kp).zip(q.par_chunks(k.max(1))).for_each(|(dst, src)| {
            for (d, &v) in dst.iter_mut().zip(src) {
                *d = (v as i16 + 128) as u8;
            }
        });
        Ok(Packed::Int8 { n, k, kp, w, scale: scale.to_vec() })
    }

    /// `packed` is tb-llm's `[N, K / 2]` uint8 (column `2j` low nibble, `2j + 1` high).
    pub fn int4(n: usize, k: usize, group: usize, packed: &[u8], scale: &[f32], zero: &[f32]) -> Result<Packed> {
        if !matches!(group, 32 | 64 | 128) || !k.is_multiple_of(group) {
            return Err(format!("int4 group size must be 32, 64 or 128 and divide K={k}, got {group}"));
        }
        check_len("qweight", packed.len(), n * k / 2)?;
        check_len("scales", scale.len(), n * k / group)?;
        check_len("zeros", zero.len(), n * k / group)?;
        let kp = round_up(k, 128);
        let mut w = big_vec(n * kp / 2, 0u8);
        w.par_chunks_mut(kp / 2).zip(packed.par_chunks(k / 2)).for_each(|(dst, src)| {
            int4_pack_row(|c| if c % 2 == 0 { src[c / 2] & 15 } else { src[c / 2] >> 4 }, k, dst)
        });
        Ok(Packed::Int4 { n, k, kp, group, w, scale: scale.to_vec(), zero: zero.to_vec() })
    }

    /// Rows `ids` dequantized to f32 into `out` (`ids.len()` rows of K): the embedding lookup,
    /// with tb-llm's `QuantWeight.rows` arithmetic (`q * s`; `(q - 8) * s + z`), bit for bit.
    pub fn rows(&self, ids: &[usize], out: &mut [f32]) -> Result<()> {
        let (n, k) = self.shape();
        check_len("out", out.len(), ids.len() * k)?;
        if let Some(&bad) = ids.iter().find(|&&r| r >= n) {
            return Err(format!("row {bad} is out of range for a weight of {n} rows"));
        }
        for (&r, o) in ids.iter().zip(out.chunks_mut(k.max(1))) {
            match self {
                Packed::Int8 { kp, w, scale, .. } => {
                    for (d, &v) in o.iter_mut().zip(&w[r * kp..r * kp + k]) {
                        *d = (v as i16 - 128) as f32 * scale[r];
                    }
                }
                Packed::Int4 { kp, group, w, scale, zero, .. } => {
                    let (row, ng) = (&w[r * kp / 2..(r + 1) * kp / 2], k / group);
                    for (c, d) in o.iter_mut().enumerate() {
                        let (chunk, i) = (c / 128, c % 128);
                        let byte = row[chunk * 64 + i % 64];
                        let q = if i < 64 { byte & 15 } else { byte >> 4 };
                        let g = r * ng + c / group;
                        *d = (q as f32 - 8.0) * scale[g] + zero[g];
                    }
                }
                Packed::Bf16 { w, .. } => {
                    for (d, &b) in o.iter_mut().zip(&w[r * k..(r + 1) * k]) {
                        *d = f32::from_bits((b as u32) << 16);
                    }
                }
                Packed::F32 { w, .. } => o.copy_from_slice(&w[r * k..(r + 1) * k]),
            }
        }
        Ok(())
    }

    pub fn bf16(n: usize, k: usize, w: &[u16]) -> Result<Packed> {
        check_len("weight", w.len(), n * k)?;
        let mut v = big_vec(n * k, 0u16);
        v.copy_from_slice(w);
        Ok(Packed::Bf16 { n, k, w: v })
    }

    pub fn f32(n: usize, k: usize, w: &[f32]) -> Result<Packed> {
        check_len("weight", w.len(), n * k)?;
        let mut v = big_vec(n * k, 0f32);
        v.copy_from_slice(w);
        Ok(Packed::F32 { n, k, w: v })
    }
}

/// One row of the int4 kernel layout (`dst`, `kp / 2` bytes, zeroed) from the nibble of each
/// column `c < k` given by `nib(c)`.
pub fn int4_pack_row(nib: impl Fn(usize) -> u8, k: usize, dst: &mut [u8]) {
    for col in 0..k {
        let (chunk, i) = (col / 128, col % 128);
        dst[chunk * 64 + i % 64] |= if i < 64 { nib(col) } else { nib(col) << 4 };
    }
}

fn check_len(what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(format!("{what} has {got} elements, expected {want}"));
    }
    Ok(())
}
