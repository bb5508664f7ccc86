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

fn store(batch: u32, m: u32, n: u32, a: f32) {
    if (m < M && n < N) {
        let v = {{ALPHA}} * a + bias_at(batch, m, n);
        out[batch * M * N + m * N + n] = epilogue(v);
    }
}

fn store_row(batch: u32, m: u32, n: u32, a: vec4<f32>) {
    store(batch, m, n, a.x);
    store(batch, m, n + 16u, a.y);
    store(batch, m, n + 32u, a.z);
    store(batch, m, n + 48u, a.w);
}

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let batch = wid.z;
    let row0 = wid.y * 64u;
    let col0 = wid.x * 64u;
    let tid = lid.y * 16u + lid.x;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
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
            let ta = kk * 64u + lid.y;
            let tb = kk * 64u + lid.x;
            let ra = vec4<f32>(tile_a[ta], tile_a[ta + 16u], tile_a[ta + 32u], tile_a[ta + 48u]);
            let rb = vec4<f32>(tile_b[tb], tile_b[tb + 16u], tile_b[tb + 32u], tile_b[tb + 48u]);
            acc0 = fma(vec4<f32>(ra.x), rb, acc0);
            acc1 = fma(vec4<f32>(ra.y), rb, acc1);
            acc2 = fma(vec4<f32>(ra.z), rb, acc2);
            acc3 = fma(vec4<f32>(ra.w), rb, acc3);
        }
        workgroupBarrier();
    }
    store_row(batch, row0 + lid.y, col0 + lid.x, acc0);
    store_row(batch, row0 + lid.y + 16u, col0 + lid.x, acc1);
    store_row(batch, row0 + lid.y + 32u, col0 + lid.x, acc2);
    store_row(batch, row0 + lid.y + 48u, col0 + lid.x, acc3);
}
