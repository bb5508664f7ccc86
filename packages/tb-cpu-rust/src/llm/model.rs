//! A whole decoder forward pass in one call: every layer of tb-llm's `Decoder.reference_forward`
//! (Llama, Mistral, Qwen2/3, Phi-3, Gemma 1/2 switches) on packed weights, writing this step's
//! keys and values into the KV cache at slots `length ..` and returning the logits.
//!
//! Activations are quantized once per weight kind and shared by q/k/v and by gate/up, and each
//! group of projections runs as one parallel region (`gemv::run`). The caller runs `step` on a
//! rayon worker, so those regions fork from inside the pool instead of waking it from outside.
//!
//! Any number of rows: decode steps and whole prompts alike. From `attn::MIN_QUERIES` query
//! positions on, attention takes the prefill kernel (`attn`; the decode one when a softcap or
//! the head dim rules it out), and the per-row elementwise work (norms, gated activation,
//! residual adds) is spread over the pool once there are `PAR_ROWS` rows.

use super::attn;
use super::attn_decode;
use super::gemv::{self, Isa, Job};
use super::ops::{self, V4};
use super::packed::Packed;
use rayon::prelude::*;

/// Something that holds a packed weight (a Python `LLMWeight`, or a `Packed` in tests).
pub trait AsPacked: Sync {
    fn packed(&self) -> &Packed;
}

impl AsPacked for Packed {
    fn packed(&self) -> &Packed {
        self
    }
}

pub struct Lin<W> {
    pub w: W,
    pub bias: Option<Vec<f32>>,
}

pub struct Layer<W> {
    pub input_norm: Vec<f32>,
    pub post_attn_norm: Vec<f32>,
    pub pre_ff_norm: Option<Vec<f32>>,
    pub post_ff_norm: Option<Vec<f32>>,
    /// `[q, k, v]`, or `[qkv]` fused (rows q, then k, then v)
    pub qkv: Vec<Lin<W>>,
    pub o: Lin<W>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// `[gate, up]`, or `[gate_up]` fused (gate rows first)
    pub gate_up: Vec<Lin<W>>,
    pub down: Lin<W>,
    pub sliding: bool,
}

pub struct Config {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub vocab: usize,
    pub eps: f32,
    pub norm_offset: f32,
    pub attn_scale: f32,
    pub attn_softcap: Option<f32>,
    pub final_softcap: Option<f32>,
    pub window: Option<i64>,
    pub act: ops::Act,
    pub embed_scale: Option<f32>,
}

pub struct Model<W> {
    pub cfg: Config,
    pub layers: Vec<Layer<W>>,
    pub norm: Vec<f32>,
    pub head: W,
}

/// The KV cache of tb-llm (`torchburn.llm.KVCache`): per layer `[B, KV, cap, D]` f32 keys
/// and values, and `pos` `[B, cap]` (the token position in each slot, -1 = none).
pub struct Cache<'a> {
    pub k: &'a [*mut f32],
    pub v: &'a [*mut f32],
    pub cap: usize,
    pub pos: &'a [i64],
    pub length: usize,
}
// SAFETY: the buffers are only touched by `Model::step`, which owns them for the call.
unsafe impl Send for Cache<'_> {}
unsafe impl Sync for Cache<'_> {}

/// One step's inputs: `x` `[B * T, hidden]` (the embedding rows), `positions` `[B, T]`,
/// `cos` / `sin` `[B, T, R]`.
pub struct Step<'a> {
    pub x: &'a mut [f32],
    pub b: usize,
    pub t: usize,
    pub positions: &'a [i64],
    pub cos: &'a [f32],
    pub sin: &'a [f32],
    pub rot: usize,
    pub last_only: bool,
}

