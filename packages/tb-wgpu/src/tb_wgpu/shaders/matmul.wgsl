// Tiled (batched) matmul: out[b] = epilogue(ALPHA * a[b] @ b[b] + bias).
// A 64x64 output tile per workgroup of 16x16 invocations, 4x4 outputs per invocation; A and B
// tiles of depth 16 staged in workgroup memory. Operands are read through baked strides, so
// transposed views (weights as a.t()) need no copy.
{{PRELUDE}}
@group(0) @binding(0) var<storage, read> lhs: array<f32>;
@group(0) @binding(1) var<storage, read> rhs: array<f32>;
{{BIAS_BINDING}}
@group(0) @binding({{OUT_BINDING}}) var<storage, read_write> out: array<f32>;

const M: u32 = {{M}}u;
const N: u32 = {{N}}u;
const K: u32 = {{K}}u;

var<workgroup> tile_a: array<f32, 1024>;
var<workgroup> tile_b: array<f32, 1024>;

fn load_a(batch: u32, m: u32, k: u32) -> f32 {
    return lhs[{{A_OFF}}u + batch * {{A_SB}}u + m * {{A_SM}}u + k * {{A_SK}}u];
}

fn load_b(batch: u32, k: u32, n: u32) -> f32 {
    return rhs[{{B_OFF}}u + batch * {{B_SB}}u + k * {{B_SK}}u + n * {{B_SN}}u];
}

fn bias_at(batch: u32, m: u32, n: u32) -> f32 {
    {{BIAS_EXPR}}
}

fn epilogue(v: f32) -> f32 {
    {{EPILOGUE}}
}

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let batch = wid.z;
    let row0 = wid.y * 64u;
    let col0 = wid.x * 64u;
    let tid = lid.y * 16u + lid.x;
    var acc: array<f32, 16>;
    for (var i = 0u; i < 16u; i++) {
        acc[i] = 0.0;
    }
    for (var k0 = 0u; k0 < K; k0 += 16u) {
        for (var t = 0u; t < 4u; t++) {
            let e = tid + t * 256u;
            let am = e / 16u;
            let ak = e % 16u;
            var va = 0.0;
            if (row0 + am < M && k0 + ak < K) {
                va = load_a(batch, row0 + am, k0 + ak);
            }
            tile_a[ak * 64u + am] = va;
            let bk = e / 64u;
            let bn = e % 64u;
            var vb = 0.0;
            if (k0 + bk < K && col0 + bn < N) {
                vb = load_b(batch, k0 + bk, col0 + bn);
            }
            tile_b[bk * 64u + bn] = vb;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < 16u; kk++) {
            var ra: array<f32, 4>;
            var rb: array<f32, 4>;
            for (var i = 0u; i < 4u; i++) {
                ra[i] = tile_a[kk * 64u + lid.y + i * 16u];
                rb[i] = tile_b[kk * 64u + lid.x + i * 16u];
            }
            for (var i = 0u; i < 4u; i++) {
                for (var j = 0u; j < 4u; j++) {
                    acc[i * 4u + j] = fma(ra[i], rb[j], acc[i * 4u + j]);
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let m = row0 + lid.y + i * 16u;
        for (var j = 0u; j < 4u; j++) {
            let n = col0 + lid.x + j * 16u;
            if (m < M && n < N) {
                let v = {{ALPHA}} * acc[i * 4u + j] + bias_at(batch, m, n);
                out[batch * M * N + m * N + n] = epilogue(v);
            }
        }
    }
}
