// The gated MLP activation: a[m, j] = act(gu[m, j]) * gu[m, I + j] (gate columns, then up).
{{PRELUDE}}
@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> gu: array<f32>;  // [M, 2I]
@group(0) @binding(2) var<storage, read_write> a: array<f32>;  // [M, I]

const I: u32 = {{I}}u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let m = wid.y;
    let j = wid.x * 64u + lid;
    if (m >= params[0] || j >= I) {
        return;
    }
    let g = gu[m * 2u * I + j];
    a[m * I + j] = {{ACT}}(g) * gu[m * 2u * I + I + j];
}
