// The LLM kernels share the engine's workgroup reductions (rows_prelude.wgsl, appended after this
// by tb_wgpu.llm). They do not include prelude.wgsl, whose tb_max propagates NaN; here it is
// WGSL's max, as these kernels always used.
fn tb_max(a: f32, b: f32) -> f32 {
    return max(a, b);
}
