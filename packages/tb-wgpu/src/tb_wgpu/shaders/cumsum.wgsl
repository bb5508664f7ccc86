// cumsum along rows of R contiguous elements, one invocation per row. float32 (or float16 storage)
// sums in f32; integer and bool inputs sum into int64 (tb_i64), as torch.cumsum promotes them.
@group(0) @binding(0) var<storage, read> x: array<{{IN_TYPE}}>;
@group(0) @binding(1) var<storage, read_write> out: array<{{OUT_TYPE}}>;

const R: u32 = {{R}}u;
const ROWS: u32 = {{ROWS}}u;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = gid.y * nwg.x * 64u + gid.x;
    if (row >= ROWS) {
        return;
    }
    var s: {{OUT_TYPE}} = {{ZERO}};
    for (var j = 0u; j < R; j++) {
        let v = x[row * R + j];
        s = {{ACCUM}};
        out[row * R + j] = s;
    }
}
