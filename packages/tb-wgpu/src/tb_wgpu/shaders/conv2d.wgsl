// Direct 2-D convolution, one invocation per output element (N, COUT, OH, OW), groups supported.
{{PRELUDE}}
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const COUT: u32 = {{COUT}}u;
const OH: u32 = {{OH}}u;
const OW: u32 = {{OW}}u;
const CIN_G: u32 = {{CIN_G}}u;
const COUT_G: u32 = {{COUT_G}}u;
const KH: u32 = {{KH}}u;
const KW: u32 = {{KW}}u;
const IH: i32 = {{IH}};
const IW: i32 = {{IW}};
const TOTAL: u32 = {{TOTAL}}u;

fn epilogue(v: f32) -> f32 {
    {{EPILOGUE}}
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.y * nwg.x * 64u + gid.x;
    if (idx >= TOTAL) {
        return;
    }
    let ox = idx % OW;
    let oy = (idx / OW) % OH;
    let co = (idx / (OW * OH)) % COUT;
    let n = idx / (OW * OH * COUT);
    let g = co / COUT_G;
    var acc = 0.0;
    for (var ci = 0u; ci < CIN_G; ci++) {
        let c = g * CIN_G + ci;
        for (var ky = 0u; ky < KH; ky++) {
            let iy = i32(oy * {{SH}}u + ky * {{DH}}u) - {{PH}};
            if (iy < 0 || iy >= IH) {
                continue;
            }
            for (var kx = 0u; kx < KW; kx++) {
                let ix = i32(ox * {{SW}}u + kx * {{DW}}u) - {{PW}};
                if (ix < 0 || ix >= IW) {
                    continue;
                }
                let xv = x[{{X_OFF}}u + n * {{X_SN}}u + c * {{X_SC}}u + u32(iy) * {{X_SH}}u + u32(ix) * {{X_SW}}u];
                let wv = w[{{W_OFF}}u + co * {{W_SO}}u + ci * {{W_SI}}u + ky * {{W_SH}}u + kx * {{W_SW}}u];
                acc = fma(xv, wv, acc);
            }
        }
    }
    out[idx] = epilogue(acc + {{BIAS_EXPR}});
}
