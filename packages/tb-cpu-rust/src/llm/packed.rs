//! Weight layouts of the LLM kernels, built once at load time from tb-llm's `QuantWeight`
//! layouts (`torchburn.llm`) and owned by Rust.
//!
//! * `Int8`: row `n` is `kp` bytes (`kp` = K rounded up to 128) holding `w + 128` as `u8`, so
//!   a VNNI `vpdpbusd` (unsigned × signed) multiplies it with signed int8 activations; the
//!   `+128` adds `128 × Σ xq` per activation block, which the kernel subtracts once per row of
//!   activations, not per weight row. One f32 scale per row.
//! * `Int4`: rows in tiles of `INT4_ROWS` (8; the last tile padded with zero-scale rows), each
//!   tile stored block after block (32 columns per block, `INT4_BLOCK_BYTES` bytes): byte
//!   `m * 32 + l * 4 + i` of a block (`m` < 4, row `l` < 8, `i` < 4) holds column `8m + i` of
//!   row `l` in its low nibble and column `8m + 4 + i` in its high nibble. One 32-byte load,
//!   an AND and a shift give four columns of all eight rows, so a `vpmaddubsw` against four
//!   activation bytes broadcast to every row yields the eight rows' dot products in eight
//!   lanes: the kernel converts and scales once per block for eight rows, not once per row.
//!   Nibbles stay unsigned 0..15 (`(q - 8) * s + z`); scales and zeros are binary16 bits
//!   (`half`; tb-llm's quantizer makes them float16 values, so nothing is lost), laid out per
//!   tile as `[groups][8]` (one 16-byte load and one F16C widening per group for the tile's
//!   eight rows). At group 32 a weight costs 0.5 + 4 / 32 = 0.625 bytes.
//! * `Bf16` / `F32`: row-major `[N, K]` as given.

use super::act_quant::round_up;
use super::half::{exact_f16, f16_to_f32, f32_to_f16};
use super::huge::HugeBuf;
use rayon::prelude::*;

pub enum Packed {
    Int8 { n: usize, k: usize, kp: usize, w: HugeBuf<u8>, scale: Vec<f32> },
    /// `kp`: K rounded up to 128 (the length activations are quantized to); `scale` and
    /// `zero`: binary16 bits
    Int4 { n: usize, k: usize, kp: usize, group: usize, w: HugeBuf<u8>, scale: HugeBuf<u16>, zero: HugeBuf<u16> },
    Bf16 { n: usize, k: usize, w: HugeBuf<u16> },
    F32 { n: usize, k: usize, w: HugeBuf<f32> },
}

