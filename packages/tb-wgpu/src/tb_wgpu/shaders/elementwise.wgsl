// A fused elementwise group: one invocation per output element. The bindings, index
// arithmetic and expression are generated per partition (see tb_wgpu/elementwise.py).
{{ENABLE}}
{{PRELUDE}}
{{BINDINGS}}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * 256u + lid;
    if (i >= {{TOTAL}}u) {
        return;
    }
{{BODY}}
}
