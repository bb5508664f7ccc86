//! pyo3 layer of the LLM kernels: validates every tensor descriptor (pointer, sizes, strides,
//! dtype) and the shapes between them, then calls the plain-Rust kernels. A bad argument is a
//! `ValueError`, never undefined behaviour. Weights are copied into Rust-owned `LLMWeight`s.

use crate::llm::{attn, attn_decode};
use crate::llm::gemv::{self, detect};
use crate::llm::model::{self, AsPacked, Lin, Model};
use crate::llm::ops::{self, V4};
use crate::llm::packed::Packed;
use crate::llm::quant;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

type TensorArg = (usize, Vec<i64>, Vec<i64>, String);

fn err(e: impl Into<String>) -> PyErr {
    PyValueError::new_err(e.into())
}

struct T {
    ptr: usize,
    sizes: Vec<usize>,
    strides: Vec<usize>,
    elem: usize,
}

impl T {
    fn numel(&self) -> usize {
        self.sizes.iter().product()
    }
    fn contiguous(&self) -> bool {
        let mut acc = 1;
        for i in (0..self.sizes.len()).rev() {
            if self.sizes[i] != 1 && self.strides[i] != acc {
                return false;
            }
            acc *= self.sizes[i];
        }
        true
    }
    /// Bytes from the first to one past the last element.
    fn span(&self) -> (usize, usize) {
        if self.numel() == 0 {
            return (self.ptr, self.ptr);
        }
        let last: usize = self.sizes.iter().zip(&self.strides).map(|(s, st)| (s - 1) * st).sum();
        (self.ptr, self.ptr + (last + 1) * self.elem)
    }
    /// # Safety
    /// The descriptor must describe a live, contiguous tensor of element type `E`.
    unsafe fn slice<'a, E>(&self) -> &'a [E] {
        if self.numel() == 0 {
            return &[];
        }
        std::slice::from_raw_parts(self.ptr as *const E, self.numel())
    }
    /// # Safety
    /// As `slice`, and nothing else may alias it during the call.
    unsafe fn slice_mut<'a, E>(&self) -> &'a mut [E] {
        if self.numel() == 0 {
            return &mut [];
        }
        std::slice::from_raw_parts_mut(self.ptr as *mut E, self.numel())
    }
    fn v4(&self) -> V4 {
        V4 {
            ptr: self.ptr as *const f32,
            sizes: [self.sizes[0], self.sizes[1], self.sizes[2], self.sizes[3]],
            strides: [self.strides[0], self.strides[1], self.strides[2], self.strides[3]],
        }
    }
}

/// Checks one descriptor: dtype, rank, non-negative sizes and strides that do not overflow,
/// a non-null aligned pointer; with `contig`, a contiguous layout.
fn arg(a: TensorArg, what: &str, dtype: &str, rank: usize, contig: bool) -> PyResult<T> {
    let (ptr, sizes, strides, dt) = a;
    let dt = dt.trim_start_matches("torch.");
    if dt != dtype {
        return Err(err(format!("{what}: expected dtype {dtype}, got {dt}")));
    }
    if sizes.len() != rank || strides.len() != rank {
        return Err(err(format!("{what}: expected {rank} dims, got sizes {sizes:?} strides {strides:?}")));
    }
    let to = |v: &[i64], n: &str| -> PyResult<Vec<usize>> {
        v.iter().map(|&x| usize::try_from(x).map_err(|_| err(format!("{what}: negative {n} {v:?}")))).collect()
    };
    let elem = match dtype {
        "int64" => 8,
        "float32" => 4,
        "bfloat16" => 2,
        _ => 1,
    };
    let t = T { ptr, sizes: to(&sizes, "size")?, strides: to(&strides, "stride")?, elem };
    let mut last = 1usize;
    for (s, st) in t.sizes.iter().zip(&t.strides) {
        last = s
            .checked_mul(*st)
            .and_then(|x| x.checked_add(last))
            .and_then(|x| x.checked_mul(elem))
            .ok_or_else(|| err(format!("{what}: sizes {sizes:?} / strides {strides:?} overflow")))?
            / elem;
    }
    if t.numel() > 0 && (ptr == 0 || ptr % elem != 0) {
        return Err(err(format!("{what}: null or misaligned data pointer")));
    }
    if contig && !t.contiguous() {
        return Err(err(format!("{what}: must be contiguous, got sizes {sizes:?} strides {strides:?}")));
    }
    if rank == 4 && t.strides[3] != 1 && t.sizes[3] > 1 {
        return Err(err(format!("{what}: last dim must have stride 1, got strides {strides:?}")));
    }
    Ok(t)
}

