// Register-blocked (batched) matmul without workgroup memory, for CPU adapters (lavapipe):
// there a workgroup barrier costs a coroutine switch per SIMD group, and "global" memory is
// the CPU cache anyway. Each invocation computes a 4x4 block of out[b] = epilogue(ALPHA * a @ b + bias).
{{PRELUDE}}
@group(0) @binding(0) var<storage, read> lhs: array<f32>;
@group(0) @binding(1) var<storage, read> rhs: array<f32>;
{{BIAS_BINDING}}
@group(0) @binding({{OUT_BINDING}}) var<storage, read_write> out: array<f32>;

const M: u32 = {{M}}u;
const N: u32 = {{N}}u;
const K: u32 = {{K}}u;

fn load_a(batch: u32, m: u32, k: u32) -> f32 {
    return lhs[{{A_OFF}}u + batch * {{A_SB}}u + m * {{A_SM}}u + k * {{A_SK}}u];
}

fn load_b(batch: u32, k: u32, n: u32) -> f32 {
    return rhs[{{B_OFF}}u + batch * {{B_SB}}u + k * {{B_SK}}u + n * {{B_SN}}u];
}

fn bias_at(batch: u32, m: u32, n: u32) -> f32 {
    {{BIAS_EXPR}}
}

fn epilogue(v: f32) -> f32 {
    {{EPILOGUE}}
}

fn store(batch: u32, m: u32, n: u32, a: f32) {
    if (m < M && n < N) {
        let v = {{ALPHA}} * a + bias_at(batch, m, n);
        out[batch * M * N + m * N + n] = epilogue(v);
    }
}

fn store_row(batch: u32, m: u32, n: u32, a: vec4<f32>) {
    store(batch, m, n, a.x);
    store(batch, m, n + 1u, a.y);
    store(batch, m, n + 2u, a.z);
    store(batch, m, n + 3u, a.w);
}

@compute @workgroup_size(8, 8)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let batch = wid.z;
    let m0 = (wid.y * 8u + lid.y) * 4u;
    let n0 = (wid.x * 8u + lid.x) * 4u;
    if (m0 >= M || n0 >= N) {
        return;
    }
    let m1 = min(m0 + 1u, M - 1u);
    let m2 = min(m0 + 2u, M - 1u);
    let m3 = min(m0 + 3u, M - 1u);
    let n1 = min(n0 + 1u, N - 1u);
    let n2 = min(n0 + 2u, N - 1u);
    let n3 = min(n0 + 3u, N - 1u);
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    for (var k = 0u; k < K; k++) {
        let b = vec4<f32>(load_b(batch, k, n0), load_b(batch, k, n1), load_b(batch, k, n2), load_b(batch, k, n3));
        acc0 = fma(vec4<f32>(load_a(batch, m0, k)), b, acc0);
        acc1 = fma(vec4<f32>(load_a(batch, m1, k)), b, acc1);
        acc2 = fma(vec4<f32>(load_a(batch, m2, k)), b, acc2);
        acc3 = fma(vec4<f32>(load_a(batch, m3, k)), b, acc3);
    }
    store_row(batch, m0, n0, acc0);
    store_row(batch, m0 + 1u, n0, acc1);
    store_row(batch, m0 + 2u, n0, acc2);
    store_row(batch, m0 + 3u, n0, acc3);
}
