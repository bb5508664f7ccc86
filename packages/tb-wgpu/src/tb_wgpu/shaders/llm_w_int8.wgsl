// int8 weights, four per u32, one scale per output row (applied once, after the dot product).
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> scales: array<f32>;

fn w4(n: u32, k4: u32) -> vec4<f32> {
    let u = i32(w[{{WIDX}}]);
    return vec4<f32>(f32(extractBits(u, 0u, 8u)), f32(extractBits(u, 8u, 8u)),
                     f32(extractBits(u, 16u, 8u)), f32(extractBits(u, 24u, 8u)));
}

fn wscale(n: u32) -> f32 {
    return scales[n];
}
