//! pyo3 layer of the LLM kernels: every tensor is validated by `args` (dtype, rank, layout) and
//! checked against the others (shapes, outputs sharing no byte with inputs), then the plain-Rust
//! kernels run. A bad argument is an exception, never undefined behaviour. Weights are copied
//! into Rust-owned `LLMWeight`s; the KV cache is held as its tensors and read again at each step.

use pyo3::prelude::*;

use super::args::{self, disjoint, err, shape, tensor, Indexed, Want};
use crate::core::host_tensor::HostTensor;
use crate::core::tensor::DType;
use crate::llm::gemv::{self, detect};
use crate::llm::model::{self, AsPacked, Lin, Model};
use crate::llm::ops::{self, V4};
use crate::llm::packed::Packed;
use crate::llm::{attn, attn_decode, quant};

const F32: Want = Want::of(&[DType::F32]).contiguous();
const I64: Want = Want::of(&[DType::I64]).contiguous();
/// A strided float32 view whose rows are unit-stride (q, k, v, x, cos, sin of attention / RoPE).
const F32_ROWS: Want = Want::of(&[DType::F32]).rank(4).unit_last();
/// A checkpoint weight: float32 or bfloat16 `[N, K]`.
const DENSE: Want = Want::of(&[DType::F32, DType::BF16]).rank(2).contiguous();

