// softmax / log_softmax / logsumexp over rows of R contiguous elements: max, sum of exp, write.
{{PRELUDE}}
{{ROWS_PRELUDE}}
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;

const R: u32 = {{R}}u;
const ROWS: u32 = {{ROWS}}u;
const MODE: u32 = {{MODE}}u; // 0 softmax, 1 log_softmax, 2 logsumexp

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= ROWS) {
        return;
    }
    let base = row * R;
    var m = -tb_inf();
    for (var j = lid; j < R; j += 64u) {
        m = tb_max(m, x[base + j]);
    }
    m = wg_max(m, lid);
    var shift = m;
    if (MODE == 2u && (m == tb_inf() || m == -tb_inf())) {
        shift = 0.0;
    }
    var s = 0.0;
    for (var j = lid; j < R; j += 64u) {
        s += exp(x[base + j] - shift);
    }
    s = wg_sum(s, lid);
    if (MODE == 2u) {
        if (lid == 0u) {
            out[row] = log(s) + shift;
        }
        return;
    }
    let ls = log(s);
    for (var j = lid; j < R; j += 64u) {
        let d = x[base + j] - shift;
        if (MODE == 0u) {
            out[base + j] = exp(d) / s;
        } else {
            out[base + j] = d - ls;
        }
    }
}
