// nll_loss_forward over (N, C) log-probabilities: one workgroup sums the picked entries.
{{PRELUDE}}
{{ROWS_PRELUDE}}
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> targets: array<{{T_TYPE}}>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read_write> total_weight: array<f32>;
{{ERR_DECL}}

const N: u32 = {{N}}u;
const C: u32 = {{C}}u;
const REDUCTION: u32 = {{REDUCTION}}u; // 0 none, 1 mean, 2 sum
const IGNORE: i32 = {{IGNORE}};

fn weight_of(t: i32) -> f32 {
    {{WEIGHT_EXPR}}
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32) {
    var s = 0.0;
    var ws = 0.0;
    for (var i = lid; i < N; i += 64u) {
        let t = {{T_CONV}}(targets[{{T_OFF}}u + i * {{T_S}}u]);
        var v = 0.0;
        if (t != IGNORE && (t < 0 || u32(t) >= C)) {
            tb_oob({{CHECK}}u, t); // the partition raises after readback, as torch does
        }
        if (t != IGNORE && t >= 0 && u32(t) < C) {
            let w = weight_of(t);
            v = -x[{{X_OFF}}u + i * {{X_SN}}u + u32(t) * {{X_SC}}u] * w;
            ws += w;
        }
        s += v;
        if (REDUCTION == 0u) {
            out[i] = v;
        }
    }
    s = wg_sum(s, lid);
    ws = wg_sum(ws, lid);
    if (lid == 0u) {
        if (REDUCTION == 1u) {
            out[0] = s / ws;
        } else if (REDUCTION == 2u) {
            out[0] = s;
        }
        total_weight[0] = ws;
    }
}