/// The attention masks of tb-llm's `Decoder._masks` as bytes `[B, T, end]`: slot `s` is
/// visible from a query at position `p` when it holds a token at `0 <= pos <= p` (and
/// `p - pos < window` for the sliding mask); a query that sees nothing sees every slot.
pub fn masks(positions: &[i64], pos: &[i64], cap: usize, b: usize, t: usize, end: usize, window: Option<i64>) -> (Vec<u8>, Option<Vec<u8>>) {
    let mut full = vec![0u8; b * t * end];
    let mut win = window.map(|_| vec![0u8; b * t * end]);
    for bi in 0..b {
        for ti in 0..t {
            let qp = positions[bi * t + ti];
            let row = (bi * t + ti) * end;
            let (mut any_f, mut any_w) = (false, false);
            for s in 0..end {
                let kp = pos[bi * cap + s];
                let ok = kp >= 0 && qp - kp >= 0;
                full[row + s] = ok as u8;
                any_f |= ok;
                if let (Some(w), Some(wm)) = (window, win.as_mut()) {
                    let okw = ok && qp - kp < w;
                    wm[row + s] = okw as u8;
                    any_w |= okw;
                }
            }
            if !any_f {
                full[row..row + end].fill(1);
            }
            if let Some(wm) = win.as_mut() {
                if !any_w {
                    wm[row..row + end].fill(1);
                }
            }
        }
    }
    (full, win)
}

/// Rows from which the step's elementwise work runs in parallel (a prompt, not a decode step).
const PAR_ROWS: usize = 32;
/// Rows per parallel task.
const ROWS_PER_TASK: usize = 8;

/// `f(x rows, out rows)` over runs of whole rows (`dx` / `dout` values per row), over the pool
/// when there are many rows.
fn rows_map(x: &[f32], dx: usize, out: &mut [f32], dout: usize, f: impl Fn(&[f32], &mut [f32]) + Sync) {
    if x.len() >= PAR_ROWS * dx {
        out.par_chunks_mut(dout * ROWS_PER_TASK).zip(x.par_chunks(dx * ROWS_PER_TASK)).for_each(|(o, xi)| f(xi, o));
    } else {
        f(x, out);
    }
}

fn rms_rows(x: &[f32], w: &[f32], eps: f32, offset: f32, out: &mut [f32]) {
    rows_map(x, w.len(), out, w.len(), |xi, o| ops::rms_norm(xi, w, eps, offset, o));
}

/// `acc += y`, over the pool for many rows of `d`.
fn add_rows(acc: &mut [f32], y: &[f32], d: usize) {
    if acc.len() >= PAR_ROWS * d {
        acc.par_chunks_mut(d * ROWS_PER_TASK).zip(y.par_chunks(d * ROWS_PER_TASK)).for_each(|(a, b)| a.iter_mut().zip(b).for_each(|(a, v)| *a += v));
    } else {
        acc.iter_mut().zip(y).for_each(|(a, v)| *a += v);
    }
}

fn rms_inplace_strided(buf: &mut [f32], rows: usize, ld: usize, off: usize, heads: usize, d: usize, w: &[f32], eps: f32, offset: f32) {
    let mut tmp = vec![0f32; d];
    for r in 0..rows {
        for h in 0..heads {
            let s = r * ld + off + h * d;
            ops::rms_norm(&buf[s..s + d], w, eps, offset, &mut tmp);
            buf[s..s + d].copy_from_slice(&tmp);
        }
    }
}

/// `out[:, col + ..]` (row stride `ld`) = `x @ W^T + bias` for each weight, with activations
/// prepared once per compatible weight kind, all in one parallel region.
fn project<W: AsPacked>(lins: &[Lin<W>], x: &[f32], m: usize, out: &mut [f32], ld: usize, isa: Isa) {
    let first = lins[0].w.packed();
    let shared = gemv::prepare_rows(first, x, m, isa);
    let own: Vec<Option<Vec<gemv::Act>>> = lins
        .iter()
        .map(|l| if gemv::same_prep(first, l.w.packed()) { None } else { Some(gemv::prepare_rows(l.w.packed(), x, m, isa)) })
        .collect();
    let mut col = 0;
    let mut jobs = Vec::with_capacity(lins.len());
    for (l, o) in lins.iter().zip(&own) {
        let p = l.w.packed();
        let n = p.shape().0;
        assert!(col + n <= ld && out.len() >= (m.max(1) - 1) * ld + col + n);
        // SAFETY: column ranges of the jobs are disjoint and inside `out` (asserted).
        jobs.push(Job { p, acts: o.as_deref().unwrap_or(&shared), out: unsafe { out.as_mut_ptr().add(col) }, ld, bias: l.bias.as_deref() });
        col += n;
    }
    // SAFETY: see above; `out` outlives the call.
    unsafe { gemv::run(&jobs, isa) };
}