fn v4(t: &HostTensor) -> V4 {
    V4 {
        ptr: t.ptr as *const f32,
        sizes: [t.sizes[0], t.sizes[1], t.sizes[2], t.sizes[3]],
        strides: [t.strides[0], t.strides[1], t.strides[2], t.strides[3]],
    }
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
    fn linear(&self, py: Python<'_>, x: &Bound<'_, PyAny>, out: &Bound<'_, PyAny>, bias: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let (n, k) = self.inner.shape();
        let x = tensor(x, "x", F32.rank(2))?;
        let out = tensor(out, "out", F32.rank(2))?;
        if x.sizes[1] != k {
            return Err(err(format!("x has {} features but the weight takes {k}", x.sizes[1])));
        }
        shape("out", &out.sizes, &[x.sizes[0], n])?;
        let bias = args::optional(bias, "bias", F32.rank(1))?;
        if let Some(b) = &bias {
            shape("bias", &b.sizes, &[n])?;
        }
        let mut ins = vec![&x];
        ins.extend(bias.as_ref());
        disjoint("out", &out, &ins)?;
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
    fn rows(&self, ids: &Bound<'_, PyAny>, out: &Bound<'_, PyAny>) -> PyResult<()> {
        let (n, k) = self.inner.shape();
        let ids = tensor(ids, "ids", I64.rank(1))?;
        let out = tensor(out, "out", F32.rank(2))?;
        shape("out", &out.sizes, &[ids.sizes[0], k])?;
        disjoint("out", &out, &[&ids])?;
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

type LinArg<'py> = (Py<LLMWeight>, Option<Bound<'py, PyAny>>);
type LayerArg<'py> = (
    Bound<'py, PyAny>,         // input_norm
    Bound<'py, PyAny>,         // post_attention_norm
    Option<Bound<'py, PyAny>>, // pre_feedforward_norm (Gemma 2)
    Option<Bound<'py, PyAny>>, // post_feedforward_norm (Gemma 2)
    Vec<LinArg<'py>>,          // [q, k, v] or [qkv]
    LinArg<'py>,               // o
    Option<Bound<'py, PyAny>>, // q_norm (Qwen3)
    Option<Bound<'py, PyAny>>, // k_norm
    Vec<LinArg<'py>>,          // [gate, up] or [gate_up]
    LinArg<'py>,               // down
    bool,                      // sliding window applies
);
/// hidden, heads, kv_heads, head_dim, intermediate, vocab, eps, norm_offset, attn_scale,
/// attn_softcap, final_softcap, sliding_window
type ConfigArg = (usize, usize, usize, usize, usize, usize, f32, f32, f32, Option<f32>, Option<f32>, Option<i64>);

/// A float32 vector of `len` elements, copied.
fn vec_f32(obj: &Bound<'_, PyAny>, what: &str, len: usize) -> PyResult<Vec<f32>> {
    let t = tensor(obj, what, F32.rank(1))?;
    shape(what, &t.sizes, &[len])?;
    // SAFETY: validated contiguous float32; copied before returning.
    Ok(unsafe { t.slice::<f32>() }.to_vec())
}

fn opt_vec_f32(obj: Option<Bound<'_, PyAny>>, what: &str, len: usize) -> PyResult<Option<Vec<f32>>> {
    obj.map(|o| vec_f32(&o, what, len)).transpose()
}

fn lin(a: LinArg<'_>, what: &str, n: usize, k: usize) -> PyResult<Lin<Py<LLMWeight>>> {
    let (w, bias) = a;
    let shape = w.get().inner.shape();
    if shape != (n, k) {
        return Err(err(format!("{what}: weight is {shape:?}, the config implies ({n}, {k})")));
    }
    let bias = opt_vec_f32(bias, what, n)?;
    Ok(Lin { w, bias })
}

fn lins(a: Vec<LinArg<'_>>, what: &str, parts: &[usize], k: usize) -> PyResult<Vec<Lin<Py<LLMWeight>>>> {
    if a.len() == 1 {
        let n = parts.iter().sum();
        return a.into_iter().map(|l| lin(l, what, n, k)).collect();
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

/// The KV cache tensors of one allocation: per layer `[B, KV, cap, D]` contiguous float32 keys
/// and values, all of one shape and sharing no byte. They are held (so they live as long as
/// this) and validated again at every step (so a replaced buffer is never written through a
/// stale address).
#[pyclass(module = "tb_cpu_rust._native", frozen)]
pub struct LLMKVCache {
    k: Vec<Py<PyAny>>,
    v: Vec<Py<PyAny>>,
    shape: [usize; 4],
}

impl LLMKVCache {
    /// The keys then the values, validated.
    fn tensors(py: Python<'_>, k: &[Py<PyAny>], v: &[Py<PyAny>]) -> PyResult<(Vec<HostTensor>, [usize; 4])> {
        if k.len() != v.len() || k.is_empty() {
            return Err(err("k and v must be non-empty lists of one tensor per layer"));
        }
        let mut all = Vec::with_capacity(2 * k.len());
        for (what, list) in [("k", k), ("v", v)] {
            for (i, obj) in list.iter().enumerate() {
                all.push(tensor(obj.bind(py), Indexed(what, i), F32.rank(4))?);
            }
        }
        let s = [all[0].sizes[0], all[0].sizes[1], all[0].sizes[2], all[0].sizes[3]];
        for (i, t) in all.iter().enumerate() {
            shape(Indexed("cache", i), &t.sizes, &s)?;
        }
        let named: Vec<(&HostTensor, usize)> = all.iter().zip(0..).collect();
        args::all_disjoint(&named).map_err(|_| err("cache tensors overlap"))?;
        Ok((all, s))
    }
}

#[pymethods]
impl LLMKVCache {
    #[new]
    fn new(py: Python<'_>, k: Vec<Py<PyAny>>, v: Vec<Py<PyAny>>) -> PyResult<Self> {
        let (_, shape) = Self::tensors(py, &k, &v)?;
        Ok(LLMKVCache { k, v, shape })
    }
}

#[pymethods]
impl LLMModel {
    #[new]
    fn new(config: ConfigArg, act: &str, embed_scale: Option<f32>, layers: Vec<LayerArg<'_>>, norm: &Bound<'_, PyAny>, head: Py<LLMWeight>) -> PyResult<Self> {
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
                input_norm: vec_f32(&inn, &p("input_norm"), hidden)?,
                post_attn_norm: vec_f32(&post, &p("post_attention_norm"), hidden)?,
                pre_ff_norm: opt_vec_f32(pre_ff, &p("pre_feedforward_norm"), hidden)?,
                post_ff_norm: opt_vec_f32(post_ff, &p("post_feedforward_norm"), hidden)?,
                qkv: lins(qkv, &p("qkv"), &[qd, kvd, kvd], hidden)?,
                o: lin(o, &p("o"), hidden, qd)?,
                q_norm: opt_vec_f32(qn, &p("q_norm"), head_dim)?,
                k_norm: opt_vec_f32(kn, &p("k_norm"), head_dim)?,
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
        x: &Bound<'_, PyAny>,
        positions: &Bound<'_, PyAny>,
        cos: &Bound<'_, PyAny>,
        sin: &Bound<'_, PyAny>,
        pos: &Bound<'_, PyAny>,
        length: usize,
        cache: &LLMKVCache,
        logits: &Bound<'_, PyAny>,
        last_only: bool,
    ) -> PyResult<()> {
        let c = &self.inner.cfg;
        let pa = tensor(positions, "positions", I64.rank(2))?;
        let (b, t) = (pa.sizes[0], pa.sizes[1]);
        let x = tensor(x, "x", F32.rank(2))?;
        shape("x", &x.sizes, &[b * t, c.hidden])?;
        let cs = tensor(cos, "cos", F32.rank(3))?;
        let sn = tensor(sin, "sin", F32.rank(3))?;
        let r = cs.sizes[2];
        shape("cos", &cs.sizes, &[b, t, r])?;
        shape("sin", &sn.sizes, &cs.sizes)?;
        if r % 2 != 0 || r > c.head_dim || r == 0 {
            return Err(err(format!("rotary dims {r} must be even, positive and at most the head dim {}", c.head_dim)));
        }
        let (kv, [cb, ckv, cap, cd]) = LLMKVCache::tensors(py, &cache.k, &cache.v)?;
        if cache.shape != [cb, ckv, cap, cd] {
            return Err(err(format!("cache tensors are now {:?}, bound as {:?}", [cb, ckv, cap, cd], cache.shape)));
        }
        if cache.k.len() != self.inner.layers.len() {
            return Err(err(format!("cache has {} layers, the model {}", cache.k.len(), self.inner.layers.len())));
        }
        shape("cache", &[cb, ckv, cd], &[b, c.kv_heads, c.head_dim])?;
        if length.checked_add(t).is_none_or(|end| end > cap) || t == 0 {
            return Err(err(format!("cache holds {cap} slots; {length} used + {t} new do not fit")));
        }
        let pz = tensor(pos, "pos", I64.rank(2))?;
        shape("pos", &pz.sizes, &[b, cap])?;
        let lg = tensor(logits, "logits", F32.rank(2))?;
        shape("logits", &lg.sizes, &[if last_only { b } else { b * t }, c.vocab])?;
        let mut ins: Vec<&HostTensor> = vec![&pa, &cs, &sn, &pz];
        for (i, t) in kv.iter().enumerate() {
            disjoint(Indexed("cache", i), t, &ins)?;
        }
        ins.extend(kv.iter());
        disjoint("logits", &lg, &ins)?;
        ins.push(&lg);
        disjoint("x", &x, &ins)?;
        // SAFETY: every tensor validated above and the outputs disjoint from the rest; Python
        // keeps the tensors (and `cache` its own) alive for the call.
        let (xs, ps, coss, sins, poss, lgs) = unsafe {
            (x.slice_mut::<f32>(), pa.slice::<i64>(), cs.slice::<f32>(), sn.slice::<f32>(), pz.slice::<i64>(), lg.slice_mut::<f32>())
        };
        let layers = cache.k.len();
        let ptrs: Vec<usize> = kv.iter().map(|t| t.ptr).collect();
        let inner = &self.inner;
        let isa = detect();
        py.detach(move || {
            let k: Vec<*mut f32> = ptrs[..layers].iter().map(|&p| p as *mut f32).collect();
            let v: Vec<*mut f32> = ptrs[layers..].iter().map(|&p| p as *mut f32).collect();
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

/// int8 `[N, K]` in [-127, 127] with f32 scales `[N]` (the int8 layout of `torchburn.llm`).
#[pyfunction]
fn llm_pack_int8(qweight: &Bound<'_, PyAny>, scales: &Bound<'_, PyAny>) -> PyResult<LLMWeight> {
    let q = tensor(qweight, "qweight", Want::of(&[DType::I8]).rank(2).contiguous())?;
    let s = tensor(scales, "scales", F32.rank(1))?;
    let (n, k) = (q.sizes[0], q.sizes[1]);
    shape("scales", &s.sizes, &[n])?;
    // SAFETY: validated contiguous tensors of these dtypes.
    let inner = unsafe { Packed::int8(n, k, q.slice::<i8>(), s.slice::<f32>()) }.map_err(err)?;
    Ok(LLMWeight { inner })
}

/// uint8 `[N, K / 2]` nibbles with f32 scales / zeros `[N, K / group]` (the int4 layout of `torchburn.llm`),
/// each a float16 value (stored as binary16; any other value is a ValueError).
#[pyfunction]
fn llm_pack_int4(qweight: &Bound<'_, PyAny>, scales: &Bound<'_, PyAny>, zeros: &Bound<'_, PyAny>, group: usize) -> PyResult<LLMWeight> {
    let q = tensor(qweight, "qweight", Want::of(&[DType::U8]).rank(2).contiguous())?;
    let s = tensor(scales, "scales", F32.rank(2))?;
    let z = tensor(zeros, "zeros", F32.rank(2))?;
    let (n, k) = (q.sizes[0], q.sizes[1] * 2);
    if group == 0 || k % group != 0 {
        return Err(err(format!("int4 group size {group} does not divide K={k}")));
    }
    shape("scales", &s.sizes, &[n, k / group])?;
    shape("zeros", &z.sizes, &[n, k / group])?;
    // SAFETY: validated contiguous tensors of these dtypes.
    let inner = unsafe { Packed::int4(n, k, group, q.slice::<u8>(), s.slice::<f32>(), z.slice::<f32>()) }.map_err(err)?;
    Ok(LLMWeight { inner })
}

/// A float32 or bfloat16 `[N, K]` checkpoint weight as the quantizers read it.
fn checkpoint<'a>(w: &'a HostTensor) -> quant::Src<'a> {
    // SAFETY: `DENSE` validated a contiguous tensor of one of these two dtypes.
    unsafe {
        if w.dtype == DType::BF16 {
            quant::Src::Bf16(w.slice::<u16>())
        } else {
            quant::Src::F32(w.slice::<f32>())
        }
    }
}

/// A float32 or bfloat16 `[N, K]` weight.
#[pyfunction]
fn llm_pack_dense(weight: &Bound<'_, PyAny>) -> PyResult<LLMWeight> {
    let w = tensor(weight, "weight", DENSE)?;
    let (n, k) = (w.sizes[0], w.sizes[1]);
    let inner = match checkpoint(&w) {
        quant::Src::Bf16(v) => Packed::bf16(n, k, v),
        quant::Src::F32(v) => Packed::f32(n, k, v),
    }
    .map_err(err)?;
    Ok(LLMWeight { inner })
}

/// Quantizes a float32 / bfloat16 `[N, K]` weight (`kind` "int8", or "int4" with `group`)
/// and packs it for the kernels in one pass, over the rayon pool with the GIL released: the
/// same weight as `llm_pack_int8` / `llm_pack_int4` of `torchburn.llm.quantize`'s output.
#[pyfunction]
fn llm_quantize(py: Python<'_>, weight: &Bound<'_, PyAny>, kind: &str, group: usize) -> PyResult<LLMWeight> {
    let w = tensor(weight, "weight", DENSE)?;
    let (n, k, src) = (w.sizes[0], w.sizes[1], checkpoint(&w));
    let inner = match kind {
        "int8" => py.detach(|| quant::packed_int8(src, n, k)),
        "int4" => py.detach(|| quant::packed_int4(src, n, k, group)),
        other => return Err(err(format!("llm_quantize: kind must be int8 or int4, got {other:?}"))),
    }
    .map_err(err)?;
    Ok(LLMWeight { inner })
}

/// The same quantization in tb-llm's own layouts (`torchburn.llm`), written into `q` (int8
/// `[N, K]` or uint8 `[N, K / 2]`), `scales` (`[N]` or `[N, K / G]`) and, for int4, `zeros`:
/// what the tests compare bit for bit with the Python quantizer.
#[pyfunction]
#[pyo3(signature = (weight, kind, group, q, scales, zeros=None))]
fn llm_quantize_layout(
    weight: &Bound<'_, PyAny>,
    kind: &str,
    group: usize,
    q: &Bound<'_, PyAny>,
    scales: &Bound<'_, PyAny>,
    zeros: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let w = tensor(weight, "weight", DENSE)?;
    let (n, k, src) = (w.sizes[0], w.sizes[1], checkpoint(&w));
    let out = |obj: &Bound<'_, PyAny>, what: &'static str, dtype: &'static [DType], dims: &[usize]| -> PyResult<(HostTensor, &'static str)> {
        let t = tensor(obj, what, Want::of(dtype).rank(dims.len()).contiguous())?;
        shape(what, &t.sizes, dims)?;
        Ok((t, what))
    };
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_ne_bytes()).collect() };
    // every output checked (and none sharing a byte with another or the weight) before any is written
    let (outs, data) = match kind {
        "int8" => {
            let (qv, sv) = quant::int8(src, n, k).map_err(err)?;
            let outs = vec![out(q, "q", &[DType::I8], &[n, k])?, out(scales, "scales", &[DType::F32], &[n])?];
            (outs, vec![qv.iter().map(|&v| v as u8).collect::<Vec<u8>>(), bytes(&sv)])
        }
        "int4" => {
            let (pv, sv, zv) = quant::int4(src, n, k, group).map_err(err)?;
            let z = zeros.ok_or_else(|| err("int4 needs a zeros tensor"))?;
            let g = [n, k / group];
            let outs = vec![out(q, "q", &[DType::U8], &[n, k / 2])?, out(scales, "scales", &[DType::F32], &g)?, out(z, "zeros", &[DType::F32], &g)?];
            (outs, vec![pv, bytes(&sv), bytes(&zv)])
        }
        other => return Err(err(format!("llm_quantize_layout: kind must be int8 or int4, got {other:?}"))),
    };
    let mut named: Vec<(&HostTensor, &str)> = outs.iter().map(|(t, what)| (t, *what)).collect();
    named.push((&w, "weight"));
    args::all_disjoint(&named)?;
    for ((t, _), d) in outs.iter().zip(&data) {
        // SAFETY: a validated contiguous tensor of `d.len()` bytes (its dtype and shape), shared with nothing else here.
        unsafe { t.bytes_mut() }.copy_from_slice(d);
    }
    Ok(())
}

/// `out = x / rms(x) * (offset + weight)` over the last dim; x/out `[R, D]`, weight `[D]`.
#[pyfunction]
fn llm_rms_norm(x: &Bound<'_, PyAny>, weight: &Bound<'_, PyAny>, out: &Bound<'_, PyAny>, eps: f32, offset: f32) -> PyResult<()> {
    let x = tensor(x, "x", F32.rank(2))?;
    let w = tensor(weight, "weight", F32.rank(1))?;
    let out = tensor(out, "out", F32.rank(2))?;
    shape("weight", &w.sizes, &x.sizes[1..])?;
    shape("out", &out.sizes, &x.sizes)?;
    disjoint("out", &out, &[&x, &w])?;
    // SAFETY: validated above.
    unsafe { ops::rms_norm(x.slice(), w.slice(), eps, offset, out.slice_mut()) };
    Ok(())
}

/// `out = act(gate) * up`, three contiguous float32 tensors of one shape `[R, C]`.
#[pyfunction]
fn llm_gated_act(py: Python<'_>, gate: &Bound<'_, PyAny>, up: &Bound<'_, PyAny>, out: &Bound<'_, PyAny>, act: &str) -> PyResult<()> {
    let act = ops::Act::parse(act).map_err(err)?;
    let g = tensor(gate, "gate", F32.rank(2))?;
    let u = tensor(up, "up", F32.rank(2))?;
    let out = tensor(out, "out", F32.rank(2))?;
    shape("up", &u.sizes, &g.sizes)?;
    shape("out", &out.sizes, &g.sizes)?;
    disjoint("out", &out, &[&g, &u])?;
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
fn llm_rope(x: &Bound<'_, PyAny>, cos: &Bound<'_, PyAny>, sin: &Bound<'_, PyAny>, out: &Bound<'_, PyAny>) -> PyResult<()> {
    let x = tensor(x, "x", F32_ROWS)?;
    let c = tensor(cos, "cos", F32_ROWS)?;
    let s = tensor(sin, "sin", F32_ROWS)?;
    let out = tensor(out, "out", F32.rank(4))?;
    let r = c.sizes[3];
    shape("cos", &c.sizes, &[x.sizes[0], 1, x.sizes[2], r])?;
    shape("sin", &s.sizes, &c.sizes)?;
    if r % 2 != 0 || r > x.sizes[3] {
        return Err(err(format!("rotary dims {r} must be even and at most the head dim {}", x.sizes[3])));
    }
    shape("out", &out.sizes, &x.sizes)?;
    disjoint("out", &out, &[&x, &c, &s])?;
    // SAFETY: validated above.
    unsafe { ops::rope(v4(&x), v4(&c), v4(&s), out.slice_mut()) };
    Ok(())
}

/// Grouped-query attention over the KV cache: q `[B, H, T, D]`, k/v `[B, KV, S, D]` (strided
/// views, unit last stride), mask bool `[B, 1, T, S]` contiguous, out contiguous `[B, H, T, D]`.
#[pyfunction]
#[pyo3(signature = (q, k, v, mask, out, scale, softcap=None))]
fn llm_attention(
    py: Python<'_>,
    q: &Bound<'_, PyAny>,
    k: &Bound<'_, PyAny>,
    v: &Bound<'_, PyAny>,
    mask: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    scale: f32,
    softcap: Option<f32>,
) -> PyResult<()> {
    let q = tensor(q, "q", F32_ROWS)?;
    let k = tensor(k, "k", F32_ROWS)?;
    let v = tensor(v, "v", F32_ROWS)?;
    let m = tensor(mask, "mask", Want::of(&[DType::Bool]).rank(4).contiguous())?;
    let out = tensor(out, "out", F32.rank(4))?;
    let [b, h, t, d] = [q.sizes[0], q.sizes[1], q.sizes[2], q.sizes[3]];
    let (kvh, s) = (k.sizes[1], k.sizes[2]);
    shape("k", &k.sizes, &[b, kvh, s, d])?;
    shape("v", &v.sizes, &k.sizes)?;
    shape("mask", &m.sizes, &[b, 1, t, s])?;
    shape("out", &out.sizes, &q.sizes)?;
    if kvh == 0 || h % kvh != 0 {
        return Err(err(format!("{h} query heads are not a multiple of {kvh} KV heads")));
    }
    if softcap.is_some_and(|c| c <= 0.0 || !c.is_finite()) {
        return Err(err("softcap must be a positive finite number"));
    }
    disjoint("out", &out, &[&q, &k, &v, &m])?;
    // SAFETY: validated above; bool tensors hold 0 or 1 bytes.
    let (ms, os) = unsafe { (m.slice::<u8>(), out.slice_mut::<f32>()) };
    let (qv, kv, vv) = (v4(&q), v4(&k), v4(&v));
    if t >= attn::MIN_QUERIES && attn::takes(d, softcap) {
        // SAFETY: validated above; `takes` holds.
        py.detach(move || unsafe { attn::prefill(qv, kv, vv, ms, scale, os) });
        return Ok(());
    }
    // SAFETY: validated above.
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

/// Whether bf16 prefill runs on AMX tiles (activations rounded to bf16, `llm::tiles`): returns
/// the setting in force before the call; `on` changes it (a benchmark interleaves both paths,
/// a user may want f32 activations). False whatever `on` says where the CPU has no tiles.
#[pyfunction]
#[pyo3(signature = (on=None))]
fn llm_prefill_tiles(on: Option<bool>) -> bool {
    let was = crate::llm::tiles::enabled() && crate::llm::tiles::available();
    if let Some(on) = on {
        crate::llm::tiles::set_enabled(on);
    }
    was
}

/// Whether fp32 prefill runs on the engine's own float32 GEMM (`llm::dense_gemm`) rather than
/// the panel GEMM every format shares: returns the setting in force before the call; `on`
/// changes it (a benchmark interleaves both paths).
#[pyfunction]
#[pyo3(signature = (on=None))]
fn llm_prefill_engine_gemm(on: Option<bool>) -> bool {
    let was = crate::llm::dense_gemm::enabled();
    if let Some(on) = on {
        crate::llm::dense_gemm::set_enabled(on);
    }
    was
}

/// Whether bf16 prefill runs on the engine's bfloat16 pair kernel (`llm::dense_gemm`:
/// `vdpbf16ps`, activations rounded to bf16) where the CPU has AVX-512 BF16 and no AMX tiles:
/// returns whether it did before the call (False where the CPU has no pair kernel); `on`
/// changes the setting (a benchmark interleaves both paths, a user may want f32 activations).
#[pyfunction]
#[pyo3(signature = (on=None))]
fn llm_prefill_bf16_pairs(on: Option<bool>) -> bool {
    let was = crate::llm::dense_gemm::pairs_enabled() && crate::kernels::gemm::bf16::pairs_available() && !crate::llm::tiles::available();
    if let Some(on) = on {
        crate::llm::dense_gemm::set_pairs_enabled(on);
    }
    was
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<LLMWeight>()?;
    m.add_class::<LLMModel>()?;
    m.add_class::<LLMKVCache>()?;
    m.add_function(wrap_pyfunction!(llm_pack_int8, m)?)?;
    m.add_function(wrap_pyfunction!(llm_prefill_tiles, m)?)?;
    m.add_function(wrap_pyfunction!(llm_prefill_engine_gemm, m)?)?;
    m.add_function(wrap_pyfunction!(llm_prefill_bf16_pairs, m)?)?;
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