fn same(what: &str, a: &[usize], b: &[usize]) -> PyResult<()> {
    if a != b {
        return Err(err(format!("{what}: shapes {a:?} and {b:?} differ")));
    }
    Ok(())
}

fn disjoint(out: &T, ins: &[&T]) -> PyResult<()> {
    let (a0, a1) = out.span();
    for t in ins {
        let (b0, b1) = t.span();
        if a0 < b1 && b0 < a1 {
            return Err(err("output overlaps an input"));
        }
    }
    Ok(())
}

/// A weight packed for the LLM kernels (owned by Rust, built once at load time).
#[pyclass(module = "tb_cpu_rust._native", frozen)]
pub struct LLMWeight {
    inner: Packed,
}

#[pymethods]
impl LLMWeight {
    /// `out[M, N] = x[M, K] @ W^T (+ bias[N])`, all float32 and contiguous; GIL released.
    #[pyo3(signature = (x, out, bias=None))]
    fn linear(&self, py: Python<'_>, x: TensorArg, out: TensorArg, bias: Option<TensorArg>) -> PyResult<()> {
        let (n, k) = self.inner.shape();
        let x = arg(x, "x", "float32", 2, true)?;
        let out = arg(out, "out", "float32", 2, true)?;
        if x.sizes[1] != k {
            return Err(err(format!("x has {} features but the weight takes {k}", x.sizes[1])));
        }
        same("out", &out.sizes, &[x.sizes[0], n])?;
        let bias = bias.map(|b| arg(b, "bias", "float32", 1, true)).transpose()?;
        if let Some(b) = &bias {
            same("bias", &b.sizes, &[n])?;
        }
        let mut ins = vec![&x];
        ins.extend(bias.as_ref());
        disjoint(&out, &ins)?;
        let m = x.sizes[0];
        // SAFETY: validated above; Python keeps the tensors alive for the call.
        let (xs, ys, bs) = unsafe { (x.slice::<f32>(), out.slice_mut::<f32>(), bias.as_ref().map(|b| b.slice::<f32>())) };
        let inner = &self.inner;
        let isa = detect();
        if n * k >= 1 << 16 {
            py.detach(move || gemv::linear(inner, xs, m, bs, ys, isa));
        } else {
            gemv::linear(inner, xs, m, bs, ys, isa);
        }
        Ok(())
    }

    /// `out[i] = W[ids[i]]` dequantized to float32 (the embedding lookup): `ids` `[M]` int64,
    /// `out` `[M, K]` float32 contiguous.
    fn rows(&self, ids: TensorArg, out: TensorArg) -> PyResult<()> {
        let (n, k) = self.inner.shape();
        let ids = arg(ids, "ids", "int64", 1, true)?;
        let out = arg(out, "out", "float32", 2, true)?;
        same("out", &out.sizes, &[ids.sizes[0], k])?;
        disjoint(&out, &[&ids])?;
        // SAFETY: validated above; Python keeps the tensors alive for the call.
        let (is, os) = unsafe { (ids.slice::<i64>(), out.slice_mut::<f32>()) };
        let rows = is
            .iter()
            .map(|&i| usize::try_from(i).ok().filter(|&r| r < n).ok_or_else(|| err(format!("token id {i} is out of range for {n} rows"))))
            .collect::<PyResult<Vec<usize>>>()?;
        self.inner.rows(&rows, os).map_err(err)
    }

    #[getter]
    fn shape(&self) -> (usize, usize) {
        self.inner.shape()
    }

    #[getter]
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.nbytes()
    }
}

impl AsPacked for Py<LLMWeight> {
    fn packed(&self) -> &Packed {
        &self.get().inner
    }
}

