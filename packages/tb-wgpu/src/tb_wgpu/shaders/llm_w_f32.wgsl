@group(0) @binding(2) var<storage, read> w: array<vec4<f32>>;

fn w4(n: u32, k4: u32) -> vec4<f32> {
    return w[{{WIDX}}];
}

fn wscale(n: u32) -> f32 {
    return 1.0;
}
