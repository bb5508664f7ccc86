"""Type stub of the Rust extension module ``tb_cpu_rust._native``.

Every tensor argument is a CPU ``torch.Tensor`` (subclasses included), never an address: the
module reads the tensor's own DLPack description and validates it (dtype, rank, layout, byte
extent, alignment, no lazy negation or conjugation) before any kernel runs. A non-tensor is a
``TypeError``; a tensor the entry cannot take is a ``ValueError`` that names the argument.
"""

from collections.abc import Sequence
from typing import final

from torch import Tensor

__all__ = [
    "MAX_EPILOGUE",
    "STEP_KINDS",
    "STEP_SCHEMA_VERSION",
    "Executor",
    "LLMKVCache",
    "LLMModel",
    "LLMWeight",
    "_dlpack_reader",
    "fma_peak_gflops",
    "gemm_backend",
    "isa",
    "llm_attention",
    "llm_gated_act",
    "llm_isa",
    "llm_pack_dense",
    "llm_pack_int4",
    "llm_pack_int8",
    "llm_prefill_bf16_pairs",
    "llm_prefill_engine_gemm",
    "llm_prefill_tiles",
    "llm_quantize",
    "llm_quantize_layout",
    "llm_release_free_memory",
    "llm_rms_norm",
    "llm_rope",
    "num_threads",
    "optim_adam",
    "optim_sgd",
    "set_gemm_backend",
    "set_openmp",
    "set_thread_pool",
    "thread_pool",
    "unary_f32",
    "unary_ops",
    "validate_tensor",
]

