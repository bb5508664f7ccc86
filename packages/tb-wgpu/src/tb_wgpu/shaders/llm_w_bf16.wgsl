// bf16 weights, two per u32 (element 2j in the low half): widening to f32 is a shift, exact.
@group(0) @binding(2) var<storage, read> w: array<vec2<u32>>;

fn w4(n: u32, k4: u32) -> vec4<f32> {
    let u = w[{{WIDX}}];
    return vec4<f32>(
        bitcast<f32>(u.x << 16u), bitcast<f32>(u.x & 0xffff0000u),
        bitcast<f32>(u.y << 16u), bitcast<f32>(u.y & 0xffff0000u)
    );
}

fn wscale(n: u32) -> f32 {
    return 1.0;
}
