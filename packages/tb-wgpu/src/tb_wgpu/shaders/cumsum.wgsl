// cumsum along rows of R contiguous elements, one invocation per row.
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;

const R: u32 = {{R}}u;
const ROWS: u32 = {{ROWS}}u;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = gid.y * nwg.x * 64u + gid.x;
    if (row >= ROWS) {
        return;
    }
    var s = 0.0;
    for (var j = 0u; j < R; j++) {
        s += x[row * R + j];
        out[row * R + j] = s;
    }
}
