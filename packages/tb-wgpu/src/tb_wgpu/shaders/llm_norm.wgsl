// RMSNorm of rows of H values: out[r] = x[src(r)] / rms(x[src(r)]) * (OFF + w), written or added
// to out (the residual stream, for Gemma 2's sandwich norms). src(r) = r * stride + offset picks
// the last position of each sequence for the final norm; one workgroup per row.
{{LLM_PRELUDE}}
@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const H: u32 = {{H}}u;
const EPS: f32 = {{EPS}};
const OFF: f32 = {{OFF}};

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = wid.x;
    if (r >= params[{{ROWS}}]) {
        return;
    }
    let src = (r * {{STRIDE}} + {{OFFSET}}) * H;
    var q = 0.0;
    for (var j = lid; j < H; j += 64u) {
        let v = x[src + j];
        q += v * v;
    }
    let rstd = 1.0 / sqrt(wg_sum(q, lid) / f32(H) + EPS);
    for (var j = lid; j < H; j += 64u) {
        let v = x[src + j] * rstd * (OFF + w[j]);
        {{STORE}}
    }
}
