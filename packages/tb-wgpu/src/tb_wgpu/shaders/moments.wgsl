// Row statistics: var (two-pass, with Bessel-style correction) over rows of R contiguous elements.
{{PRELUDE}}
{{ROWS_PRELUDE}}
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;

const R: u32 = {{R}}u;
const ROWS: u32 = {{ROWS}}u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= ROWS) {
        return;
    }
    let base = row * R;
    var s = 0.0;
    for (var j = lid; j < R; j += 64u) {
        s += x[base + j];
    }
    let mean = wg_sum(s, lid) / f32(R);
    var q = 0.0;
    for (var j = lid; j < R; j += 64u) {
        let d = x[base + j] - mean;
        q += d * d;
    }
    q = wg_sum(q, lid);
    if (lid == 0u) {
        out[row] = q / {{DENOM}};
    }
}
