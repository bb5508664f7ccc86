// int64 without the `shader-int64` feature: tb_i64 is the two 32-bit words of the value,
// vec2(low, high), two's complement -- the same 8 bytes as torch.int64, so storages cross to and
// from torch unchanged. Arithmetic wraps modulo 2^64, as torch's int64 does.
alias tb_i64 = vec2<u32>;

fn tb_i64_make(lo: u32, hi: u32) -> vec2<u32> { return vec2<u32>(lo, hi); }
fn tb_i64_from_i32(x: i32) -> vec2<u32> { return vec2<u32>(bitcast<u32>(x), select(0u, 0xffffffffu, x < 0)); }
fn tb_i64_from_u32(x: u32) -> vec2<u32> { return vec2<u32>(x, 0u); }
fn tb_i64_to_i32(x: vec2<u32>) -> i32 { return bitcast<i32>(x.x); }
// An index: saturates outside i32, so an index beyond it stays out of range (bounds checks).
fn tb_i64_to_index(x: vec2<u32>) -> i32 {
    let lo = bitcast<i32>(x.x);
    let fits = x.y == select(0u, 0xffffffffu, lo < 0);
    return select(select(2147483647, -2147483648, (x.y >> 31u) == 1u), lo, fits);
}
fn tb_i64_nz(x: vec2<u32>) -> bool { return (x.x | x.y) != 0u; }

fn tb_i64_add(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}

fn tb_i64_sub(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    return vec2<u32>(a.x - b.x, a.y - b.y - select(0u, 1u, a.x < b.x));
}

fn tb_i64_neg(a: vec2<u32>) -> vec2<u32> { return tb_i64_sub(vec2<u32>(0u, 0u), a); }
fn tb_i64_is_neg(a: vec2<u32>) -> bool { return (a.y >> 31u) == 1u; }
fn tb_i64_abs(a: vec2<u32>) -> vec2<u32> { return select(a, tb_i64_neg(a), tb_i64_is_neg(a)); }

// The full 64-bit product of two u32, from 16-bit halves (WGSL has no widening multiply).
fn tb_u32_mul_wide(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    return vec2<u32>((p00 & 0xffffu) | (mid << 16u), a1 * b1 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u));
}

fn tb_i64_mul(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let p = tb_u32_mul_wide(a.x, b.x);
    return vec2<u32>(p.x, p.y + a.x * b.y + a.y * b.x);
}

fn tb_i64_eq(a: vec2<u32>, b: vec2<u32>) -> bool { return all(a == b); }
fn tb_i64_ne(a: vec2<u32>, b: vec2<u32>) -> bool { return any(a != b); }

fn tb_i64_lt(a: vec2<u32>, b: vec2<u32>) -> bool {
    if (a.y != b.y) { return bitcast<i32>(a.y) < bitcast<i32>(b.y); }
    return a.x < b.x;
}

fn tb_i64_le(a: vec2<u32>, b: vec2<u32>) -> bool { return !tb_i64_lt(b, a); }
fn tb_i64_gt(a: vec2<u32>, b: vec2<u32>) -> bool { return tb_i64_lt(b, a); }
fn tb_i64_ge(a: vec2<u32>, b: vec2<u32>) -> bool { return !tb_i64_lt(a, b); }
fn tb_i64_max(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> { return select(b, a, tb_i64_gt(a, b)); }
fn tb_i64_min(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> { return select(b, a, tb_i64_lt(a, b)); }

// Rounded once to nearest (as torch converts int64 to float32): the magnitude is normalized so
// its top bit is bit 31 of one word, the bits below it fold into a sticky bit (far below f32's
// 24-bit mantissa), and that word converts with a single rounding before scaling by 2^e.
fn tb_i64_to_f32(a: vec2<u32>) -> f32 {
    let neg = tb_i64_is_neg(a);
    let m = select(a, tb_i64_neg(a), neg);
    var r: f32;
    if (m.y == 0u) {
        r = f32(m.x);
    } else {
        let s = countLeadingZeros(m.y);
        var top = m.y;
        var rest = m.x;
        if (s > 0u) {
            top = (m.y << s) | (m.x >> (32u - s));
            rest = m.x << s;
        }
        r = ldexp(f32(top | select(0u, 1u, rest != 0u)), i32(32u - s));
    }
    return select(r, -r, neg);
}

// Truncation toward zero, as torch converts float32 to int64 (values beyond int64 are undefined
// there too). |x| >= 2^32 is split exactly: x's ulp is then >= 2^9, so both words are exact.
fn tb_i64_from_f32(x: f32) -> vec2<u32> {
    let t = trunc(abs(x));
    let hi = floor(t / 4294967296.0);
    let m = vec2<u32>(u32(t - hi * 4294967296.0), u32(hi));
    return select(m, tb_i64_neg(m), x < 0.0);
}
