// After the q/k/v projections of one layer: per (row m, head) apply the optional q/k RMSNorm over
// head_dim (Qwen3) and RoPE ("rotate half" over the first R dims), then write q heads to q_out and
// k / v heads into the device KV cache at slot L + t, and into `stage` (this step's keys and
// values, read back once per step to mirror tb-llm's host cache). qkv rows are [q | k | v].
{{LLM_PRELUDE}}
@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read> cs: array<f32>;   // [M, 2R]: cos then sin
@group(0) @binding(3) var<storage, read> qkn: array<f32>;  // [2D]: q_norm then k_norm weights
@group(0) @binding(4) var<storage, read_write> q_out: array<f32>;
@group(0) @binding(5) var<storage, read_write> kc: array<f32>;  // [B, KV, cap, D]
@group(0) @binding(6) var<storage, read_write> vc: array<f32>;
@group(0) @binding(7) var<storage, read_write> stage: array<f32>;  // [layers, 2, B, KV, T, D]

const H: u32 = {{H}}u;
const KV: u32 = {{KV}}u;
const D: u32 = {{D}}u;
const R: u32 = {{R}}u;
const HALF: u32 = R / 2u;
const NT: u32 = (H + 2u * KV) * D;
const LAYER: u32 = {{LAYER}}u;
const QK_NORM: bool = {{QK_NORM}};
const EPS: f32 = {{EPS}};
const OFF: f32 = {{OFF}};

var<workgroup> hv: array<f32, D>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let m = wid.x;
    let head = wid.y;
    let rows = params[0];
    if (m >= rows) {
        return;
    }
    let T = params[1];
    let B = params[2];
    let L = params[3];
    let cap = params[5];
    let b = m / T;
    let t = m % T;
    let base = m * NT + head * D;
    var ss = 0.0;
    for (var d = lid; d < D; d += 64u) {
        let v = qkv[base + d];
        hv[d] = v;
        ss += v * v;
    }
    workgroupBarrier();
    if (head >= H + KV) {  // a value head: straight into the cache
        let kvh = head - H - KV;
        let slot = ((b * KV + kvh) * cap + L + t) * D;
        let st = ((((LAYER * 2u + 1u) * B + b) * KV + kvh) * T + t) * D;
        for (var d = lid; d < D; d += 64u) {
            vc[slot + d] = hv[d];
            stage[st + d] = hv[d];
        }
        return;
    }
    var rstd = 1.0;
    var nw = 0u;
    if (QK_NORM) {
        rstd = 1.0 / sqrt(wg_sum(ss, lid) / f32(D) + EPS);
        nw = select(0u, D, head >= H);
    }
    for (var d = lid; d < D; d += 64u) {
        var v = hv[d];
        if (QK_NORM) {
            v = v * rstd * (OFF + qkn[nw + d]);
        }
        if (d < R) {
            var other: f32;
            if (d < HALF) {
                other = -hv[d + HALF];
            } else {
                other = hv[d - HALF];
            }
            if (QK_NORM) {
                other = other * rstd * (OFF + qkn[nw + select(d - HALF, d + HALF, d < HALF)]);
            }
            v = v * cs[m * 2u * R + d] + other * cs[m * 2u * R + R + d];
        }
        if (head < H) {
            q_out[m * H * D + head * D + d] = v;
        } else {
            let kvh = head - H;
            kc[((b * KV + kvh) * cap + L + t) * D + d] = v;
            stage[((((LAYER * 2u) * B + b) * KV + kvh) * T + t) * D + d] = v;
        }
    }
}
