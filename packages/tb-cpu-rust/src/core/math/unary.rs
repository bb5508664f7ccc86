//! The unary float ops that the elementwise programs, GEMM epilogues and the SIMD math share.

/// One unary op; parameters (clamp bounds, slopes, exponents) travel with it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Un {
    Neg, Abs, Exp, Log, Log1p, Expm1, Sqrt, Rsqrt, Sin, Cos, Tan, Tanh, Sigmoid, Relu, GeluErf, GeluTanh,
    Silu, Erf, Floor, Ceil, Round, Trunc, Sign, Recip, Clamp(f32, f32), Leaky(f32), Elu(f32, f32, f32),
    PowS(f32), Square, LogicalNot, IsNan, Log2, Exp2, Atan, Asin, Acos, Sinh, Cosh, Frac, Copy, Softplus(f32, f32),
    Lgamma, Digamma, Erfc, Erfinv, Log10, Asinh, Acosh, Atanh, IsInf, Signbit, Erfcx, SphJ0, I0, I0e, I1, I1e, Ndtri,
    BesselJ0, BesselJ1, BesselY0, BesselY1,
}
