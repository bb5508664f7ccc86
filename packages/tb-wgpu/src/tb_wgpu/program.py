"""A compiled partition: pipelines built once, buffers bound once, ONE queue submission per call.

Per call: upload the inputs that are not resident (parameters stay on the device until their
version counter or data pointer changes), record every dispatch of the partition plus the
copies of its outputs into one command buffer, submit it, map the readback buffer, and wrap
the bytes as tensors.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

from tb_wgpu import shaders
from tb_wgpu.device import COUNTERS, GpuContext, WgpuDeviceLostError, WgpuError, WgpuIndexError
from tb_wgpu.lower import TV, Lowered

_TORCH_OF = {"f32": torch.float32, "i32": torch.int32, "u32": torch.int32, "tb_i64": torch.int64}
_ALIGN = 256


@dataclass
class _Out:
    storage: int
    offset: int  # bytes into the readback buffer


class Program:
    def __init__(self, ctx: GpuContext, lowered: Lowered, plan: Any) -> None:
        self._build(ctx, lowered, plan)
        self._loss_reported = False

    def _build(self, ctx: GpuContext, lowered: Lowered, plan: Any) -> None:
        self.ctx = ctx
        self.lowered = lowered
        self.plan = plan
        self.n_args = len(plan.inputs) - len(plan.constants)
        self.constants = [plan.constants[k] for k in sorted(plan.constants)]
        self.const_slots = set(plan.constants)
        storages = lowered.storages
        self.launches = [launch for launch in lowered.launches if launch.grid[0] > 0]
        self.pipelines = []
        for launch in self.launches:
            # float16 storages: the kernel's bindings for them become array<f16> (f32 compute).
            half = {i for i, sid in enumerate([*launch.inputs, *launch.outputs]) if storages[sid].half}
            source = shaders.with_int64(shaders.to_half(launch.source, half), native=ctx.shader_int64)
            self.pipelines.append(
                ctx.pipeline(shaders.shader_key(source), source, len(launch.inputs), len(launch.outputs))
            )
        self.input_storages = [(s.id, s.input_slot) for s in storages if s.input_slot is not None]
        self._owned: list[Any] = []
        self.buffers: dict[int, Any] = {}
        # Program-owned upload buffers for the inputs that are not resident parameters.
        self.upload_buffers: dict[int, Any] = {}
        for sid, _ in self.input_storages:
            self.upload_buffers[sid] = self._acquire(max(storages[sid].nbytes, 4))
        self._plan_temporaries()
        # Outputs: one readback buffer, one region per distinct storage.
        out_storages: list[int] = []
        for value in lowered.outputs:
            if isinstance(value, TV) and value.storage not in out_storages:
                out_storages.append(value.storage)
        # The index checks' error words come back in the same readback as the outputs.
        self.err_storage = lowered.err_storage
        if self.err_storage is not None:
            out_storages.append(self.err_storage)
        self.readback_regions: dict[int, int] = {}
        offset = 0
        for sid in out_storages:
            self.readback_regions[sid] = offset
            offset += -(-max(storages[sid].nbytes, 4) // _ALIGN) * _ALIGN
        self.readback_size = max(offset, _ALIGN)
        self.readback = ctx.create_buffer(self.readback_size, "readback")
        self._bind_key: tuple[int, ...] | None = None
        self._bind_groups: list[Any] = []
        self._finalizer = weakref.finalize(self, _release_all, ctx, self._owned)

    def _acquire(self, nbytes: int) -> Any:
        buffer = self.ctx.acquire(nbytes)
        self._owned.append(buffer)
        return buffer

    def _plan_temporaries(self) -> None:
        """Give every non-input storage a pooled buffer, sharing buffers between disjoint lifetimes."""
        storages = self.lowered.storages
        last: dict[int, int] = {}
        for i, launch in enumerate(self.launches):
            for sid in (*launch.inputs, *launch.outputs):
                last[sid] = i
        outputs = {v.storage for v in self.lowered.outputs if isinstance(v, TV)}
        err = self.lowered.err_storage
        if err is not None:
            # cleared before the first dispatch, written by many: a buffer no temporary shares
            outputs.add(err)
            self.buffers[err] = self._acquire(max(storages[err].nbytes, 4))
        free: list[Any] = []
        inputs = {sid for sid, _ in self.input_storages}
        written = {sid for launch in self.launches for sid in launch.outputs}
        for s in storages:
            # never written by a launch (an empty tensor's storage, possibly read by a kernel that
            # loops zero times over it): a buffer of its own, never shared
            if s.id not in inputs and s.id not in written and s.id not in self.buffers:
                self.buffers[s.id] = self._acquire(max(s.nbytes, 4))
        for i, launch in enumerate(self.launches):
            for sid in launch.outputs:
                if sid in self.buffers or sid in inputs:
                    continue
                need = max(storages[sid].nbytes, 4)
                fits = [b for b in free if b.size >= need]
                if fits:
                    buffer = min(fits, key=lambda b: b.size)
                    free.remove(buffer)
                else:
                    buffer = self._acquire(need)
                self.buffers[sid] = buffer
            for sid in {*launch.inputs, *launch.outputs}:
                if last.get(sid) == i and sid not in outputs and sid not in inputs and sid in self.buffers:
                    free.append(self.buffers[sid])

    # -- per call ------------------------------------------------------------------------------
    def __call__(self, *args: Any) -> Any:
        if self.ctx.lost:
            self._recover()
        ctx = self.ctx
        with ctx.lock:
            try:
                return self._run(args)
            except WgpuError:
                raise
            except Exception as exc:
                raise ctx.translate(exc, "running a partition") from exc

    def _recover(self) -> None:
        """First call after a device loss: a clear error (tb-core's runner falls back to eager for
        that graph). Later calls (the structural cache hands this program to new graphs) rebuild
        it on a freshly opened device."""
        if not self._loss_reported:
            self._loss_reported = True
            raise WgpuDeviceLostError(
                f"the wgpu device on {self.ctx.adapter_name} was lost; this partition runs eagerly "
                "and the engine opens a new device for the next compile"
            )
        from tb_wgpu.compiler import lower_plan
        from tb_wgpu.device import context

        ctx = context()
        with ctx.lock:
            self._build(ctx, lower_plan(self.plan, ctx), self.plan)
        self._loss_reported = False

    def _run(self, args: tuple[Any, ...]) -> Any:
        ctx = self.ctx
        values = [*args, *self.constants]
        bound = dict(self.buffers)
        for sid, slot in self.input_storages:
            tensor = values[slot]
            if isinstance(tensor, torch.nn.Parameter) or slot in self.const_slots:
                bound[sid] = ctx.resident.buffer_for(tensor, self._upload)
            else:
                buffer = self.upload_buffers[sid]
                self._upload(buffer, tensor)
                bound[sid] = buffer
        key = tuple(id(bound[sid]) for sid, _ in self.input_storages)
        if key != self._bind_key:
            self._bind_groups = [self._bind_group(i, launch, bound) for i, launch in enumerate(self.launches)]
            self._bind_key = key
        encoder = ctx.device.create_command_encoder()
        storages = self.lowered.storages
        if self.err_storage is not None:
            encoder.clear_buffer(bound[self.err_storage], 0, storages[self.err_storage].nbytes)
        if self.launches:
            compute = encoder.begin_compute_pass()
            for pipeline, group, launch in zip(self.pipelines, self._bind_groups, self.launches):
                compute.set_pipeline(pipeline)
                compute.set_bind_group(0, group)
                compute.dispatch_workgroups(*launch.grid)
            compute.end()
            COUNTERS.dispatches += len(self.launches)
        for sid, offset in self.readback_regions.items():
            size = -(-max(storages[sid].nbytes, 4) // 4) * 4
            encoder.copy_buffer_to_buffer(bound[sid], 0, self.readback, offset, size)
        ctx.queue.submit([encoder.finish()])
        COUNTERS.submissions += 1
        self.readback.map_sync(ctx.wgpu.MapMode.READ)
        try:
            raw = bytearray(self.readback.read_mapped())
        finally:
            self.readback.unmap()
        COUNTERS.readbacks += 1
        if self.err_storage is not None:
            self._raise_bad_index(raw, self.readback_regions[self.err_storage])
        bases: dict[int, torch.Tensor] = {}
        for sid, offset in self.readback_regions.items():
            s = storages[sid]
            bases[sid] = (
                torch.frombuffer(raw, dtype=_storage_dtype(s), count=s.numel, offset=offset)
                if s.numel
                else torch.empty(0, dtype=_storage_dtype(s))
            )
        results = []
        for value, meta in zip(self.lowered.outputs, self._output_metas()):
            if isinstance(value, TV):
                results.append(_to_tensor(bases[value.storage], value, meta))
            else:
                results.append(value)
        return results[0] if self.plan.single_output else tuple(results)

    def _raise_bad_index(self, raw: bytearray, offset: int) -> None:
        words = torch.frombuffer(raw, dtype=torch.int32, count=2 * len(self.lowered.checks), offset=offset)
        for check, message in enumerate(self.lowered.checks):
            if int(words[2 * check]) != 0:
                raise WgpuIndexError(message.format(index=int(words[2 * check + 1])))

    def _output_metas(self) -> list[Any]:
        metas = []
        for ref in self.plan.outputs:
            slot = getattr(ref, "slot", None)
            metas.append(self.plan.slot_meta(slot) if slot is not None else None)
        return metas

    def _upload(self, buffer: Any, tensor: torch.Tensor) -> None:
        data = tensor.detach()
        if data.dtype in (torch.bool, torch.uint8):
            data = data.to(torch.int32)  # one 32-bit word per element; int64, f16, f32 go up as they are
        data = data.contiguous()
        if data.dtype == torch.float16 and data.numel() % 2:
            # write_buffer takes whole 4-byte words: pad an odd count of 2-byte f16 elements.
            data = torch.cat([data.reshape(-1), data.new_zeros(1)])
        if data.numel():
            self.ctx.queue.write_buffer(buffer, 0, data.numpy())
        COUNTERS.uploads += 1
        COUNTERS.upload_bytes += data.numel() * data.element_size()

    def _bind_group(self, index: int, launch: Any, bound: dict[int, Any]) -> Any:
        bgl, _ = self.ctx.layout(len(launch.inputs), len(launch.outputs))
        entries = []
        physical_out = {id(bound[s]) for s in launch.outputs}
        for i, sid in enumerate([*launch.inputs, *launch.outputs]):
            buffer = bound[sid]
            if i < len(launch.inputs) and id(buffer) in physical_out:
                raise WgpuError("internal: a buffer is bound both read-only and writable in one dispatch")
            entries.append({"binding": i, "resource": {"buffer": buffer, "offset": 0, "size": buffer.size}})
        return self.ctx.device.create_bind_group(layout=bgl, entries=entries)


def _storage_dtype(storage: Any) -> torch.dtype:
    # f16 storages hold IEEE binary16, the bytes of torch.float16.
    return torch.float16 if storage.half else _TORCH_OF[storage.wgsl]


def _to_tensor(base: torch.Tensor, tv: TV, meta: Any) -> torch.Tensor:
    view = base.as_strided(tv.shape, tv.stride, base.storage_offset() + tv.offset)
    if tv.dtype == torch.bool:
        view = view != 0
    elif tv.dtype != torch.float32:
        view = view.to(tv.dtype)
    if meta is not None and tuple(meta.stride) != tuple(view.stride()) and view.numel() > 1:
        out = torch.empty_strided(tuple(meta.shape), tuple(meta.stride), dtype=view.dtype)
        out.copy_(view)
        return out
    return view


def _release_all(ctx: GpuContext, buffers: list[Any]) -> None:
    for b in buffers:
        ctx.release(b)
    buffers.clear()
