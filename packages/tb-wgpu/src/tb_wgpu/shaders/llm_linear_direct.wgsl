// tb-llm linear for CPU adapters (lavapipe): one invocation per output feature n and tile of 4
// rows, no workgroup memory and no barriers (which cost more than the arithmetic on a CPU
// rasterizer). Weights are stored transposed by vec4 ([K4, N]) so neighbouring invocations, which
// run as SIMD lanes, load neighbouring words. Same formats and epilogue as llm_linear.wgsl.
{{ENABLE}}
@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> x: {{XTYPE}};
{{WEIGHT}}
{{BIAS_DECL}}
@group(0) @binding({{OUT_BINDING}}) var<storage, read_write> y: array<f32>;

const N: u32 = {{N}}u;
const K: u32 = {{K}}u;
const K4: u32 = {{K4}}u;
const GX: u32 = {{GX}}u;
const OUT_STRIDE: u32 = {{OUT_STRIDE}}u;
const OUT_OFF: u32 = {{OUT_OFF}}u;

fn x4(m: u32, k4: u32) -> vec4<f32> {
    {{X4}}
}

fn put(m: u32, n: u32, acc: f32) {
    let v = acc{{BIAS}};
    let o = m * OUT_STRIDE + OUT_OFF + n;
    {{STORE}}
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = (wid.y * GX + wid.x) * 64u + lid;
    let rows = params[{{ROWS}}];
    let m0 = wid.z * 4u;
    if (n >= N || m0 >= rows) {
        return;
    }
    if (m0 + 1u == rows) {  // decode: one row
        var a = 0.0;
        for (var k4 = 0u; k4 < K4; k4++) {
            a += dot(w4(n, k4), x4(m0, k4));
        }
        put(m0, n, a * wscale(n));
        return;
    }
    let m1 = min(m0 + 1u, rows - 1u);
    let m2 = min(m0 + 2u, rows - 1u);
    let m3 = min(m0 + 3u, rows - 1u);
    var acc = vec4<f32>(0.0);
    for (var k4 = 0u; k4 < K4; k4++) {
        let w = w4(n, k4);
        acc += vec4<f32>(dot(w, x4(m0, k4)), dot(w, x4(m1, k4)), dot(w, x4(m2, k4)), dot(w, x4(m3, k4)));
    }
    let s = wscale(n);
    put(m0, n, acc.x * s);
    if (m0 + 1u < rows) { put(m0 + 1u, n, acc.y * s); }
    if (m0 + 2u < rows) { put(m0 + 2u, n, acc.z * s); }
    if (m0 + 3u < rows) { put(m0 + 3u, n, acc.w * s); }
}
