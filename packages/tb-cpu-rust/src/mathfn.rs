//! Branch-free float32 approximations of exp/erf/tanh that LLVM vectorises inside the
//! AVX2/AVX-512 instantiations of the kernels. Errors are a few ulp, far inside the float32
//! tolerance of `torch.testing.assert_close`.

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_145_75;
const LN2_LO: f32 = 1.428_606_8e-6;

#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let xc = x.clamp(-87.0, 88.72);
    let k = (xc * LOG2E + 0.5).floor();
    let r = xc - k * LN2_HI - k * LN2_LO;
    let p = 1.0 / 5040.0;
    let p = p * r + 1.0 / 720.0;
    let p = p * r + 1.0 / 120.0;
    let p = p * r + 1.0 / 24.0;
    let p = p * r + 1.0 / 6.0;
    let p = p * r + 0.5;
    let p = p * r + 1.0;
    let p = p * r + 1.0;
    // 2^(k-1) * 2: k reaches 128 near the top of the range, which has no f32 exponent
    let scale = f32::from_bits((((k as i32) + 126) as u32) << 23);
    let mut y = p * scale * 2.0;
    if x > 88.72 {
        y = f32::INFINITY;
    }
    if x < -87.3 {
        y = 0.0;
    }
    if x.is_nan() {
        y = x;
    }
    y
}

#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let a = x.abs();
    let e = exp(2.0 * a.min(20.0));
    let big = 1.0 - 2.0 / (e + 1.0);
    let x2 = x * x;
    // small |x|: odd Taylor series avoids the cancellation of 1 - 2/(e+1)
    let small = a * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0))));
    let t = if a < 0.0625 { small } else { big };
    let r = if x < 0.0 { -t } else { t };
    if x.is_nan() {
        x
    } else {
        r
    }
}

/// erf, Abramowitz & Stegun 7.1.26 (series near 0): |error| about 1e-6 absolute in f32.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = t * (0.254_829_6 + t * (-0.284_496_74 + t * (1.421_413_7 + t * (-1.453_152_1 + t * 1.061_405_4))));
    let big = 1.0 - poly * exp(-a * a);
    // near 0 the series is more accurate in relative terms
    let x2 = a * a;
    let small = a * (std::f32::consts::FRAC_2_SQRT_PI + x2 * (-0.376_126_4 + x2 * (0.112_837_92 + x2 * (-0.026_866_17))));
    let r = if a < 0.25 { small } else { big };
    let r = if x < 0.0 { -r } else { r };
    if x.is_nan() {
        x
    } else {
        r
    }
}

#[inline(always)]
pub fn gelu_erf(x: f32) -> f32 {
    let y = 0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2));
    // PyTorch's CPU kernel gives NaN for both infinities; match it
    if x.is_infinite() {
        f32::NAN
    } else {
        y
    }
}

#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    const K: f32 = 0.797_884_6; // sqrt(2/pi)
    0.5 * x * (1.0 + tanh(K * (x + 0.044_715 * x * x * x)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_std() {
        let mut x = -90.0f32;
        while x < 90.0 {
            let (a, b) = (exp(x), x.exp());
            assert!(a == b || (a - b).abs() <= 4e-7 * b.abs() + 1e-37, "exp({x}) = {a} vs {b}");
            x += 0.0137;
        }
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn erf_tanh_match_reference() {
        let mut x = -6.0f32;
        while x < 6.0 {
            assert!((erf(x) - libm::erff(x)).abs() < 1.5e-6, "erf({x})");
            assert!((tanh(x) - x.tanh()).abs() < 3e-7 + 3e-7 * x.tanh().abs(), "tanh({x})");
            x += 0.00731;
        }
        assert_eq!(tanh(f32::INFINITY), 1.0);
        assert_eq!(erf(f32::NEG_INFINITY), -1.0);
    }
}
