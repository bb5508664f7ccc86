// tb-llm linear: y[m, OUT_OFF + n] (row stride OUT_STRIDE) = x[m, :] . W[n, :] * wscale(n) + bias[n],
// written or added to y (the residual stream). One workgroup per output feature n and tile of
// MT rows; its 64 invocations split K in steps of 4 (consecutive invocations read consecutive
// weights) and reduce in workgroup memory. Weights stay in their stored format (f32, f16,
// packed bf16, int8 + scale, int4 + group scale / zero) and are dequantized here, in registers.
{{ENABLE}}
@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> x: {{XTYPE}};
{{WEIGHT}}
{{BIAS_DECL}}
@group(0) @binding({{OUT_BINDING}}) var<storage, read_write> y: array<f32>;

const N: u32 = {{N}}u;
const K: u32 = {{K}}u;
const K4: u32 = {{K4}}u;  // row length in vec4 steps; stored rows are padded to K4 * 4
const GX: u32 = {{GX}}u;
const OUT_STRIDE: u32 = {{OUT_STRIDE}}u;
const OUT_OFF: u32 = {{OUT_OFF}}u;

var<workgroup> part: array<vec4<f32>, 64>;

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
    let n = wid.y * GX + wid.x;
    let rows = params[{{ROWS}}];
    let m0 = wid.z * 4u;
    if (n >= N || m0 >= rows) {
        return;
    }
    let m1 = min(m0 + 1u, rows - 1u);
    let m2 = min(m0 + 2u, rows - 1u);
    let m3 = min(m0 + 3u, rows - 1u);
    var acc = vec4<f32>(0.0);
    for (var k4 = lid; k4 < K4; k4 += 64u) {
        let w = w4(n, k4);
        acc += vec4<f32>(dot(w, x4(m0, k4)), dot(w, x4(m1, k4)), dot(w, x4(m2, k4)), dot(w, x4(m3, k4)));
    }
    part[lid] = acc;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            part[lid] = part[lid] + part[lid + s];
        }
        workgroupBarrier();
    }
    if (lid < 4u && m0 + lid < rows) {
        let total = part[0];
        put(m0 + lid, n, total[lid] * wscale(n));
    }
}