@final
class Executor:
    """A prepared partition, built once from a JSON plan spec (see ``tb_cpu_rust.lowering``).

    Raises ``ValueError`` when the spec is malformed or a view leaves its buffer.
    """

    def __new__(cls, spec: str) -> Executor: ...
    def run(self, inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> None:
        """Run once with the GIL released.

        Each input has the plan's dtype, sizes and strides (where a size is above 1), each output
        the plan's dtype and at least its elements; no output shares memory with another tensor.
        Raises ``ValueError`` otherwise (and for data errors found while running, such as an
        index out of range), ``TypeError`` for a non-tensor.
        """
    def run_ptrs(self, inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> None:
        """``run``, under the name of the former bare-pointer entry."""
    def run_profiled(self, inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> list[tuple[str, float]]:
        """``run``, returning each step's kind and wall time in seconds, in step order."""
    @property
    def n_inputs(self) -> int: ...
    @property
    def n_outputs(self) -> int: ...
    @property
    def n_steps(self) -> int: ...

def validate_tensor(tensor: Tensor) -> int:
    """Validate one tensor as every entry does; return the number of elements it spans."""

def unary_f32(op: int, src: Tensor, dst: Tensor) -> None:
    """``dst = op(src)`` elementwise over contiguous float32 CPU tensors of one element count;
    ``dst`` is ``src`` (in place) or shares no memory with it. ``op`` indexes ``unary_ops()``."""

def unary_ops() -> list[str]:
    """The op names ``unary_f32`` takes, by code."""

def isa() -> str:
    """The instruction set the kernels dispatch to: avx512, avx2+fma, sse2 or scalar."""

def fma_peak_gflops(threads: int, seconds: float = 0.2) -> float:
    """The float32 FMA peak (GFLOP/s) of ``threads`` threads running independent FMAs at once for
    about ``seconds``, measured; ValueError outside 1..=1024 threads or (0, 10] seconds."""

def gemm_backend() -> str:
    """The GEMM kernel in use: "gemm" (faer's crate), "matrixmultiply" or "own"."""

def set_gemm_backend(name: str) -> None: ...
def num_threads() -> int:
    """Threads a kernel may use: ``torch.get_num_threads()`` on the OpenMP pool, else the Rayon
    pool's (set RAYON_NUM_THREADS before first use to change it)."""

def set_openmp(library: str) -> None:
    """Run the kernels' loops on the OpenMP runtime of ``library``, the path of a libgomp this
    process has already loaded (PyTorch's); ``ValueError`` when it is not loaded or not OpenMP."""

def thread_pool() -> str:
    """Where the kernels' parallel loops run: "openmp" (PyTorch's team) or "rayon"."""

def set_thread_pool(name: str) -> None: ...
def _dlpack_reader(name: str | None = None) -> str:
    """How tensors are read: "exchange" (DLPack's exchange API, torch >= 2.10) or "capsule"
    (``torch._C._to_dlpack``); ``name`` switches it (for the tests)."""

# -- LLM kernels (tb_cpu_rust.llm, Rust module src/llm/) -------------------------------------
@final
class LLMWeight:
    """A weight packed once for the LLM GEMVs (int8, int4, bf16 or fp32), owned by Rust."""

    def linear(self, x: Tensor, out: Tensor, bias: Tensor | None = None) -> None:
        """``out[M, N] = x[M, K] @ W^T (+ bias)``, float32 contiguous; raises ``ValueError``."""
    def rows(self, ids: Tensor, out: Tensor) -> None:
        """``out[i] = W[ids[i]]`` dequantized to float32 (the embedding lookup)."""
    @property
    def shape(self) -> tuple[int, int]: ...
    @property
    def kind(self) -> str: ...
    @property
    def nbytes(self) -> int: ...

_LinArg = tuple[LLMWeight, Tensor | None]
_LayerArg = tuple[
    Tensor,
    Tensor,
    Tensor | None,
    Tensor | None,
    Sequence[_LinArg],
    _LinArg,
    Tensor | None,
    Tensor | None,
    Sequence[_LinArg],
    _LinArg,
    bool,
]

@final
class LLMKVCache:
    """KV cache tensors (per layer ``[B, KV, cap, D]`` contiguous float32 k and v), held and
    validated again at every ``LLMModel.step``."""

    def __new__(cls, k: Sequence[Tensor], v: Sequence[Tensor]) -> LLMKVCache: ...

@final
class LLMModel:
    """A whole decoder over packed weights; ``step`` runs every layer in one call (GIL released)."""

    def __new__(
        cls,
        config: tuple[int, int, int, int, int, int, float, float, float, float | None, float | None, int | None],
        act: str,
        embed_scale: float | None,
        layers: Sequence[_LayerArg],
        norm: Tensor,
        head: LLMWeight,
    ) -> LLMModel: ...
    def step(
        self,
        x: Tensor,
        positions: Tensor,
        cos: Tensor,
        sin: Tensor,
        pos: Tensor,
        length: int,
        cache: LLMKVCache,
        logits: Tensor,
        last_only: bool,
    ) -> None: ...
    @property
    def num_layers(self) -> int: ...

def llm_pack_int8(qweight: Tensor, scales: Tensor) -> LLMWeight: ...
def llm_pack_int4(qweight: Tensor, scales: Tensor, zeros: Tensor, group: int) -> LLMWeight: ...
def llm_pack_dense(weight: Tensor) -> LLMWeight: ...
def llm_quantize(weight: Tensor, kind: str, group: int) -> LLMWeight: ...
def llm_quantize_layout(
    weight: Tensor, kind: str, group: int, q: Tensor, scales: Tensor, zeros: Tensor | None = None
) -> None: ...
def llm_rms_norm(x: Tensor, weight: Tensor, out: Tensor, eps: float, offset: float) -> None: ...
def llm_gated_act(gate: Tensor, up: Tensor, out: Tensor, act: str) -> None: ...
def llm_rope(x: Tensor, cos: Tensor, sin: Tensor, out: Tensor) -> None: ...
def llm_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor,
    out: Tensor,
    scale: float,
    softcap: float | None = None,
) -> None: ...
def llm_isa() -> str:
    """The instruction set of the LLM kernels: avx512-vnni, avx512, avx2+fma or scalar."""

def llm_prefill_engine_gemm(on: bool | None = None) -> bool:
    """Whether fp32 prefill runs on the engine's own float32 GEMM (else the panel GEMM all
    formats share); `on` changes it. Returns the setting before the call."""

def llm_prefill_bf16_pairs(on: bool | None = None) -> bool:
    """Whether bf16 prefill runs on the bfloat16 pair kernel (AVX-512 BF16 without AMX tiles;
    activations rounded to bf16); `on` changes it. Returns whether it did before the call."""

def llm_prefill_tiles(on: bool | None = None) -> bool:
    """Whether bf16 prefill runs on AMX tiles (activations rounded to bf16); `on` changes it.
    Returns the setting before the call (always False where the CPU has no tiles)."""

def llm_release_free_memory() -> bool:
    """Return malloc's free heap memory to the system; True when some was released."""

# -- fused optimizer steps (tb_cpu_rust.optim) ------------------------------------------------
def optim_adam(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    exp_avgs: Sequence[Tensor],
    exp_avg_sqs: Sequence[Tensor],
    max_exp_avg_sqs: Sequence[Tensor],
    steps: Sequence[Tensor],
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    decoupled: bool,
    maximize: bool,
    amsgrad: bool,
) -> None:
    """One Adam / AdamW step over a parameter group (contiguous float32; ``steps`` incremented)."""

def optim_sgd(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    momentum_buffers: Sequence[Tensor],
    first: Sequence[bool],
    lr: float,
    momentum: float,
    dampening: float,
    weight_decay: float,
    nesterov: bool,
    maximize: bool,
) -> None:
    """One SGD step over a parameter group (contiguous float32)."""

# the executor's step schema and limits (src/exec/step.rs, src/kernels/gemm): Python's lowering reads them
STEP_SCHEMA_VERSION: int
STEP_KINDS: list[str]
MAX_EPILOGUE: int
