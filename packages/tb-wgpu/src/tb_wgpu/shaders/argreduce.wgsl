// argmax / argmin over rows of R contiguous elements (first index wins ties; NaN wins, as in torch).
{{PRELUDE}}
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<tb_i64>;

const R: u32 = {{R}}u;
const ROWS: u32 = {{ROWS}}u;

var<workgroup> vals: array<f32, 64>;
var<workgroup> idxs: array<u32, 64>;

fn better(a: f32, ia: u32, b: f32, ib: u32) -> bool {
    let na = tb_isnan(a);
    let nb = tb_isnan(b);
    if (na || nb) {
        if (na && nb) { return ia < ib; }
        return na;
    }
    if (a == b) { return ia < ib; }
    return a {{CMP}} b;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= ROWS) {
        return;
    }
    let base = row * R;
    var best = x[base + min(lid, R - 1u)];
    var bi = min(lid, R - 1u);
    for (var j = lid + 64u; j < R; j += 64u) {
        let v = x[base + j];
        if (better(v, j, best, bi)) {
            best = v;
            bi = j;
        }
    }
    vals[lid] = best;
    idxs[lid] = bi;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            if (better(vals[lid + s], idxs[lid + s], vals[lid], idxs[lid])) {
                vals[lid] = vals[lid + s];
                idxs[lid] = idxs[lid + s];
            }
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        out[row] = tb_i64_from_u32(idxs[0]);
    }
}
