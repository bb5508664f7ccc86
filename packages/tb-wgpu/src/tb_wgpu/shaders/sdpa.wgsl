// Scaled dot-product attention, one invocation per (batch, head, query row), online softmax.
// q, k, v and the mask are read through baked strides (no copies for permuted views).
{{PRELUDE}}
@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(3) var<storage, read> mask: array<{{MASK_TYPE}}>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read_write> lse: array<f32>;

const B: u32 = {{B}}u;
const H: u32 = {{H}}u;
const L: u32 = {{L}}u;
const S: u32 = {{S}}u;
const E: u32 = {{E}}u;
const EV: u32 = {{EV}}u;

fn mask_at(b: u32, h: u32, i: u32, j: u32) -> f32 {
    {{MASK_EXPR}}
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.y * nwg.x * 64u + gid.x;
    if (idx >= B * H * L) {
        return;
    }
    let i = idx % L;
    let h = (idx / L) % H;
    let b = idx / (L * H);
    let qb = {{Q_OFF}}u + b * {{Q_SB}}u + h * {{Q_SH}}u + i * {{Q_SL}}u;
    var acc: array<f32, {{EV}}>;
    for (var e = 0u; e < EV; e++) {
        acc[e] = 0.0;
    }
    var m = -tb_inf();
    var s = 0.0;
    var stop = S;
    if ({{CAUSAL}}) {
        stop = min(S, i + 1u);
    }
    for (var j = 0u; j < stop; j++) {
        let kb = {{K_OFF}}u + b * {{K_SB}}u + h * {{K_SH}}u + j * {{K_SL}}u;
        var dot = 0.0;
        for (var e = 0u; e < E; e++) {
            dot = fma(q[qb + e * {{Q_SE}}u], k[kb + e * {{K_SE}}u], dot);
        }
        let score = dot * {{SCALE}} + mask_at(b, h, i, j);
        if (score == -tb_inf()) {
            continue;
        }
        let m_new = max(m, score);
        let corr = exp(m - m_new);
        let p = exp(score - m_new);
        s = s * corr + p;
        let vb = {{V_OFF}}u + b * {{V_SB}}u + h * {{V_SH}}u + j * {{V_SL}}u;
        for (var e = 0u; e < EV; e++) {
            acc[e] = fma(p, v[vb + e * {{V_SE}}u], acc[e] * corr);
        }
        m = m_new;
    }
    let ob = b * {{O_SB}}u + h * {{O_SH}}u + i * {{O_SL}}u;
    for (var e = 0u; e < EV; e++) {
        out[ob + e * {{O_SE}}u] = acc[e] / s;
    }
    lse[b * {{LSE_SB}}u + h * {{LSE_SH}}u + i * {{LSE_SL}}u] = m + log(s);
}
