//! Walking strided tensors: every multi-index of a shape with the element offsets of several
//! operands at once, the offsets of one linear index, and a shape or stride list without one dim.

/// Iterates every multi-index of `sizes` (row-major), passing the offsets of each operand.
#[inline]
pub fn for_each<const K: usize>(sizes: &[usize], strides: [&[usize]; K], mut f: impl FnMut([usize; K])) {
    walk(sizes, &strides, [0usize; K], |o| f(*o));
}

/// `for_each` for a number of operands known only at run time (one per index tensor).
pub fn for_each_dyn(sizes: &[usize], strides: &[&[usize]], mut f: impl FnMut(&[usize])) {
    walk(sizes, strides, vec![0usize; strides.len()], |o| f(o));
}

/// The one walker: an odometer over `sizes` that keeps each operand's offset up to date (one
/// add per step, a subtract per carry). `offs` is an array for `for_each`, so the operand loops
/// unroll there.
#[inline(always)]
fn walk<O: AsRef<[usize]> + AsMut<[usize]>>(sizes: &[usize], strides: &[&[usize]], mut offs: O, mut f: impl FnMut(&O)) {
    if sizes.contains(&0) {
        return;
    }
    let nd = sizes.len();
    let k = offs.as_ref().len();
    let strides = &strides[..k];
    let mut idx = vec![0usize; nd];
    loop {
        f(&offs);
        let mut d = nd;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            let o = offs.as_mut();
            for j in 0..k {
                o[j] += strides[j][d];
            }
            if idx[d] < sizes[d] {
                break;
            }
            for j in 0..k {
                o[j] -= strides[j][d] * sizes[d];
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
