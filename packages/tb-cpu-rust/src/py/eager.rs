//! One unary elementwise op over a contiguous float32 buffer, for eager callers.
//!
//! tb-cython-dispatch's `turbo_torch.sin` & co. call this once per op when they have decided
//! (per signature, by timing) that it beats PyTorch's own kernel for that signature. No plan, no
//! descriptors: the caller has already checked that both tensors are contiguous float32 CPU
//! tensors of `n` elements that do not overlap, and hands over their data pointers. What is
//! checked here is only what cannot be wrong without a crash being possible from a correct
//! caller: a known op, and non-null aligned pointers when `n > 0`.

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

/// Validates the call; returns the op.
pub fn check(op: usize, src: usize, dst: usize, n: usize) -> Result<Un, String> {
    let (_, un) = *OPS.get(op).ok_or_else(|| format!("unknown unary op code {op} (known: 0..{})", OPS.len()))?;
    if n > 0 {
        if src == 0 || dst == 0 {
            return Err("null data pointer".into());
        }
        if !src.is_multiple_of(4) || !dst.is_multiple_of(4) {
            return Err("misaligned float32 data pointer".into());
        }
        if n > isize::MAX as usize / 4 {
            return Err(format!("{n} elements do not fit in memory"));
        }
    }
    Ok(un)
}

/// Whether the call is worth handing to other threads.
pub fn parallel(n: usize) -> bool {
    n >= 2 * CHUNK && crate::core::par::threads() > 1
}

/// out = op(inp) elementwise over `n` floats.
///
/// # Safety
/// `src` and `dst` must point to `n` valid float32 elements each; the two ranges are either the
/// same (in place) or do not overlap.
pub unsafe fn run(op: Un, src: usize, dst: usize, n: usize) {
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
    fn check_rejects_bad_calls() {
        assert!(check(OPS.len(), 4, 8, 1).is_err());
        assert!(check(0, 0, 8, 1).is_err());
        assert!(check(0, 6, 8, 1).is_err());
        assert!(check(0, 0, 0, 0).is_ok());
    }

    #[test]
    fn every_op_matches_the_executor_kernel_in_and_out_of_place() {
        let xs: Vec<f32> = (0..70_001).map(|i| ((i as f32) * 0.37).sin() * 30.0).collect();
        for (code, (_, un)) in OPS.iter().enumerate() {
            let mut want = vec![0f32; xs.len()];
            <f32 as Scalar>::un(*un, &mut want, &xs);
            let mut out = vec![0f32; xs.len()];
            check(code, xs.as_ptr() as usize, out.as_ptr() as usize, xs.len()).unwrap();
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
