// Helpers shared by generated elementwise kernels. WGSL lets implementations assume that
// floats are finite, so NaN and infinity are tested and produced through their bit patterns.

fn tb_isnan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

fn tb_nan() -> f32 {
    return bitcast<f32>(0x7fc00000u);
}

fn tb_inf() -> f32 {
    return bitcast<f32>(0x7f800000u);
}

fn tb_b(x: bool) -> u32 {
    return select(0u, 1u, x);
}

// max/min that propagate NaN, as torch.maximum / torch.minimum do.
fn tb_max(a: f32, b: f32) -> f32 {
    if (tb_isnan(a) || tb_isnan(b)) { return tb_nan(); }
    return select(b, a, a > b);
}

fn tb_min(a: f32, b: f32) -> f32 {
    if (tb_isnan(a) || tb_isnan(b)) { return tb_nan(); }
    return select(b, a, a < b);
}

// NaN passes through, as in torch.relu. The explicit bit test matters: NVIDIA's Vulkan compiler
// turns select(x, 0.0, x < 0.0) into max(x, 0.0), which returns 0 for NaN (seen on an H200).
fn tb_relu(x: f32) -> f32 {
    if (tb_isnan(x)) { return x; }
    return select(x, 0.0, x < 0.0);
}

fn tb_sign(x: f32) -> f32 {
    if (tb_isnan(x)) { return 0.0; }
    return select(select(0.0, -1.0, x < 0.0), 1.0, x > 0.0);
}

fn tb_exp(x: f32) -> f32 {
    return exp(x);
}

fn tb_sigmoid(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

fn tb_tanh(x: f32) -> f32 {
    if (tb_isnan(x)) { return x; }
    let a = abs(x);
    if (a > 9.0) { return sign(x); }
    if (a < 0.0005) { return x - x * x * x / 3.0; }
    let e = exp(2.0 * a);
    return sign(x) * (e - 1.0) / (e + 1.0);
}

// erf by the Abramowitz-Stegun 7.1.26 rational form refined for small |x| by its Taylor series;
// absolute error below 2e-7 over the real line.
fn tb_erf(x: f32) -> f32 {
    if (tb_isnan(x)) { return x; }
    let a = abs(x);
    if (a < 0.5) {
        let x2 = x * x;
        return x * (1.1283791671 + x2 * (-0.3761263890 + x2 * (0.1128379167 + x2 * (-0.0268661706 + x2 * (0.0052239776 - x2 * 0.0008548327)))));
    }
    if (a > 4.0) { return sign(x); }
    let t = 1.0 / (1.0 + 0.3275911 * a);
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    return sign(x) * (1.0 - poly * exp(-a * a));
}

// IEEE arithmetic of x * 0.5 * (1 + erf(x / sqrt 2)), as torch's CPU kernel (2.15) computes it:
// inf at +inf, NaN (-inf * 0) at -inf. WGSL may assume finite floats, so both are spelled out.
fn tb_gelu(x: f32) -> f32 {
    if (x == tb_inf()) { return x; }
    if (x == -tb_inf()) { return tb_nan(); }
    return x * 0.5 * (1.0 + tb_erf(x * 0.70710678118654752));
}

fn tb_gelu_tanh(x: f32) -> f32 {
    let inner = 0.7978845608028654 * (x + 0.044715 * x * x * x);
    return 0.5 * x * (1.0 + tb_tanh(inner));
}

fn tb_silu(x: f32) -> f32 {
    return x / (1.0 + exp(-x));
}

fn tb_log1p(x: f32) -> f32 {
    let u = 1.0 + x;
    if (u == 1.0) { return x; }
    if (tb_isnan(x) || x == tb_inf()) { return log(u); }
    return log(u) * x / (u - 1.0);
}

fn tb_expm1(x: f32) -> f32 {
    if (abs(x) < 1e-4) { return x + 0.5 * x * x; }
    return exp(x) - 1.0;
}

fn tb_pow(a: f32, b: f32) -> f32 {
    if (b == 0.0) { return 1.0; }
    if (b == 1.0) { return a; }
    if (b == 2.0) { return a * a; }
    if (b == 0.5) { return sqrt(a); }
    if (b == -1.0) { return 1.0 / a; }
    if (a < 0.0 && b == floor(b)) {
        let m = pow(-a, b);
        return select(m, -m, (i32(b) & 1) == 1);
    }
    return pow(a, b);
}

fn tb_rsqrt(x: f32) -> f32 {
    return 1.0 / sqrt(x);
}

fn tb_clamp(x: f32, lo: f32, hi: f32) -> f32 {
    if (tb_isnan(x)) { return x; }
    return select(select(x, hi, x > hi), lo, x < lo);
}

fn tb_elu(x: f32, alpha: f32, scale: f32, input_scale: f32) -> f32 {
    if (x > 0.0) { return x * scale; }
    return alpha * scale * tb_expm1(x * input_scale);
}
