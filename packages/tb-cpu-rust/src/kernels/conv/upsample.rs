//! Resampling: linear (bilinear, trilinear) and bicubic upsampling, and `grid_sampler_2d`
//! (bilinear, nearest, bicubic; zeros, border and reflection padding). Index and weight
//! arithmetic is float32 in the order ATen's CPU kernels use, so weights match bit for bit.

use crate::core::mem::Mem;
use crate::core::tensor::{need, DType, Result, View};
use crate::kernels::registry::{infallible, Args, Built, StepDef};
use serde::Deserialize;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Linear,
    Cubic,
}

pub enum Resample {
    /// x (N, C, *in), y (N, C, *out) with 2 or 3 spatial dims; `scales` as given to the op (0: none)
    Up { x: View, y: View, kind: Kind, align: bool, scales: Vec<f64> },
    /// x (N, C, H, W), grid (N, OH, OW, 2) -> y (N, C, OH, OW)
    Grid { x: View, grid: View, y: View, mode: i64, padding: i64, align: bool },
    /// x (N, C, D, H, W), grid (N, OD, OH, OW, 3) -> y (N, C, OD, OH, OW); trilinear or nearest
    Grid3 { x: View, grid: View, y: View, mode: i64, padding: i64, align: bool },
}

const A: f32 = -0.75;

fn cubic_coeffs(t: f32) -> [f32; 4] {
    let c1 = |x: f32| ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    let c2 = |x: f32| ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
    [c2(t + 1.0), c1(t), c1(1.0 - t), c2(2.0 - t)]
}

fn area_scale(input: usize, output: usize, align: bool, scale: f64) -> f32 {
    if align {
        if output > 1 {
            (input as f32 - 1.0) / (output as f32 - 1.0)
        } else {
            0.0
        }
    } else if scale > 0.0 {
        (1.0 / scale) as f32
    } else {
        input as f32 / output as f32
    }
}

fn source_index(scale: f32, dst: usize, align: bool, cubic: bool) -> f32 {
    if align {
        scale * dst as f32
    } else {
        let src = scale * (dst as f32 + 0.5) - 0.5;
        if !cubic && src < 0.0 {
            0.0
        } else {
            src
        }
    }
}

/// (index, lambda) as ATen's guard_index_and_lambda.
fn guard(real: f32, size: usize) -> (i64, f32) {
    let i = (real.floor() as i64).min(size as i64 - 1);
    let l = (real - i as f32).clamp(0.0, 1.0);
    (i, l)
}

/// Per output index along one dim: the input indices and weights that mix into it.
fn taps(input: usize, output: usize, align: bool, scale: f64, kind: Kind) -> Vec<(Vec<usize>, Vec<f32>)> {
    let s = area_scale(input, output, align, scale);
    (0..output)
        .map(|o| match kind {
            Kind::Linear => {
                let real = source_index(s, o, align, false);
                let (i0, l1) = guard(real, input);
                let i0 = i0.max(0) as usize;
                let i1 = if i0 + 1 < input { i0 + 1 } else { i0 };
                (vec![i0, i1], vec![1.0 - l1, l1])
            }
            Kind::Cubic => {
                let real = source_index(s, o, align, true);
                let (i0, t) = guard(real, input);
                let idx = (0..4).map(|j| (i0 - 1 + j).clamp(0, input as i64 - 1) as usize).collect();
                (idx, cubic_coeffs(t).to_vec())
            }
        })
        .collect()
}

fn reflect(x: f32, twice_low: i64, twice_high: i64) -> f32 {
    if twice_low == twice_high {
        return 0.0;
    }
    let min = twice_low as f32 / 2.0;
    let span = (twice_high - twice_low) as f32 / 2.0;
    let x = (x - min).abs();
    let extra = x % span;
    let flips = (x / span).floor() as i64;
    if flips % 2 == 0 {
        extra + min
    } else {
        span - extra + min
    }
}

fn pad_coord(c: f32, size: usize, padding: i64, align: bool) -> f32 {
    let clip = |c: f32| (size as f32 - 1.0).min(c.max(0.0));
    let c = match padding {
        1 => clip(c),
        2 => {
            let r = if align { reflect(c, 0, 2 * (size as i64 - 1)) } else { reflect(c, -1, 2 * size as i64 - 1) };
            clip(r)
        }
        _ => c,
    };
    // ATen's safe_downgrade_to_int_range: non-finite or huge coordinates become -100
    if !c.is_finite() || c.abs() > (i32::MAX / 2) as f32 {
        -100.0
    } else {
        c
    }
}

