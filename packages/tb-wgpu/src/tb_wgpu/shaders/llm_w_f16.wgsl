// bf16 checkpoint weights stored as f16 (exact for every bf16 value in f16's normal range).
@group(0) @binding(2) var<storage, read> w: array<vec4<f16>>;

fn w4(n: u32, k4: u32) -> vec4<f32> {
    return vec4<f32>(w[{{WIDX}}]);
}

fn wscale(n: u32) -> f32 {
    return 1.0;
}
