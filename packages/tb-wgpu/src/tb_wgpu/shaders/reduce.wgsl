// One workgroup per row of R contiguous elements: out[row] = FINISH(fold(COMBINE, INIT, row)).
{{PRELUDE}}
{{ROWS_PRELUDE}}
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;

const R: u32 = {{R}}u;
const ROWS: u32 = {{ROWS}}u;

fn combine(a: f32, b: f32) -> f32 {
    {{COMBINE}}
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= ROWS) {
        return;
    }
    let base = row * R;
    var acc: f32 = {{INIT}};
    for (var j = lid; j < R; j += 64u) {
        acc = combine(acc, x[base + j]);
    }
    red[lid] = acc;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            red[lid] = combine(red[lid], red[lid + s]);
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        let r = red[0];
        out[row] = {{FINISH}};
    }
}