fn unnormalize(c: f32, size: usize, align: bool) -> f32 {
    if align {
        (c + 1.0) / 2.0 * (size as f32 - 1.0)
    } else {
        ((c + 1.0) * size as f32 - 1.0) / 2.0
    }
}

/// The parameters of each step kind of this family, by name: a scale of 0 means "from the
/// sizes"; interpolation 0 bilinear, 1 nearest, 2 bicubic; padding 0 zeros, 1 border, 2 reflection.
#[derive(Deserialize)]
#[serde(tag = "op", deny_unknown_fields)]
pub enum Params {
    #[serde(rename = "upsample_linear", alias = "upsample_cubic")]
    Up { align_corners: bool, scales: Vec<f64> },
    #[serde(rename = "grid_sampler_2d", alias = "grid_sampler_3d")]
    Grid { align_corners: bool, interpolation: i64, padding: i64 },
}

pub const STEPS: &[StepDef] = &[StepDef::core("upsample_linear", build), StepDef::core("upsample_cubic", build),
    StepDef::core("grid_sampler_2d", build), StepDef::core("grid_sampler_3d", build)];

fn build(a: &Args) -> Built {
    let k = Resample::new(a.op, &a.ins, &a.outs, a.tagged()?)?;
    infallible(move |mem| unsafe { k.run(mem) })
}

impl Resample {
    pub fn new(op: &str, ins: &[Option<View>], outs: &[View], p: Params) -> Result<Resample> {
        let get = |i: usize| ins.get(i).cloned().flatten().ok_or_else(|| format!("{op}: missing operand {i}"));
        let y = outs.first().cloned().ok_or_else(|| format!("{op}: missing output"))?;
        let x = get(0)?;
        need(x.dtype == DType::F32 && y.dtype == DType::F32, "resampling takes float32")?;
        let (align, scales, mode, padding) = match p {
            Params::Up { align_corners, scales } => (align_corners, scales, 0, 0),
            Params::Grid { align_corners, interpolation, padding } => (align_corners, Vec::new(), interpolation, padding),
        };
        match op {
            "upsample_linear" | "upsample_cubic" => {
                let nd = x.rank().saturating_sub(2);
                need((1..=3).contains(&nd) && y.rank() == x.rank() && x.sizes[..2] == y.sizes[..2], "upsample: (N, C, ...) in and out")?;
                need(x.sizes[2..].iter().all(|&s| s > 0) || y.numel() == 0, "upsample of an empty plane")?;
                let kind = if op == "upsample_cubic" { Kind::Cubic } else { Kind::Linear };
                let scales = (0..nd).map(|i| scales.get(i).copied().unwrap_or(0.0)).collect();
                Ok(Resample::Up { x, y, kind, align, scales })
            }
            "grid_sampler_2d" => {
                let grid = get(1)?;
                need(grid.dtype == DType::F32 && x.rank() == 4 && grid.rank() == 4 && grid.sizes[3] == 2, "grid_sampler_2d shapes")?;
                need(grid.sizes[0] == x.sizes[0] && y.sizes == [x.sizes[0], x.sizes[1], grid.sizes[1], grid.sizes[2]], "grid_sampler_2d output shape")?;
                need((0..=2).contains(&mode) && (0..=2).contains(&padding), "grid_sampler_2d mode or padding")?;
                Ok(Resample::Grid { x, grid, y, mode, padding, align })
            }
            "grid_sampler_3d" => {
                let grid = get(1)?;
                need(grid.dtype == DType::F32 && x.rank() == 5 && grid.rank() == 5 && grid.sizes[4] == 3, "grid_sampler_3d shapes")?;
                need(grid.sizes[0] == x.sizes[0] && y.sizes == [x.sizes[0], x.sizes[1], grid.sizes[1], grid.sizes[2], grid.sizes[3]], "grid_sampler_3d output shape")?;
                need((0..=1).contains(&mode) && (0..=2).contains(&padding), "grid_sampler_3d mode or padding")?;
                Ok(Resample::Grid3 { x, grid, y, mode, padding, align })
            }
            other => Err(format!("unknown resampling kernel {other:?}")),
        }
    }