type LinArg = (Py<LLMWeight>, Option<TensorArg>);
type LayerArg = (
    TensorArg,         // input_norm
    TensorArg,         // post_attention_norm
    Option<TensorArg>, // pre_feedforward_norm (Gemma 2)
    Option<TensorArg>, // post_feedforward_norm (Gemma 2)
    Vec<LinArg>,       // [q, k, v] or [qkv]
    LinArg,            // o
    Option<TensorArg>, // q_norm (Qwen3)
    Option<TensorArg>, // k_norm
    Vec<LinArg>,       // [gate, up] or [gate_up]
    LinArg,            // down
    bool,              // sliding window applies
);
/// hidden, heads, kv_heads, head_dim, intermediate, vocab, eps, norm_offset, attn_scale,
/// attn_softcap, final_softcap, sliding_window
type ConfigArg = (usize, usize, usize, usize, usize, usize, f32, f32, f32, Option<f32>, Option<f32>, Option<i64>);

fn vec_f32(a: TensorArg, what: &str, len: usize) -> PyResult<Vec<f32>> {
    let t = arg(a, what, "float32", 1, true)?;
    same(what, &t.sizes, &[len])?;
    // SAFETY: validated contiguous f32 descriptor; copied before returning.
    Ok(unsafe { t.slice::<f32>() }.to_vec())
}

fn lin(a: LinArg, what: &str, n: usize, k: usize) -> PyResult<Lin<Py<LLMWeight>>> {
    let (w, bias) = a;
    let shape = w.get().inner.shape();
    if shape != (n, k) {
        return Err(err(format!("{what}: weight is {shape:?}, the config implies ({n}, {k})")));
    }
    let bias = bias.map(|b| vec_f32(b, what, n)).transpose()?;
    Ok(Lin { w, bias })
}

fn lins(a: Vec<LinArg>, what: &str, parts: &[usize], k: usize) -> PyResult<Vec<Lin<Py<LLMWeight>>>> {
    if a.len() == 1 {
        let n = parts.iter().sum();
        return Ok(vec![lin(a.into_iter().next().unwrap_or_else(|| unreachable!()), what, n, k)?]);
    }
    if a.len() != parts.len() {
        return Err(err(format!("{what}: expected 1 fused or {} weights, got {}", parts.len(), a.len())));
    }
    a.into_iter().zip(parts).map(|(l, &n)| lin(l, what, n, k)).collect()
}

/// A whole decoder (tb-llm's `Decoder`) over packed weights: `step` runs one forward pass,
/// every layer, in one call with the GIL released.
#[pyclass(module = "tb_cpu_rust._native", frozen)]
pub struct LLMModel {
    inner: Model<Py<LLMWeight>>,
}

/// The KV cache buffers of one `tb_llm.kv_cache.KVCache` allocation, checked once:
/// per layer `[B, KV, cap, D]` contiguous float32 keys and values.
#[pyclass(module = "tb_cpu_rust._native", frozen)]
pub struct LLMKVCache {
    k: Vec<usize>,
    v: Vec<usize>,
    shape: [usize; 4],
}

#[pymethods]
impl LLMKVCache {
    #[new]
    fn new(k: Vec<TensorArg>, v: Vec<TensorArg>) -> PyResult<Self> {
        if k.len() != v.len() || k.is_empty() {
            return Err(err("k and v must be non-empty lists of one tensor per layer"));
        }
        let mut shape = None;
        let mut spans = Vec::new();
        let (mut kp, mut vp) = (Vec::new(), Vec::new());
        for (i, (ka, va)) in k.into_iter().zip(v).enumerate() {
            for (a, out) in [(ka, &mut kp), (va, &mut vp)] {
                let t = arg(a, &format!("cache layer {i}"), "float32", 4, true)?;
                let s = [t.sizes[0], t.sizes[1], t.sizes[2], t.sizes[3]];
                if *shape.get_or_insert(s) != s {
                    return Err(err(format!("cache layer {i}: shape {s:?} differs from layer 0's")));
                }
                spans.push(t.span());
                out.push(t.ptr);
            }
        }
        spans.sort();
        if spans.windows(2).any(|w| w[1].0 < w[0].1) {
            return Err(err("cache tensors overlap"));
        }
        Ok(LLMKVCache { k: kp, v: vp, shape: shape.unwrap_or_default() })
    }
}

