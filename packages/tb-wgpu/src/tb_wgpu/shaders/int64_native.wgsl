// int64 on adapters with the `shader-int64` feature: tb_i64 is WGSL's i64 (wgpu-native/naga
// extension). The same tb_i64_* API as int64_emulated.wgsl, so generated kernels do not care
// which one they get (shaders.with_int64 prepends one of them to a kernel that mentions tb_i64).
alias tb_i64 = i64;

fn tb_i64_make(lo: u32, hi: u32) -> i64 { return bitcast<i64>((u64(hi) << 32u) | u64(lo)); }
fn tb_i64_from_i32(x: i32) -> i64 { return i64(x); }
fn tb_i64_from_u32(x: u32) -> i64 { return i64(x); }
fn tb_i64_from_f32(x: f32) -> i64 { return i64(x); }
fn tb_i64_to_i32(x: i64) -> i32 { return i32(x); }
// An index: saturates outside i32, so an index beyond it stays out of range (bounds checks).
fn tb_i64_to_index(x: i64) -> i32 { return i32(clamp(x, i64(-2147483648), i64(2147483647))); }
fn tb_i64_to_f32(x: i64) -> f32 { return f32(x); }
fn tb_i64_nz(x: i64) -> bool { return x != 0li; }
fn tb_i64_add(a: i64, b: i64) -> i64 { return a + b; }
fn tb_i64_sub(a: i64, b: i64) -> i64 { return a - b; }
fn tb_i64_mul(a: i64, b: i64) -> i64 { return a * b; }
fn tb_i64_neg(a: i64) -> i64 { return 0li - a; }
fn tb_i64_abs(a: i64) -> i64 { return select(a, 0li - a, a < 0li); }
fn tb_i64_eq(a: i64, b: i64) -> bool { return a == b; }
fn tb_i64_ne(a: i64, b: i64) -> bool { return a != b; }
fn tb_i64_lt(a: i64, b: i64) -> bool { return a < b; }
fn tb_i64_le(a: i64, b: i64) -> bool { return a <= b; }
fn tb_i64_gt(a: i64, b: i64) -> bool { return a > b; }
fn tb_i64_ge(a: i64, b: i64) -> bool { return a >= b; }
fn tb_i64_max(a: i64, b: i64) -> i64 { return select(b, a, a > b); }
fn tb_i64_min(a: i64, b: i64) -> i64 { return select(b, a, a < b); }