    /// # Safety
    /// The views must have been validated by the executor.
    pub unsafe fn run(&self, mem: &Mem) {
        match self {
            Resample::Up { x, y, kind, align, scales } => {
                let nd = x.rank() - 2;
                let per_dim: Vec<Vec<(Vec<usize>, Vec<f32>)>> =
                    (0..nd).map(|d| taps(x.sizes[2 + d], y.sizes[2 + d], *align, scales[d], *kind)).collect();
                let (px, py) = (mem.ptr::<f32>(x), mem.ptr::<f32>(y));
                let osp: Vec<usize> = y.sizes[2..].to_vec();
                let nsp: usize = osp.iter().product();
                let mut at = vec![0usize; nd];
                for n in 0..x.sizes[0] {
                    for c in 0..x.sizes[1] {
                        let xb = n * x.strides[0] + c * x.strides[1];
                        let yb = n * y.strides[0] + c * y.strides[1];
                        for lin in 0..nsp {
                            let mut r = lin;
                            for d in (0..nd).rev() {
                                at[d] = r % osp[d];
                                r /= osp[d];
                            }
                            // nested sums, innermost dim first, as ATen's separable kernels
                            let v = mix(&per_dim, &at, 0, xb, &x.strides[2..], px.get());
                            let mut yo = yb;
                            for d in 0..nd {
                                yo += at[d] * y.strides[2 + d];
                            }
                            *py.add(yo) = v;
                        }
                    }
                }
            }
            Resample::Grid3 { x, grid, y, mode, padding, align } => {
                let (px, pg, py) = (mem.ptr::<f32>(x), mem.ptr::<f32>(grid), mem.ptr::<f32>(y));
                let (d, h, w) = (x.sizes[2], x.sizes[3], x.sizes[4]);
                let gs = &grid.strides;
                for n in 0..y.sizes[0] {
                    for od in 0..y.sizes[2] {
                        for oh in 0..y.sizes[3] {
                            for ow in 0..y.sizes[4] {
                                let g = n * gs[0] + od * gs[1] + oh * gs[2] + ow * gs[3];
                                let (gx, gy, gz) = (*pg.add(g), *pg.add(g + gs[4]), *pg.add(g + 2 * gs[4]));
                                let u = [unnormalize(gx, w, *align), unnormalize(gy, h, *align), unnormalize(gz, d, *align)];
                                grid3_point(x, px.get(), y, py.get(), n, [od, oh, ow], u, *mode, *padding, *align);
                            }
                        }
                    }
                }
            }
            Resample::Grid { x, grid, y, mode, padding, align } => {
                let (px, pg, py) = (mem.ptr::<f32>(x), mem.ptr::<f32>(grid), mem.ptr::<f32>(y));
                let (c_n, h, w) = (x.sizes[1], x.sizes[2], x.sizes[3]);
                let get = |n: usize, c: usize, yy: i64, xx: i64| -> f32 {
                    if yy >= 0 && xx >= 0 && (yy as usize) < h && (xx as usize) < w {
                        *px.add(n * x.strides[0] + c * x.strides[1] + yy as usize * x.strides[2] + xx as usize * x.strides[3])
                    } else {
                        0.0
                    }
                };
                for n in 0..y.sizes[0] {
                    for oh in 0..y.sizes[2] {
                        for ow in 0..y.sizes[3] {
                            let g = n * grid.strides[0] + oh * grid.strides[1] + ow * grid.strides[2];
                            let gx = *pg.add(g);
                            let gy = *pg.add(g + grid.strides[3]);
                            let (ux, uy) = (unnormalize(gx, w, *align), unnormalize(gy, h, *align));
                            for c in 0..c_n {
                                let v = match mode {
                                    0 => {
                                        let (ix, iy) = (pad_coord(ux, w, *padding, *align), pad_coord(uy, h, *padding, *align));
                                        let (x0, y0) = (ix.floor(), iy.floor());
                                        let (x1, y1) = (x0 + 1.0, y0 + 1.0);
                                        let (nw, ne) = ((x1 - ix) * (y1 - iy), (ix - x0) * (y1 - iy));
                                        let (sw, se) = ((x1 - ix) * (iy - y0), (ix - x0) * (iy - y0));
                                        let (x0, y0) = (x0 as i64, y0 as i64);
                                        get(n, c, y0, x0) * nw + get(n, c, y0, x0 + 1) * ne + get(n, c, y0 + 1, x0) * sw + get(n, c, y0 + 1, x0 + 1) * se
                                    }
                                    1 => {
                                        let (ix, iy) = (pad_coord(ux, w, *padding, *align), pad_coord(uy, h, *padding, *align));
                                        get(n, c, iy.round_ties_even() as i64, ix.round_ties_even() as i64)
                                    }
                                    _ => {
                                        let (x0, y0) = (ux.floor(), uy.floor());
                                        let (cx, cy) = (cubic_coeffs(ux - x0), cubic_coeffs(uy - y0));
                                        let mut acc = 0f32;
                                        for (j, wy) in cy.iter().enumerate() {
                                            let mut row = 0f32;
                                            for (i, wx) in cx.iter().enumerate() {
                                                let xx = pad_coord(x0 - 1.0 + i as f32, w, *padding, *align) as i64;
                                                let yy = pad_coord(y0 - 1.0 + j as f32, h, *padding, *align) as i64;
                                                row += get(n, c, yy, xx) * wx;
                                            }
                                            acc += row * wy;
                                        }
                                        acc
                                    }
                                };
                                *py.add(n * y.strides[0] + c * y.strides[1] + oh * y.strides[2] + ow * y.strides[3]) = v;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// One output point of a 3-d grid sample for every channel.
#[allow(clippy::too_many_arguments)]
unsafe fn grid3_point(x: &View, px: *mut f32, y: &View, py: *mut f32, n: usize, o: [usize; 3], u: [f32; 3], mode: i64, padding: i64, align: bool) {
    let (d, h, w) = (x.sizes[2], x.sizes[3], x.sizes[4]);
    let get = |c: usize, zz: i64, yy: i64, xx: i64| -> f32 {
        if zz >= 0 && yy >= 0 && xx >= 0 && (zz as usize) < d && (yy as usize) < h && (xx as usize) < w {
            *px.add(n * x.strides[0] + c * x.strides[1] + zz as usize * x.strides[2] + yy as usize * x.strides[3] + xx as usize * x.strides[4])
        } else {
            0.0
        }
    };
    let (ix, iy, iz) = (pad_coord(u[0], w, padding, align), pad_coord(u[1], h, padding, align), pad_coord(u[2], d, padding, align));
    for c in 0..x.sizes[1] {
        let v = if mode == 1 {
            get(c, iz.round_ties_even() as i64, iy.round_ties_even() as i64, ix.round_ties_even() as i64)
        } else {
            let (x0, y0, z0) = (ix.floor(), iy.floor(), iz.floor());
            let (wx, wy, wz) = ([x0 + 1.0 - ix, ix - x0], [y0 + 1.0 - iy, iy - y0], [z0 + 1.0 - iz, iz - z0]);
            let (x0, y0, z0) = (x0 as i64, y0 as i64, z0 as i64);
            let mut acc = 0f32;
            for (k, &fz) in wz.iter().enumerate() {
                for (j, &fy) in wy.iter().enumerate() {
                    for (i, &fx) in wx.iter().enumerate() {
                        acc += get(c, z0 + k as i64, y0 + j as i64, x0 + i as i64) * (fx * fy * fz);
                    }
                }
            }
            acc
        };
        *py.add(n * y.strides[0] + c * y.strides[1] + o[0] * y.strides[2] + o[1] * y.strides[3] + o[2] * y.strides[4]) = v;
    }
}

/// Sum over the taps of dims d.. of the input at output position `at`.
unsafe fn mix(per_dim: &[Vec<(Vec<usize>, Vec<f32>)>], at: &[usize], d: usize, base: usize, strides: &[usize], px: *mut f32) -> f32 {
    let (idx, wts) = &per_dim[d][at[d]];
    let mut acc = 0f32;
    for (&i, &w) in idx.iter().zip(wts) {
        let off = base + i * strides[d];
        let v = if d + 1 == per_dim.len() { *px.add(off) } else { mix(per_dim, at, d + 1, off, strides, px) };
        acc += v * w;
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coefficients_sum_to_one() {
        for t in [0.0f32, 0.25, 0.5, 0.9] {
            let s: f32 = cubic_coeffs(t).iter().sum();
            assert!((s - 1.0).abs() < 1e-6);
        }
        let t = taps(4, 8, false, 0.0, Kind::Linear);
        assert_eq!(t[0].0, vec![0, 1]);
        assert_eq!(t[7].0, vec![3, 3]);
        assert!((reflect(-0.5, -1, 7) - (-0.5)).abs() < 1e-6);
        assert!((reflect(4.5, 0, 6) - 1.5).abs() < 1e-6);
    }
}