#[pymethods]
impl LLMModel {
    #[new]
    fn new(config: ConfigArg, act: &str, embed_scale: Option<f32>, layers: Vec<LayerArg>, norm: TensorArg, head: Py<LLMWeight>) -> PyResult<Self> {
        let (hidden, heads, kv_heads, head_dim, inter, vocab, eps, norm_offset, attn_scale, attn_softcap, final_softcap, window) = config;
        if kv_heads == 0 || heads % kv_heads != 0 || head_dim == 0 {
            return Err(err(format!("{heads} query heads are not a multiple of {kv_heads} KV heads")));
        }
        if attn_softcap.is_some_and(|c| c <= 0.0 || !c.is_finite()) || final_softcap.is_some_and(|c| c <= 0.0 || !c.is_finite()) {
            return Err(err("softcaps must be positive finite numbers"));
        }
        if window.is_some_and(|w| w <= 0) {
            return Err(err("sliding window must be positive"));
        }
        let act = ops::Act::parse(act).map_err(err)?;
        let (qd, kvd) = (heads * head_dim, kv_heads * head_dim);
        let mut out = Vec::with_capacity(layers.len());
        for (i, l) in layers.into_iter().enumerate() {
            let (inn, post, pre_ff, post_ff, qkv, o, qn, kn, gu, down, sliding) = l;
            let p = |what: &str| format!("layer {i} {what}");
            out.push(model::Layer {
                input_norm: vec_f32(inn, &p("input_norm"), hidden)?,
                post_attn_norm: vec_f32(post, &p("post_attention_norm"), hidden)?,
                pre_ff_norm: pre_ff.map(|a| vec_f32(a, &p("pre_feedforward_norm"), hidden)).transpose()?,
                post_ff_norm: post_ff.map(|a| vec_f32(a, &p("post_feedforward_norm"), hidden)).transpose()?,
                qkv: lins(qkv, &p("qkv"), &[qd, kvd, kvd], hidden)?,
                o: lin(o, &p("o"), hidden, qd)?,
                q_norm: qn.map(|a| vec_f32(a, &p("q_norm"), head_dim)).transpose()?,
                k_norm: kn.map(|a| vec_f32(a, &p("k_norm"), head_dim)).transpose()?,
                gate_up: lins(gu, &p("gate_up"), &[inter, inter], hidden)?,
                down: lin(down, &p("down"), hidden, inter)?,
                sliding,
            });
        }
        if out.iter().any(|l| l.q_norm.is_some() != l.k_norm.is_some()) {
            return Err(err("q_norm and k_norm come together"));
        }
        let norm = vec_f32(norm, "norm", hidden)?;
        let head = lin((head, None), "lm_head", vocab, hidden)?.w;
        let cfg = model::Config {
            hidden,
            heads,
            kv_heads,
            head_dim,
            intermediate: inter,
            vocab,
            eps,
            norm_offset,
            attn_scale,
            attn_softcap,
            final_softcap,
            window,
            act,
            embed_scale,
        };
        Ok(LLMModel { inner: Model { cfg, layers: out, norm, head } })
    }

