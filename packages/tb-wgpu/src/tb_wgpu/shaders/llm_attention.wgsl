// Attention of one query row (m = b * T + t) and head h over slots 0 .. end of the device KV
// cache, grouped-query (KV head h / (H / KV)). Slot s is visible when pos[b, s] >= 0 and
// 0 <= qpos - pos[b, s] (< WINDOW for sliding layers), as tb-llm's masks say. Scores are
// q.k * SCALE, soft-capped when SOFTCAP > 0, then an online softmax in f32 over chunks of 64
// slots: each invocation scores one slot of the chunk and accumulates D / 64 output dims.
// A query that sees no slot (left padding) gets weights from masked scores, never NaN; its
// output is never read by a real token.
{{LLM_PRELUDE}}
@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> q: array<f32>;   // [M, H * D]
@group(0) @binding(2) var<storage, read> pos: array<i32>;  // [B, cap]
@group(0) @binding(3) var<storage, read> kc: array<f32>;   // [B, KV, cap, D]
@group(0) @binding(4) var<storage, read> vc: array<f32>;
@group(0) @binding(5) var<storage, read_write> o: array<f32>;  // [M, H * D]

const H: u32 = {{H}}u;
const KV: u32 = {{KV}}u;
const D: u32 = {{D}}u;
const DP: u32 = (D + 63u) / 64u;
const SCALE: f32 = {{SCALE}};
const SOFTCAP: f32 = {{SOFTCAP}};
const WINDOW: i32 = {{WINDOW}};  // 0: no sliding window
const NEG: f32 = -1.0e30;

var<workgroup> qs: array<f32, D>;
var<workgroup> p: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let m = wid.x;
    let h = wid.y;
    if (m >= params[0]) {
        return;
    }
    let T = params[1];
    let L = params[3];
    let end = params[4];
    let cap = params[5];
    let b = m / T;
    let t = m % T;
    let kvh = h / (H / KV);
    let qpos = pos[b * cap + L + t];
    let kbase = (b * KV + kvh) * cap;
    for (var d = lid; d < D; d += 64u) {
        qs[d] = q[m * H * D + h * D + d];
    }
    workgroupBarrier();
    var mx = NEG;
    var l = 0.0;
    var acc: array<f32, DP>;
    for (var j = 0u; j < DP; j++) {
        acc[j] = 0.0;
    }
    for (var c = 0u; c < end; c += 64u) {
        let s = c + lid;
        var sc = NEG;
        if (s < end) {
            let kp = pos[b * cap + s];
            let diff = qpos - kp;
            var ok = kp >= 0 && diff >= 0;
            if (WINDOW > 0) {
                ok = ok && diff < WINDOW;
            }
            if (ok) {
                var dotv = 0.0;
                let kr = (kbase + s) * D;
                for (var d = 0u; d < D; d++) {
                    dotv += qs[d] * kc[kr + d];
                }
                sc = dotv * SCALE;
                if (SOFTCAP > 0.0) {
                    sc = SOFTCAP * tanh(sc / SOFTCAP);
                }
            }
        }
        let nm = max(mx, wg_max(sc, lid));
        let alpha = exp(mx - nm);
        let e = exp(sc - nm);
        p[lid] = e;
        l = l * alpha + wg_sum(e, lid);
        let n = min(64u, end - c);
        for (var j = 0u; j < DP; j++) {
            let d = lid + 64u * j;
            if (d < D) {
                var a = acc[j] * alpha;
                for (var i = 0u; i < n; i++) {
                    a += p[i] * vc[(kbase + c + i) * D + d];
                }
                acc[j] = a;
            }
        }
        workgroupBarrier();
        mx = nm;
    }
    for (var j = 0u; j < DP; j++) {
        let d = lid + 64u * j;
        if (d < D) {
            o[m * H * D + h * D + d] = acc[j] / l;
        }
    }
}