pub type Result<T> = std::result::Result<T, String>;

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
            Packed::Int4 { w, scale, zero, .. } => w.len() + 2 * (scale.len() + zero.len()),
            Packed::Bf16 { w, .. } => 2 * w.len(),
            Packed::F32 { w, .. } => 4 * w.len(),
        }
    }

    pub fn int8(n: usize, k: usize, q: &[i8], scale: &[f32]) -> Result<Packed> {
        check_len("qweight", q.len(), n * k)?;
        check_len("scales", scale.len(), n)?;
        if let Some(i) = q.iter().position(|&v| v == i8::MIN) {
            let r = i / k;
            return Err(format!("int8 weight row {r} holds -128; the int8 layout of `torchburn.llm` is symmetric in [-127, 127]"));
        }
        let kp = round_up(k.max(1), 128);
        let mut w = HugeBuf::filled(n * kp, 128u8);
        w.par_chunks_mut(kp).zip(q.par_chunks(k.max(1))).for_each(|(dst, src)| {
            for (d, &v) in dst.iter_mut().zip(src) {
                *d = (v as i16 + 128) as u8;
            }
        });
        Ok(Packed::Int8 { n, k, kp, w, scale: scale.to_vec() })
    }

    /// `packed` is tb-llm's `[N, K / 2]` uint8 (column `2j` low nibble, `2j + 1` high); every
    /// scale and zero must be a float16 value (as `torchburn.llm.quantize_int4` makes them): one
    /// that is not is an error, not a silent rounding.
    pub fn int4(n: usize, k: usize, group: usize, packed: &[u8], scale: &[f32], zero: &[f32]) -> Result<Packed> {
        if !matches!(group, 32 | 64 | 128) || !k.is_multiple_of(group) {
            return Err(format!("int4 group size must be 32, 64 or 128 and divide K={k}, got {group}"));
        }
        check_len("qweight", packed.len(), n * k / 2)?;
        check_len("scales", scale.len(), n * k / group)?;
        check_len("zeros", zero.len(), n * k / group)?;
        for (what, v) in [("scales", scale), ("zeros", zero)] {
            if let Some(i) = v.iter().position(|&x| exact_f16(x).is_none()) {
                return Err(format!(
                    "int4 {what}[{}, {}] = {:e} is not a float16 value (torchburn.llm.quantize_int4 rounds scales and zeros to float16)",
                    i / (k / group),
                    i % (k / group),
                    v[i]
                ));
            }
        }
        let ng = k / group;
        Ok(int4_tiles(n, k, group, |r, nib, sr, zr, _| {
            for (c, d) in nib.iter_mut().enumerate() {
                let b = packed[r * k / 2 + c / 2];
                *d = if c % 2 == 0 { b & 15 } else { b >> 4 };
            }
            sr.copy_from_slice(&scale[r * ng..(r + 1) * ng]);
            zr.copy_from_slice(&zero[r * ng..(r + 1) * ng]);
        }))
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
                Packed::Int4 { k, group, w, scale, zero, .. } => {
                    for (c, d) in o.iter_mut().enumerate() {
                        let q = int4_nibble(w, *k, r, c);
                        let g = int4_group_index(*k / group, r, c / group);
                        *d = (q as f32 - 8.0) * f16_to_f32(scale[g]) + f16_to_f32(zero[g]);
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
        let mut v = HugeBuf::filled(n * k, 0u16);
        par_copy(&mut v, w);
        Ok(Packed::Bf16 { n, k, w: v })
    }

    pub fn f32(n: usize, k: usize, w: &[f32]) -> Result<Packed> {
        check_len("weight", w.len(), n * k)?;
        let mut v = HugeBuf::filled(n * k, 0f32);
        par_copy(&mut v, w);
        Ok(Packed::F32 { n, k, w: v })
    }
}

/// Rows per int4 tile.
pub const INT4_ROWS: usize = 8;
/// Bytes of one 32-column block of an int4 tile (8 rows x 32 nibbles).
pub const INT4_BLOCK_BYTES: usize = 128;

/// Byte of the int4 layout holding column `c` of row `r`, and whether in the high nibble.
#[inline]
fn int4_byte(k: usize, r: usize, c: usize) -> (usize, bool) {
    let (tile, l) = (r / INT4_ROWS, r % INT4_ROWS);
    let (b, j) = (c / 32, c % 32);
    let (m, hi, i) = (j / 8, j % 8 >= 4, j % 4);
    ((tile * (k / 32) + b) * INT4_BLOCK_BYTES + m * 32 + l * 4 + i, hi)
}

/// The nibble (0..15) of column `c` of row `r`.
#[inline]
fn int4_nibble(w: &[u8], k: usize, r: usize, c: usize) -> u8 {
    let (at, hi) = int4_byte(k, r, c);
    if hi {
        w[at] >> 4
    } else {
        w[at] & 15
    }
}

/// Index of row `r`'s scale / zero of group `g` (`ng` groups per row).
#[inline]
fn int4_group_index(ng: usize, r: usize, g: usize) -> usize {
    ((r / INT4_ROWS) * ng + g) * INT4_ROWS + r % INT4_ROWS
}

/// The int4 layout of `n` rows, tiles filled in parallel: `row(r, nibbles, scales, zeros,
/// scratch)` writes row `r`'s K nibbles (column order) and its groups' scales and zeros, which
/// must be float16 values (stored as binary16 bits; `scratch`: a per-thread buffer it may use,
/// e.g. for the row in f32).
pub fn int4_tiles(n: usize, k: usize, group: usize, row: impl Fn(usize, &mut [u8], &mut [f32], &mut [f32], &mut Vec<f32>) + Sync) -> Packed {
    let ng = k / group;
    let tiles = n.div_ceil(INT4_ROWS);
    let tile_bytes = (k / 32) * INT4_BLOCK_BYTES;
    let mut w = HugeBuf::filled(tiles * tile_bytes, 0u8);
    let mut scale = HugeBuf::filled(tiles * ng * INT4_ROWS, 0u16);
    let mut zero = HugeBuf::filled(tiles * ng * INT4_ROWS, 0u16);
    w.par_chunks_mut(tile_bytes.max(1))
        .zip(scale.par_chunks_mut((ng * INT4_ROWS).max(1)))
        .zip(zero.par_chunks_mut((ng * INT4_ROWS).max(1)))
        .enumerate()
        .for_each_init(
            || (vec![0u8; k], vec![0f32; ng], vec![0f32; ng], Vec::new()),
            |(nib, sr, zr, buf), (t, ((wt, st), zt))| {
                for l in 0..INT4_ROWS.min(n - t * INT4_ROWS) {
                    row(t * INT4_ROWS + l, nib, sr, zr, buf);
                    for (c, &q) in nib.iter().enumerate() {
                        let (at, hi) = int4_byte(k, l, c);
                        wt[at] |= if hi { q << 4 } else { q };
                    }
                    for g in 0..ng {
                        (st[g * INT4_ROWS + l], zt[g * INT4_ROWS + l]) = (f32_to_f16(sr[g]), f32_to_f16(zr[g]));
                        debug_assert!(exact_f16(sr[g]).is_some() && exact_f16(zr[g]).is_some());
                    }
                }
            },
        );
    Packed::Int4 { n, k, kp: round_up(k, 128), group, w, scale, zero }
}

/// `dst.copy_from_slice(src)` over the pool: the first writes to a fresh mapping fault its
/// pages in (each a 2 MiB zeroing), which spreads over the cores this way.
fn par_copy<T: Copy + Send + Sync>(dst: &mut [T], src: &[T]) {
    const CHUNK: usize = 1 << 18;
    dst.par_chunks_mut(CHUNK).zip(src.par_chunks(CHUNK)).for_each(|(d, s)| d.copy_from_slice(s));
}

fn check_len(what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(format!("{what} has {got} elements, expected {want}"));
    }
    Ok(())
}