    /// One forward pass. `x` `[B*T, hidden]` float32 (the embedding rows; overwritten),
    /// `positions` `[B, T]` int64, `cos`/`sin` `[B, T, R]` float32, `pos` `[B, cap]` int64 (the
    /// cache's slot positions, this step's already written), `length` the slots filled before
    /// this step, `logits` `[B, V]` (`last_only`) or `[B*T, V]` float32. Writes this step's keys
    /// and values into the cache at slots `length .. length + T`.
    #[pyo3(signature = (x, positions, cos, sin, pos, length, cache, logits, last_only))]
    fn step(
        &self,
        py: Python<'_>,
        x: TensorArg,
        positions: TensorArg,
        cos: TensorArg,
        sin: TensorArg,
        pos: TensorArg,
        length: usize,
        cache: &LLMKVCache,
        logits: TensorArg,
        last_only: bool,
    ) -> PyResult<()> {
        let c = &self.inner.cfg;
        let pa = arg(positions, "positions", "int64", 2, true)?;
        let (b, t) = (pa.sizes[0], pa.sizes[1]);
        let x = arg(x, "x", "float32", 2, true)?;
        same("x", &x.sizes, &[b * t, c.hidden])?;
        let cs = arg(cos, "cos", "float32", 3, true)?;
        let sn = arg(sin, "sin", "float32", 3, true)?;
        let r = cs.sizes[2];
        same("cos", &cs.sizes, &[b, t, r])?;
        same("sin", &sn.sizes, &cs.sizes)?;
        if r % 2 != 0 || r > c.head_dim || r == 0 {
            return Err(err(format!("rotary dims {r} must be even, positive and at most the head dim {}", c.head_dim)));
        }
        let [cb, ckv, cap, cd] = cache.shape;
        if cache.k.len() != self.inner.layers.len() {
            return Err(err(format!("cache has {} layers, the model {}", cache.k.len(), self.inner.layers.len())));
        }
        same("cache", &[cb, ckv, cd], &[b, c.kv_heads, c.head_dim])?;
        if length + t > cap || t == 0 {
            return Err(err(format!("cache holds {cap} slots; {length} used + {t} new do not fit")));
        }
        let pz = arg(pos, "pos", "int64", 2, true)?;
        same("pos", &pz.sizes, &[b, cap])?;
        let lg = arg(logits, "logits", "float32", 2, true)?;
        same("logits", &lg.sizes, &[if last_only { b } else { b * t }, c.vocab])?;
        let cache_spans: Vec<T> = cache
            .k
            .iter()
            .chain(&cache.v)
            .map(|&ptr| T { ptr, sizes: cache.shape.to_vec(), strides: vec![ckv * cap * cd, cap * cd, cd, 1], elem: 4 })
            .collect();
        let mut ins: Vec<&T> = vec![&pa, &cs, &sn, &pz, &lg];
        ins.extend(cache_spans.iter());
        disjoint(&x, &ins)?;
        let mut ins2: Vec<&T> = vec![&pa, &cs, &sn, &pz];
        ins2.extend(cache_spans.iter());
        disjoint(&lg, &ins2)?;
        // SAFETY: every descriptor validated above and disjoint from the outputs; Python keeps
        // the tensors alive for the call. The cache buffers were checked when bound.
        let (xs, ps, coss, sins, poss, lgs) = unsafe {
            (x.slice_mut::<f32>(), pa.slice::<i64>(), cs.slice::<f32>(), sn.slice::<f32>(), pz.slice::<i64>(), lg.slice_mut::<f32>())
        };
        let (kp, vp) = (&cache.k, &cache.v);
        let inner = &self.inner;
        let isa = detect();
        py.detach(move || {
            let k: Vec<*mut f32> = kp.iter().map(|&p| p as *mut f32).collect();
            let v: Vec<*mut f32> = vp.iter().map(|&p| p as *mut f32).collect();
            let kv = model::Cache { k: &k, v: &v, cap, pos: poss, length };
            let s = model::Step { x: xs, b, t, positions: ps, cos: coss, sin: sins, rot: r, last_only };
            // run on a pool worker: the step's parallel regions then fork inside the pool
            // SAFETY: validated above (see `Model::step`).
            rayon::scope(|_| unsafe { inner.step(s, &kv, lgs, isa) });
        });
        Ok(())
    }

    #[getter]
    fn num_layers(&self) -> usize {
        self.inner.layers.len()
    }
}

/// int8 `[N, K]` in [-127, 127] with f32 scales `[N]` (tb-llm's int8 layout).
#[pyfunction]
fn llm_pack_int8(qweight: TensorArg, scales: TensorArg) -> PyResult<LLMWeight> {
    let q = arg(qweight, "qweight", "int8", 2, true)?;
    let s = arg(scales, "scales", "float32", 1, true)?;
    let (n, k) = (q.sizes[0], q.sizes[1]);
    same("scales", &s.sizes, &[n])?;
    // SAFETY: validated contiguous descriptors.
    let inner = unsafe { Packed::int8(n, k, q.slice::<i8>(), s.slice::<f32>()) }.map_err(err)?;
    Ok(LLMWeight { inner })
}

/// uint8 `[N, K / 2]` nibbles with f32 scales / zeros `[N, K / group]` (tb-llm's int4 layout),
/// each a float16 value (stored as binary16; any other value is a ValueError).
#[pyfunction]
fn llm_pack_int4(qweight: TensorArg, scales: TensorArg, zeros: TensorArg, group: usize) -> PyResult<LLMWeight> {
    let q = arg(qweight, "qweight", "uint8", 2, true)?;
    let s = arg(scales, "scales", "float32", 2, true)?;
    let z = arg(zeros, "zeros", "float32", 2, true)?;
    let (n, k) = (q.sizes[0], q.sizes[1] * 2);
    if group == 0 || k % group != 0 {
        return Err(err(format!("int4 group size {group} does not divide K={k}")));
    }
    same("scales", &s.sizes, &[n, k / group])?;
    same("zeros", &z.sizes, &[n, k / group])?;
    // SAFETY: validated contiguous descriptors.
    let inner = unsafe { Packed::int4(n, k, group, q.slice::<u8>(), s.slice::<f32>(), z.slice::<f32>()) }.map_err(err)?;
    Ok(LLMWeight { inner })
}

