//! `unary_f32`: one unary elementwise op from a contiguous float32 tensor into another (or in
//! place), for eager callers (`NativeCpuEngine.eager_kernel`, which tb-cython-dispatch's
//! `turbo_torch.sin` & co. reach through tb-core). No plan: both tensors are validated by
//! `args` (CPU, float32, contiguous, the same number of elements, the same memory or none in
//! common); the op runs over their memory, on the kernel thread team when it is large.

use pyo3::prelude::*;

use super::args::{self, err, Want};
use crate::core::tensor::DType;
use crate::core::math::unary::Un;
use crate::kernels::elementwise::Scalar;

/// The ops, by the code the Python side passes (index into this table).
pub const OPS: [(&str, Un); 9] = [
    ("sin", Un::Sin),
    ("cos", Un::Cos),
    ("tanh", Un::Tanh),
    ("exp", Un::Exp),
    ("sigmoid", Un::Sigmoid),
    ("relu", Un::Relu),
    ("sqrt", Un::Sqrt),
    ("abs", Un::Abs),
    ("neg", Un::Neg),
];

/// Elements per parallel chunk: below two of them the op runs on the calling thread.
const CHUNK: usize = 1 << 15;

pub fn op_names() -> Vec<&'static str> {
    OPS.iter().map(|(n, _)| *n).collect()
}

/// The op of a code.
pub fn op(code: usize) -> Result<Un, String> {
    OPS.get(code).map(|&(_, un)| un).ok_or_else(|| format!("unknown unary op code {code} (known: 0..{})", OPS.len()))
}

const F32: Want = Want::of(&[DType::F32]).contiguous();

/// `dst = op(src)` elementwise; `dst` may be `src` itself.
#[pyfunction]
pub fn unary_f32(py: Python<'_>, op: usize, src: &Bound<'_, PyAny>, dst: &Bound<'_, PyAny>) -> PyResult<()> {
    let un = self::op(op).map_err(err)?;
    let s = args::tensor(src, "src", F32)?;
    let d = args::tensor(dst, "dst", F32)?;
    if d.numel() != s.numel() {
        return Err(err(format!("dst: {} elements where src has {}", d.numel(), s.numel())));
    }
    if d.ptr != s.ptr && d.overlaps(&s) {
        return Err(err("dst overlaps src (in place takes the same tensor twice)"));
    }
    let (src, dst, n) = (s.ptr, d.ptr, s.numel());
    if parallel(n) {
        // SAFETY: validated above; `src` and `dst` hold the tensors until this returns
        py.detach(move || unsafe { run(un, src, dst, n) });
    } else {
        // SAFETY: as above
        unsafe { run(un, src, dst, n) };
    }
    Ok(())
}

/// The op names `unary_f32` takes, by code.
#[pyfunction]
pub fn unary_ops() -> Vec<&'static str> {
    op_names()
}

/// Whether the call is worth handing to other threads.
fn parallel(n: usize) -> bool {
    n >= 2 * CHUNK && crate::core::par::threads() > 1
}

/// out = op(inp) elementwise over `n` floats.
///
/// # Safety
/// `src` and `dst` must point to `n` valid float32 elements each; the two ranges are either the
/// same (in place) or do not overlap.
unsafe fn run(op: Un, src: usize, dst: usize, n: usize) {
    if n == 0 {
        return;
    }
    if src == dst {
        // in place: read each block into a stack copy first (the kernels take disjoint slices)
        let body = |lo: usize, hi: usize| {
            // SAFETY: chunks [lo, hi) of one buffer of n floats; chunks do not overlap
            let chunk = unsafe { std::slice::from_raw_parts_mut((dst as *mut f32).add(lo), hi - lo) };
            let mut tmp = [0f32; 256];
            for block in chunk.chunks_mut(256) {
                let t = &mut tmp[..block.len()];
                t.copy_from_slice(block);
                <f32 as Scalar>::un(op, block, t);
            }
        };
        chunked(n, body);
        return;
    }
    chunked(n, |lo, hi| {
        // SAFETY: chunk [lo, hi) of two non-overlapping buffers of n floats; chunks do not overlap
        let (i, o) = unsafe {
            (std::slice::from_raw_parts((src as *const f32).add(lo), hi - lo), std::slice::from_raw_parts_mut((dst as *mut f32).add(lo), hi - lo))
        };
        <f32 as Scalar>::un(op, o, i);
    });
}

/// `f(lo, hi)` over [0, n) in CHUNK-sized pieces, on the kernel thread team when `parallel(n)`.
fn chunked(n: usize, f: impl Fn(usize, usize) + Sync + Send) {
    if parallel(n) {
        crate::core::par::for_each(n.div_ceil(CHUNK), |c| f(c * CHUNK, ((c + 1) * CHUNK).min(n)));
    } else {
        f(0, n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_codes_are_checked() {
        assert!(op(OPS.len()).is_err());
        assert!(op(0).is_ok());
    }

    #[test]
    fn every_op_matches_the_executor_kernel_in_and_out_of_place() {
        let xs: Vec<f32> = (0..70_001).map(|i| ((i as f32) * 0.37).sin() * 30.0).collect();
        for (_, un) in OPS.iter() {
            let mut want = vec![0f32; xs.len()];
            <f32 as Scalar>::un(*un, &mut want, &xs);
            let mut out = vec![0f32; xs.len()];
            // SAFETY: both buffers hold xs.len() floats
            unsafe { run(*un, xs.as_ptr() as usize, out.as_mut_ptr() as usize, xs.len()) };
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&out), bits(&want));
            let mut inplace = xs.clone();
            // SAFETY: in place over one buffer of xs.len() floats
            unsafe { run(*un, inplace.as_ptr() as usize, inplace.as_mut_ptr() as usize, xs.len()) };
            assert_eq!(bits(&inplace), bits(&want));
        }
    }
}
