// Integer reductions into int64 (sum of bool / int32 / int64, amax / amin of int64): one
// invocation per row of R contiguous elements, in order (integer sums are exact in any order;
// rows here are masks and counts, short enough that a serial loop is not the bottleneck).
@group(0) @binding(0) var<storage, read> x: array<{{IN_TYPE}}>;
@group(0) @binding(1) var<storage, read_write> out: array<tb_i64>;

const R: u32 = {{R}}u;
const ROWS: u32 = {{ROWS}}u;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = gid.y * nwg.x * 64u + gid.x;
    if (row >= ROWS) {
        return;
    }
    var s: tb_i64 = {{INIT}};
    for (var j = 0u; j < R; j++) {
        let v = {{CONVERT}}(x[row * R + j]);
        s = {{COMBINE}}(s, v);
    }
    out[row] = s;
}