/// A float32 or bfloat16 `[N, K]` weight.
#[pyfunction]
fn llm_pack_dense(weight: TensorArg) -> PyResult<LLMWeight> {
    let bf16 = weight.3.trim_start_matches("torch.") == "bfloat16";
    let w = arg(weight, "weight", if bf16 { "bfloat16" } else { "float32" }, 2, true)?;
    let (n, k) = (w.sizes[0], w.sizes[1]);
    // SAFETY: validated contiguous descriptor.
    let inner = unsafe {
        if bf16 {
            Packed::bf16(n, k, w.slice::<u16>())
        } else {
            Packed::f32(n, k, w.slice::<f32>())
        }
    }
    .map_err(err)?;
    Ok(LLMWeight { inner })
}

/// A float32 or bfloat16 `[N, K]` checkpoint weight, validated, as `quant::Src`.
fn src_arg(weight: TensorArg) -> PyResult<(T, bool)> {
    let bf16 = weight.3.trim_start_matches("torch.") == "bfloat16";
    let w = arg(weight, "weight", if bf16 { "bfloat16" } else { "float32" }, 2, true)?;
    Ok((w, bf16))
}

/// Quantizes a float32 / bfloat16 `[N, K]` weight (`kind` "int8", or "int4" with `group`)
/// and packs it for the kernels in one pass, over the rayon pool with the GIL released: the
/// same weight as `llm_pack_int8` / `llm_pack_int4` of `tb_llm.quant.quantize`'s output.
#[pyfunction]
fn llm_quantize(py: Python<'_>, weight: TensorArg, kind: &str, group: usize) -> PyResult<LLMWeight> {
    let (w, bf16) = src_arg(weight)?;
    let (n, k) = (w.sizes[0], w.sizes[1]);
    // SAFETY: validated contiguous descriptor of the dtype `src_arg` checked.
    let src = unsafe { if bf16 { quant::Src::Bf16(w.slice::<u16>()) } else { quant::Src::F32(w.slice::<f32>()) } };
    let inner = match kind {
        "int8" => py.detach(|| quant::packed_int8(src, n, k)),
        "int4" => py.detach(|| quant::packed_int4(src, n, k, group)),
        other => return Err(err(format!("llm_quantize: kind must be int8 or int4, got {other:?}"))),
    }
    .map_err(err)?;
    Ok(LLMWeight { inner })
}

/// The same quantization in tb-llm's own layouts (`tb_llm.quant`), written into `q` (int8
/// `[N, K]` or uint8 `[N, K / 2]`), `scales` (`[N]` or `[N, K / G]`) and, for int4, `zeros`:
/// what the tests compare bit for bit with the Python quantizer.
#[pyfunction]
#[pyo3(signature = (weight, kind, group, q, scales, zeros=None))]
fn llm_quantize_layout(weight: TensorArg, kind: &str, group: usize, q: TensorArg, scales: TensorArg, zeros: Option<TensorArg>) -> PyResult<()> {
    let (w, bf16) = src_arg(weight)?;
    let (n, k) = (w.sizes[0], w.sizes[1]);
    // SAFETY: as in `llm_quantize`.
    let src = unsafe { if bf16 { quant::Src::Bf16(w.slice::<u16>()) } else { quant::Src::F32(w.slice::<f32>()) } };
    let put = |t: TensorArg, what: &str, dtype: &str, shape: &[usize], data: &[u8]| -> PyResult<()> {
        let t = arg(t, what, dtype, shape.len(), true)?;
        same(what, &t.sizes, shape)?;
        disjoint(&t, &[&w])?;
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: validated contiguous descriptor of `data.len()` bytes.
        unsafe { std::slice::from_raw_parts_mut(t.ptr as *mut u8, data.len()) }.copy_from_slice(data);
        Ok(())
    };
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_ne_bytes()).collect() };
    match kind {
        "int8" => {
            let (qv, sv) = quant::int8(src, n, k).map_err(err)?;
            put(q, "q", "int8", &[n, k], &qv.iter().map(|&v| v as u8).collect::<Vec<u8>>())?;
            put(scales, "scales", "float32", &[n], &bytes(&sv))
        }
        "int4" => {
            let (pv, sv, zv) = quant::int4(src, n, k, group).map_err(err)?;
            let z = zeros.ok_or_else(|| err("int4 needs a zeros tensor"))?;
            put(q, "q", "uint8", &[n, k / 2], &pv)?;
            put(scales, "scales", "float32", &[n, k / group], &bytes(&sv))?;
            put(z, "zeros", "float32", &[n, k / group], &bytes(&zv))
        }
        other => Err(err(format!("llm_quantize_layout: kind must be int8 or int4, got {other:?}"))),
    }
}

