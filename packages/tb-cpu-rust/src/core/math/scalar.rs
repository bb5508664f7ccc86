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
    odd(x, if a < 0.0625 { small } else { big })
}

/// An odd function's value at `x` from its value `r` at |x|; NaN stays the input NaN.
#[inline(always)]
fn odd(x: f32, r: f32) -> f32 {
    if x.is_nan() {
        x
    } else if x < 0.0 {
        -r
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
    odd(x, if a < 0.25 { small } else { big })
}

#[inline(always)]
pub fn gelu_erf(x: f32) -> f32 {
    // as PyTorch's CPU kernel: 0.5·x·(1 + erf(x/√2)) read literally, so +inf -> inf, -inf -> NaN (-inf·0)
    if x == f32::INFINITY {
        return x;
    }
    if x == f32::NEG_INFINITY {
        return f32::NAN;
    }
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    const K: f32 = 0.797_884_6; // sqrt(2/pi)
    0.5 * x * (1.0 + tanh(K * (x + 0.044_715 * x * x * x)))
}

// ---- special functions (float64 inside: these are not on a hot path and float32 needs the headroom)

/// log|Γ(x)|: Lanczos (g = 7, 9 terms) for x >= 0.5, the reflection formula below.
pub fn lgamma(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    if x.is_infinite() {
        return f64::INFINITY;
    }
    if x <= 0.0 && x == x.floor() {
        return f64::INFINITY;
    }
    if x < 0.5 {
        let s = (std::f64::consts::PI * x).sin().abs();
        return (std::f64::consts::PI / s).ln() - lgamma(1.0 - x);
    }
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + 7.5;
    for (i, &c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// ψ(x): recurrence up to x >= 6, then the asymptotic series; reflection for x < 0.
pub fn digamma(x: f64) -> f64 {
    if x.is_nan() || x == f64::NEG_INFINITY {
        return f64::NAN;
    }
    if x == 0.0 {
        // PyTorch: ψ(±0) = ∓inf
        return if x.is_sign_negative() { f64::INFINITY } else { f64::NEG_INFINITY };
    }
    if x < 0.0 {
        if x == x.floor() {
            return f64::NAN;
        }
        return digamma(1.0 - x) - std::f64::consts::PI / (std::f64::consts::PI * x).tan();
    }
    let mut acc = 0.0;
    let mut x = x;
    while x < 6.0 {
        acc -= 1.0 / x;
        x += 1.0;
    }
    let r = 1.0 / (x * x);
    let series = r * (1.0 / 12.0 - r * (1.0 / 120.0 - r * (1.0 / 252.0 - r * (1.0 / 240.0 - r * (1.0 / 132.0)))));
    acc + x.ln() - 0.5 / x - series
}

/// Hurwitz ζ(s, q) = Σ (k + q)^-s by Euler–Maclaurin summation (the Cephes scheme PyTorch uses).
pub fn zeta(s: f64, q: f64) -> f64 {
    const B: [f64; 12] = [
        12.0,
        -720.0,
        30_240.0,
        -1_209_600.0,
        47_900_160.0,
        -1.892_437_580_318_379_2e9,
        7.472_424_96e10,
        -2.950_130_727_918_164e12,
        1.164_678_281_435_006_7e14,
        -4.597_978_722_407_473e15,
        1.815_210_540_194_354_7e17,
        -7.166_165_256_175_667e18,
    ];
    let eps = f64::EPSILON;
    if s == 1.0 {
        return f64::INFINITY;
    }
    if s < 1.0 || s.is_nan() || q.is_nan() {
        return f64::NAN;
    }
    if q <= 0.0 {
        if q == q.floor() {
            return f64::INFINITY;
        }
        if s != s.floor() {
            return f64::NAN;
        }
    }
    let mut sum = q.powf(-s);
    let mut a = q;
    let mut b = 0.0;
    let mut i = 0;
    while i < 9 || a <= 9.0 {
        i += 1;
        a += 1.0;
        b = a.powf(-s);
        sum += b;
        if (b / sum).abs() < eps {
            return sum;
        }
    }
    let w = a;
    sum += b * w / (s - 1.0);
    sum -= 0.5 * b;
    let mut fac = 1.0;
    let mut k = 0.0;
    for c in B {
        fac *= s + k;
        b /= w;
        let t = fac * b / c;
        sum += t;
        if (t / sum).abs() < eps {
            break;
        }
        k += 1.0;
        fac *= s + k;
        b /= w;
        k += 1.0;
    }
    sum
}

/// The fit shared by `erfc` and `erfcx` at `z = |x|`: `(t, p)` with `exp(z²)·erfc(z) = t·exp(p)`.
fn erfc_fit(z: f64) -> (f64, f64) {
    let t = 1.0 / (1.0 + 0.5 * z);
    let mut p = 0.170_872_77;
    for c in [-0.822_152_23, 1.488_515_87, -1.135_203_98, 0.278_868_07, -0.186_288_06, 0.096_784_18, 0.374_091_96, 1.000_023_68, -1.265_512_23] {
        p = c + t * p;
    }
    (t, p)
}

/// erfc with relative error below 1.2e-7 everywhere (Chebyshev fit of exp(x²)·erfc(x)).
pub fn erfc(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let z = x.abs();
    let (t, p) = erfc_fit(z);
    let r = t * (-z * z + p).exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// erf⁻¹ (Giles' single-precision fit), then one Newton step against erfc in float64.
pub fn erfinv(y: f64) -> f64 {
    if y.is_nan() || !(-1.0..=1.0).contains(&y) {
        return f64::NAN;
    }
    if y == 1.0 {
        return f64::INFINITY;
    }
    if y == -1.0 {
        return f64::NEG_INFINITY;
    }
    let mut w = -((1.0 - y) * (1.0 + y)).ln();
    let p = if w < 5.0 {
        w -= 2.5;
        let mut p = 2.810_226_36e-08;
        for c in [3.432_739_39e-07, -3.523_387_7e-06, -4.391_506_54e-06, 0.000_218_580_87, -0.001_253_725_03, -0.004_177_681_64, 0.246_640_727, 1.501_409_41] {
            p = c + p * w;
        }
        p
    } else {
        w = w.sqrt() - 3.0;
        let mut p = -0.000_200_214_257;
        for c in [0.000_100_950_558, 0.001_349_343_22, -0.003_673_428_44, 0.005_739_507_73, -0.007_622_461_3, 0.009_438_870_47, 1.001_674_06, 2.832_976_82] {
            p = c + p * w;
        }
        p
    };
    let x = p * y;
    // erf(x) - y = (1 - erfc(x)) - y; d/dx erf = 2/√π e^{-x²}
    let err = (1.0 - erfc(x)) - y;
    x - err / (2.0 / std::f64::consts::PI.sqrt() * (-x * x).exp())
}

/// The next float32 after `x` towards `y` (C `nextafterf`).
pub fn nextafter(x: f32, y: f32) -> f32 {
    if x.is_nan() || y.is_nan() {
        return f32::NAN;
    }
    if x == y {
        return y;
    }
    if x == 0.0 {
        let tiny = f32::from_bits(1);
        return if y > 0.0 { tiny } else { -tiny };
    }
    let bits = x.to_bits();
    let up = (y > x) == (x > 0.0);
    f32::from_bits(if up { bits + 1 } else { bits - 1 })
}

/// exp(x²)·erfc(x) from the same fit as `erfc`, without the overflow of the naive product.
pub fn erfcx(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let z = x.abs();
    let (t, p) = erfc_fit(z);
    let r = t * p.exp();
    if x >= 0.0 {
        r
    } else {
        2.0 * (x * x).exp() - r
    }
}

/// Modified Bessel functions of the first kind, orders 0 and 1, optionally scaled by e^-|x|:
/// the power series up to |x| = 50, the asymptotic expansion above.
pub fn bessel_i(order: u32, x: f64, scaled: bool) -> f64 {
    if x.is_nan() {
        return x;
    }
    let z = x.abs();
    let sign = if order == 1 && x < 0.0 { -1.0 } else { 1.0 };
    if z <= 50.0 {
        let q = z * z / 4.0;
        let mut term = if order == 0 { 1.0 } else { z / 2.0 };
        let mut sum = term;
        let mut k = 1.0;
        while k < 500.0 {
            term *= q / (k * (k + order as f64));
            sum += term;
            if term < sum * 1e-17 {
                break;
            }
            k += 1.0;
        }
        return sign * if scaled { sum * (-z).exp() } else { sum };
    }
    let mu = 4.0 * (order * order) as f64;
    let mut a = 1.0;
    let mut sum = 1.0;
    for k in 1..12 {
        let odd = (2 * k - 1) as f64;
        a *= -(mu - odd * odd) / (k as f64 * 8.0 * z);
        sum += a;
    }
    let scaled_value = sum / (2.0 * std::f64::consts::PI * z).sqrt();
    sign * if scaled { scaled_value } else { scaled_value * z.exp() }
}

/// sin(x)/x, 1 at 0.
pub fn spherical_j0(x: f64) -> f64 {
    if x.is_infinite() {
        return 0.0;
    }
    if x.abs() < 1e-4 {
        return 1.0 - x * x / 6.0;
    }
    x.sin() / x
}

/// The orthogonal polynomials of `torch.special`, by their three-term recurrences in float32
/// (the order PyTorch evaluates them in, so rounding agrees).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Poly {
    ChebT,
    ChebU,
    ChebV,
    ChebW,
    HermiteH,
    HermiteHe,
    LaguerreL,
    LegendreP,
}

pub fn poly(kind: Poly, x: f32, n: f32) -> f32 {
    if n.is_nan() {
        return f32::NAN;
    }
    let n = n as i64;
    if n < 0 {
        return 0.0;
    }
    let even = n % 2 == 0;
    let nf = n as f32;
    match kind {
        Poly::ChebT => {
            if x.abs() == 1.0 {
                return if x > 0.0 || even { 1.0 } else { -1.0 };
            }
            if n > 6 && x.abs() < 1.0 {
                return (nf * x.acos()).cos();
            }
        }
        Poly::ChebU => {
            if x.abs() == 1.0 {
                return if x > 0.0 || even { nf + 1.0 } else { -(nf + 1.0) };
            }
            if n > 8 && x.abs() < 1.0 {
                let t = x.acos();
                return if t.sin() != 0.0 { ((nf + 1.0) * t).sin() / t.sin() } else { (nf + 1.0) * ((nf + 1.0) * t).cos() / x };
            }
        }
        Poly::ChebV => {
            if x.abs() == 1.0 {
                if x > 0.0 {
                    return 1.0;
                }
                return if even { nf + nf + 1.0 } else { -(nf + nf + 1.0) };
            }
            if n > 8 && x.abs() < 1.0 {
                let t = x.acos();
                if (t / 2.0).sin() != 1.0 {
                    return ((nf + 0.5) * t).cos() / (t / 2.0).cos();
                }
                return if even { nf + nf + 1.0 } else { -(nf + nf + 1.0) };
            }
        }
        Poly::ChebW => {
            if x.abs() == 1.0 {
                if x > 0.0 {
                    return nf + nf + 1.0;
                }
                return if even { 1.0 } else { -1.0 };
            }
            if n > 8 && x.abs() < 1.0 {
                let t = x.acos();
                if (t / 2.0).cos() != 1.0 {
                    return ((nf + 0.5) * t).sin() / (t / 2.0).sin();
                }
                if x > 0.0 {
                    return nf + nf + 1.0;
                }
                return if even { 1.0 } else { -1.0 };
            }
        }
        Poly::LaguerreL => {
            if x.abs() == 0.0 {
                return 1.0;
            }
        }
        Poly::LegendreP => {
            if x.abs() == 1.0 {
                return if x > 0.0 || n == 0 || even { 1.0 } else { -1.0 };
            }
        }
        Poly::HermiteH | Poly::HermiteHe => {}
    }
    if n == 0 {
        return 1.0;
    }
    let mut p = 1.0f32;
    let mut q = match kind {
        Poly::ChebT | Poly::HermiteHe | Poly::LegendreP => x,
        Poly::ChebU | Poly::HermiteH => x + x,
        Poly::ChebV => x + x - 1.0,
        Poly::ChebW => x + x + 1.0,
        Poly::LaguerreL => 1.0 - x,
    };
    if n == 1 {
        return q;
    }
    let mut k = 1i64;
    while k < n {
        let kf = k as f32;
        let r = match kind {
            Poly::ChebT | Poly::ChebU | Poly::ChebV | Poly::ChebW => (x + x) * q - p,
            // H_{k+1} = 2x H_k - 2k H_{k-1}
            Poly::HermiteH => (x + x) * q - (kf + kf) * p,
            Poly::HermiteHe => x * q - kf * p,
            Poly::LaguerreL => (((kf + kf) + (1.0 - x)) * q - kf * p) / (kf + 1.0),
            Poly::LegendreP => ((kf + kf + 1.0) * x * q - kf * p) / (kf + 1.0),
        };
        p = q;
        q = r;
        k += 1;
    }
    q
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

    #[test]
    fn special_functions_match_known_values() {
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1.0);
        assert!(close(lgamma(0.5), 0.572_364_942_924_700_1));
        assert!(close(lgamma(10.0), 12.801_827_480_081_469));
        assert!(close(lgamma(-2.5), -0.056_243_716_497_674_05));
        assert!(close(digamma(1.0), -0.577_215_664_901_532_9));
        assert!(close(digamma(-0.5), 0.036_489_973_978_576_52));
        assert!(close(zeta(2.0, 1.0), std::f64::consts::PI.powi(2) / 6.0));
        assert!(close(erfc(0.5), 0.479_500_122_186_953_5));
        assert!(close(erfinv(0.5), 0.476_936_276_204_469_9));
        assert_eq!(nextafter(1.0, 2.0), 1.0 + f32::EPSILON);
        assert!(nextafter(0.0, -1.0) < 0.0);
    }

    #[test]
    fn bessel_and_polynomials_match_known_values() {
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1.0);
        assert!(close(bessel_i(0, 1.0, false), 1.266_065_877_752_008_4));
        assert!(close(bessel_i(1, -2.0, false), -1.590_636_854_637_329));
        assert!(close(bessel_i(0, 60.0, true), 0.051_611_549_173_609_84));
        assert!(close(erfcx(1.0), 0.427_583_576_155_807));
        assert_eq!(poly(Poly::ChebT, 0.5, 2.0), -0.5);
        assert_eq!(poly(Poly::HermiteH, 1.0, 2.0), 2.0);
        assert_eq!(poly(Poly::LegendreP, 0.5, 2.0), -0.125);
        assert_eq!(poly(Poly::LaguerreL, 1.0, 2.0), -0.5);
    }
}
