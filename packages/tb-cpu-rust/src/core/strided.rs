//! Walking strided tensors: every multi-index of a shape with the element offsets of several
//! operands at once, the offsets of one linear index, and a shape or stride list without one dim.

/// Iterates every multi-index of `sizes`, passing the offsets of each operand.
pub fn for_each<const K: usize>(sizes: &[usize], strides: [&[usize]; K], mut f: impl FnMut([usize; K])) {
    if sizes.contains(&0) {
        return;
    }
    let nd = sizes.len();
    let mut idx = vec![0usize; nd];
    let mut offs = [0usize; K];
    loop {
        f(offs);
        let mut d = nd;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            for k in 0..K {
                offs[k] += strides[k][d];
            }
            if idx[d] < sizes[d] {
                break;
            }
            for k in 0..K {
                offs[k] -= strides[k][d] * sizes[d];
            }
            idx[d] = 0;
        }
    }
}

/// Offsets of operand `strides` at multi-index number `linear` of `sizes` (row-major).
pub fn offset_of(linear: usize, sizes: &[usize], strides: &[usize]) -> usize {
    let mut r = linear;
    let mut o = 0;
    for d in (0..sizes.len()).rev() {
        o += (r % sizes[d]) * strides[d];
        r /= sizes[d];
    }
    o
}

pub fn drop_dim(v: &[usize], d: usize) -> Vec<usize> {
    v.iter().enumerate().filter(|&(i, _)| i != d).map(|(_, &x)| x).collect()
}