/// `out = x / rms(x) * (offset + weight)` over the last dim; x/out `[R, D]`, weight `[D]`.
#[pyfunction]
fn llm_rms_norm(x: TensorArg, weight: TensorArg, out: TensorArg, eps: f32, offset: f32) -> PyResult<()> {
    let x = arg(x, "x", "float32", 2, true)?;
    let w = arg(weight, "weight", "float32", 1, true)?;
    let out = arg(out, "out", "float32", 2, true)?;
    same("weight", &w.sizes, &x.sizes[1..])?;
    same("out", &out.sizes, &x.sizes)?;
    disjoint(&out, &[&x, &w])?;
    // SAFETY: validated above.
    unsafe { ops::rms_norm(x.slice(), w.slice(), eps, offset, out.slice_mut()) };
    Ok(())
}

/// `out = act(gate) * up`, three contiguous float32 tensors of one shape `[R, C]`.
#[pyfunction]
fn llm_gated_act(py: Python<'_>, gate: TensorArg, up: TensorArg, out: TensorArg, act: &str) -> PyResult<()> {
    let act = ops::Act::parse(act).map_err(err)?;
    let g = arg(gate, "gate", "float32", 2, true)?;
    let u = arg(up, "up", "float32", 2, true)?;
    let out = arg(out, "out", "float32", 2, true)?;
    same("up", &u.sizes, &g.sizes)?;
    same("out", &out.sizes, &g.sizes)?;
    disjoint(&out, &[&g, &u])?;
    // SAFETY: validated above.
    let (gs, us, os) = unsafe { (g.slice::<f32>(), u.slice::<f32>(), out.slice_mut::<f32>()) };
    let (rows, cols) = (g.sizes[0], g.sizes[1]);
    if rows < 2 || rows * cols < 1 << 16 {
        ops::gated_act(gs, us, act, os);
        return Ok(());
    }
    // prefill: rows split over the kernel thread team (PyTorch's OpenMP team, as `gemv::run`)
    let parts = (crate::core::par::threads() * 4).min(rows);
    let per = rows.div_ceil(parts);
    let optr = os.as_mut_ptr() as usize;
    py.detach(|| {
        crate::core::par::for_each(rows.div_ceil(per), |t| {
            let (a, b) = (t * per * cols, ((t + 1) * per).min(rows) * cols);
            // SAFETY: parts write disjoint row ranges of `out`, which outlives the call.
            let o = unsafe { std::slice::from_raw_parts_mut((optr as *mut f32).add(a), b - a) };
            ops::gated_act(&gs[a..b], &us[a..b], act, o);
        })
    });
    Ok(())
}

/// RoPE ("rotate half") on x `[B, H, T, D]` (strided, unit last stride) with cos/sin
/// `[B, 1, T, R]`; out contiguous `[B, H, T, D]`.
#[pyfunction]
fn llm_rope(x: TensorArg, cos: TensorArg, sin: TensorArg, out: TensorArg) -> PyResult<()> {
    let x = arg(x, "x", "float32", 4, false)?;
    let c = arg(cos, "cos", "float32", 4, false)?;
    let s = arg(sin, "sin", "float32", 4, false)?;
    let out = arg(out, "out", "float32", 4, true)?;
    let r = c.sizes[3];
    same("cos", &c.sizes, &[x.sizes[0], 1, x.sizes[2], r])?;
    same("sin", &s.sizes, &c.sizes)?;
    if r % 2 != 0 || r > x.sizes[3] {
        return Err(err(format!("rotary dims {r} must be even and at most the head dim {}", x.sizes[3])));
    }
    same("out", &out.sizes, &x.sizes)?;
    disjoint(&out, &[&x, &c, &s])?;
    // SAFETY: validated above.
    unsafe { ops::rope(x.v4(), c.v4(), s.v4(), out.slice_mut()) };
    Ok(())
}

