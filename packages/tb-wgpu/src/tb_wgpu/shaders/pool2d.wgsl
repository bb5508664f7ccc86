// max_pool2d_with_indices / avg_pool2d, one invocation per output element (N*C, OH, OW).
{{PRELUDE}}
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read_write> indices: array<tb_i64>;

const C: u32 = {{C}}u;
const OH: u32 = {{OH}}u;
const OW: u32 = {{OW}}u;
const IH: i32 = {{IH}};
const IW: i32 = {{IW}};
const TOTAL: u32 = {{TOTAL}}u;
const IS_MAX: bool = {{IS_MAX}};

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.y * nwg.x * 64u + gid.x;
    if (idx >= TOTAL) {
        return;
    }
    let ox = idx % OW;
    let oy = (idx / OW) % OH;
    let c = (idx / (OW * OH)) % C;
    let n = idx / (OW * OH * C);
    let y0 = i32(oy * {{SH}}u) - {{PH}};
    let x0 = i32(ox * {{SW}}u) - {{PW}};
    var best = -tb_inf();
    var best_i = -1;
    var sum = 0.0;
    var count = 0;
    let y_end = min(y0 + {{KH}} * {{DH}}, IH + {{PH}});
    let x_end = min(x0 + {{KW}} * {{DW}}, IW + {{PW}});
    let pool_size = (y_end - y0) * (x_end - x0);
    for (var ky = 0; ky < {{KH}}; ky++) {
        let iy = y0 + ky * {{DH}};
        if (iy < 0 || iy >= IH) {
            continue;
        }
        for (var kx = 0; kx < {{KW}}; kx++) {
            let ix = x0 + kx * {{DW}};
            if (ix < 0 || ix >= IW) {
                continue;
            }
            let v = x[{{X_OFF}}u + n * {{X_SN}}u + c * {{X_SC}}u + u32(iy) * {{X_SH}}u + u32(ix) * {{X_SW}}u];
            if (v > best || tb_isnan(v) && !tb_isnan(best) || best_i < 0) {
                best = v;
                best_i = iy * IW + ix;
            }
            sum += v;
            count += 1;
        }
    }
    if (IS_MAX) {
        out[idx] = best;
        indices[idx] = tb_i64_from_i32(best_i);
    } else {
        out[idx] = sum / f32({{DIVISOR}});
    }
}