impl<W: AsPacked> Model<W> {
    /// Runs one forward step; `logits` is `[B, V]` (`last_only`) or `[B * T, V]`.
    ///
    /// # Safety
    /// The cache pointers must address live `[B, KV, cap, D]` f32 buffers that nothing else
    /// reads or writes during the call, `cache.length + T <= cap`, and the slices must have the
    /// documented shapes (the pyo3 layer checks them).
    pub unsafe fn step(&self, s: Step, cache: &Cache, logits: &mut [f32], isa: Isa) {
        let c = &self.cfg;
        let (b, t) = (s.b, s.t);
        let m = b * t;
        let (hq, hkv, d, hid) = (c.heads, c.kv_heads, c.head_dim, c.hidden);
        let (qd, kvd) = (hq * d, hkv * d);
        let wq = qd + 2 * kvd;
        let inter = c.intermediate;
        let end = cache.length + t;
        let x = s.x;
        if let Some(sc) = c.embed_scale {
            x.iter_mut().for_each(|v| *v *= sc);
        }
        let (full, win) = masks(s.positions, cache.pos, cache.cap, b, t, end, c.window);
        let mut h = vec![0f32; m * hid];
        let mut qkv = vec![0f32; m * wq];
        let mut qr = vec![0f32; b * hq * t * d];
        let mut kr = vec![0f32; b * hkv * t * d];
        let mut att = vec![0f32; b * hq * t * d];
        let mut o_in = vec![0f32; m * qd];
        let mut gu = vec![0f32; m * 2 * inter];
        let mut act = vec![0f32; m * inter];
        let mut y = vec![0f32; m * hid];
        let prefill_attn = t >= attn::MIN_QUERIES && attn::takes(d, c.attn_softcap);
        let r = s.rot;
        let cos = V4 { ptr: s.cos.as_ptr(), sizes: [b, 1, t, r], strides: [t * r, 0, r, 1] };
        let sin = V4 { ptr: s.sin.as_ptr(), sizes: [b, 1, t, r], strides: [t * r, 0, r, 1] };
        let (eps, off) = (c.eps, c.norm_offset);
        for (li, layer) in self.layers.iter().enumerate() {
            rms_rows(x, &layer.input_norm, eps, off, &mut h);
            project(&layer.qkv, &h, m, &mut qkv, wq, isa);
            if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                rms_inplace_strided(&mut qkv, m, wq, 0, hq, d, qn, eps, off);
                rms_inplace_strided(&mut qkv, m, wq, qd, hkv, d, kn, eps, off);
            }
            // [B, T, H, D] rows of width wq viewed as [B, H, T, D]
            let view = |col: usize, heads: usize| V4 {
                ptr: qkv.as_ptr().add(col),
                sizes: [b, heads, t, d],
                strides: [t * wq, d, wq, 1],
            };
            ops::rope(view(0, hq), cos, sin, &mut qr);
            ops::rope(view(qd, hkv), cos, sin, &mut kr);
            let (kc, vc) = (cache.k[li], cache.v[li]);
            for bi in 0..b {
                for kh in 0..hkv {
                    for ti in 0..t {
                        let slot = ((bi * hkv + kh) * cache.cap + cache.length + ti) * d;
                        let src = ((bi * hkv + kh) * t + ti) * d;
                        std::ptr::copy_nonoverlapping(kr.as_ptr().add(src), kc.add(slot), d);
                        let vsrc = (bi * t + ti) * wq + qd + kvd + kh * d;
                        std::ptr::copy_nonoverlapping(qkv.as_ptr().add(vsrc), vc.add(slot), d);
                    }
                }
            }
            let kv_view = |p: *mut f32| V4 {
                ptr: p as *const f32,
                sizes: [b, hkv, end, d],
                strides: [hkv * cache.cap * d, cache.cap * d, d, 1],
            };
            let qv = V4 { ptr: qr.as_ptr(), sizes: [b, hq, t, d], strides: [hq * t * d, t * d, d, 1] };
            let mask = if layer.sliding { win.as_deref().unwrap_or(&full) } else { &full };
            if prefill_attn {
                attn::prefill(qv, kv_view(kc), kv_view(vc), mask, c.attn_scale, &mut att);
            } else {
                attn_decode::attention(qv, kv_view(kc), kv_view(vc), mask, c.attn_scale, c.attn_softcap, &mut att);
            }
            for bi in 0..b {
                for hh in 0..hq {
                    for ti in 0..t {
                        let src = ((bi * hq + hh) * t + ti) * d;
                        let dst = (bi * t + ti) * qd + hh * d;
                        o_in[dst..dst + d].copy_from_slice(&att[src..src + d]);
                    }
                }
            }
            project(std::slice::from_ref(&layer.o), &o_in, m, &mut h, hid, isa);
            if let Some(pre) = &layer.pre_ff_norm {
                rms_rows(&h, &layer.post_attn_norm, eps, off, &mut y);
                add_rows(x, &y, hid);
                rms_rows(x, pre, eps, off, &mut h);
            } else {
                add_rows(x, &h, hid);
                rms_rows(x, &layer.post_attn_norm, eps, off, &mut h);
            }
            project(&layer.gate_up, &h, m, &mut gu, 2 * inter, isa);
            rows_map(&gu, 2 * inter, &mut act, inter, |g, a| {
                for (row, out) in g.chunks_exact(2 * inter).zip(a.chunks_exact_mut(inter)) {
                    ops::gated_act(&row[..inter], &row[inter..], c.act, out);
                }
            });
            project(std::slice::from_ref(&layer.down), &act, m, &mut h, hid, isa);
            if let Some(post) = &layer.post_ff_norm {
                rms_rows(&h, post, eps, off, &mut y);
                h.copy_from_slice(&y);
            }
            add_rows(x, &h, hid);
        }
        let rows: Vec<usize> = if s.last_only { (0..b).map(|bi| bi * t + t - 1).collect() } else { (0..m).collect() };
        let mut xs = vec![0f32; rows.len() * hid];
        for (i, &r) in rows.iter().enumerate() {
            rms_rows(&x[r * hid..(r + 1) * hid], &self.norm, eps, off, &mut xs[i * hid..(i + 1) * hid]);
        }
        let head = Lin { w: &self.head, bias: None };
        project(std::slice::from_ref(&head), &xs, rows.len(), logits, c.vocab, isa);
        if let Some(cap) = c.final_softcap {
            logits.iter_mut().for_each(|v| *v = (*v / cap).tanh() * cap);
        }
    }
}

impl<W: AsPacked> AsPacked for &W {
    fn packed(&self) -> &Packed {
        (*self).packed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_follow_tb_llm() {
        // row 0: left-padded (slot 0 empty), row 1 full; one new token at slot 3
        let cap = 5;
        let pos = [-1i64, 0, 1, 2, -1, 0, 1, 2, 3, -1];
        let positions = [2i64, 3];
        let (full, win) = masks(&positions, &pos, cap, 2, 1, 4, Some(2));
        assert_eq!(full, vec![0, 1, 1, 1, 1, 1, 1, 1]);
        assert_eq!(win.unwrap(), vec![0, 0, 1, 1, 0, 0, 1, 1]);
        // a padding query (position -1) sees nothing, so it sees every slot
        let (full, _) = masks(&[-1], &[0, -1], 2, 1, 1, 2, None);
        assert_eq!(full, vec![1, 1]);
        // several queries: causal among this step's slots
        let (full, _) = masks(&[0, 1], &[0, 1], 2, 1, 2, 2, None);
        assert_eq!(full, vec![1, 0, 1, 1]);
    }
}