/// Grouped-query attention over the KV cache: q `[B, H, T, D]`, k/v `[B, KV, S, D]` (strided
/// views, unit last stride), mask bool `[B, 1, T, S]` contiguous, out contiguous `[B, H, T, D]`.
#[pyfunction]
#[pyo3(signature = (q, k, v, mask, out, scale, softcap=None))]
fn llm_attention(
    py: Python<'_>,
    q: TensorArg,
    k: TensorArg,
    v: TensorArg,
    mask: TensorArg,
    out: TensorArg,
    scale: f32,
    softcap: Option<f32>,
) -> PyResult<()> {
    let q = arg(q, "q", "float32", 4, false)?;
    let k = arg(k, "k", "float32", 4, false)?;
    let v = arg(v, "v", "float32", 4, false)?;
    let m = arg(mask, "mask", "bool", 4, true)?;
    let out = arg(out, "out", "float32", 4, true)?;
    let [b, h, t, d] = [q.sizes[0], q.sizes[1], q.sizes[2], q.sizes[3]];
    let (kvh, s) = (k.sizes[1], k.sizes[2]);
    same("k", &k.sizes, &[b, kvh, s, d])?;
    same("v", &v.sizes, &k.sizes)?;
    same("mask", &m.sizes, &[b, 1, t, s])?;
    same("out", &out.sizes, &q.sizes)?;
    if kvh == 0 || h % kvh != 0 {
        return Err(err(format!("{h} query heads are not a multiple of {kvh} KV heads")));
    }
    if softcap.is_some_and(|c| c <= 0.0 || !c.is_finite()) {
        return Err(err("softcap must be a positive finite number"));
    }
    disjoint(&out, &[&q, &k, &v, &m])?;
    // SAFETY: validated above; bool tensors hold 0 or 1 bytes.
    let (ms, os) = unsafe { (m.slice::<u8>(), out.slice_mut::<f32>()) };
    let (qv, kv, vv) = (q.v4(), k.v4(), v.v4());
    if t >= attn::MIN_QUERIES && attn::takes(d, softcap) {
        // SAFETY: validated above; `takes` holds.
        py.detach(move || unsafe { attn::prefill(qv, kv, vv, ms, scale, os) });
        return Ok(());
    }
    py.detach(move || unsafe { attn_decode::attention(qv, kv, vv, ms, scale, softcap, os) });
    Ok(())
}

/// Returns malloc's free heap memory to the system (see `huge::release_free_memory`); tb-llm's
/// backend calls it once the weights are packed. True when some was released.
#[pyfunction]
fn llm_release_free_memory(py: Python<'_>) -> bool {
    py.detach(crate::llm::huge::release_free_memory)
}

/// The instruction set the LLM kernels run with: avx512-vnni, avx512, avx2+fma or scalar.
#[pyfunction]
fn llm_isa() -> &'static str {
    gemv::isa_name()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<LLMWeight>()?;
    m.add_class::<LLMModel>()?;
    m.add_class::<LLMKVCache>()?;
    m.add_function(wrap_pyfunction!(llm_pack_int8, m)?)?;
    m.add_function(wrap_pyfunction!(llm_pack_int4, m)?)?;
    m.add_function(wrap_pyfunction!(llm_pack_dense, m)?)?;
    m.add_function(wrap_pyfunction!(llm_quantize, m)?)?;
    m.add_function(wrap_pyfunction!(llm_quantize_layout, m)?)?;
    m.add_function(wrap_pyfunction!(llm_rms_norm, m)?)?;
    m.add_function(wrap_pyfunction!(llm_gated_act, m)?)?;
    m.add_function(wrap_pyfunction!(llm_rope, m)?)?;
    m.add_function(wrap_pyfunction!(llm_attention, m)?)?;
    m.add_function(wrap_pyfunction!(llm_isa, m)?)?;
    m.add_function(wrap_pyfunction!(llm_release_free_memory, m)?)?;
    Ok(())
}
