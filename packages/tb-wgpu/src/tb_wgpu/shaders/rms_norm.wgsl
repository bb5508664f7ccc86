// _fused_rms_norm over rows of R contiguous elements; writes out and rstd.
{{PRELUDE}}
{{ROWS_PRELUDE}}
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read_write> rstd_out: array<f32>;

const R: u32 = {{R}}u;
const ROWS: u32 = {{ROWS}}u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= ROWS) {
        return;
    }
    let base = row * R;
    var q = 0.0;
    for (var j = lid; j < R; j += 64u) {
        let v = x[base + j];
        q += v * v;
    }
    let rstd = 1.0 / sqrt(wg_sum(q, lid) / f32(R) + {{EPS}});
    for (var j = lid; j < R; j += 64u) {
        out[base + j] = x[base + j] * rstd * {{W}};
    }
    if (lid == 0u) {
        rstd_out[row] = rstd;
    }
}
