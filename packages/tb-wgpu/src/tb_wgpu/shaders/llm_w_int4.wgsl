// int4 weights as torchburn.llm.weights lays them out (byte j: column 2j low nibble, 2j + 1 high nibble),
// eight per u32, with (scale, zero) per group of G columns: w = (q - 8) * scale + zero.
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> sz: array<vec2<f32>>;

const G: u32 = {{G}}u;
const NG: u32 = K / G;

fn w4(n: u32, k4: u32) -> vec4<f32> {
    let word = w[{{WIDX}}];
    let b = (word >> (16u * (k4 & 1u))) & 0xffffu;
    let q = vec4<f32>(f32(b & 15u), f32((b >> 4u) & 15u), f32((b >> 8u) & 15u), f32(b >> 12u));
    let p = sz[{{SIDX}}];
    return (q - 8.0) * p.x + p.y;
}

fn wscale(n: u32) -> f32 {
    return 1.0;
}
