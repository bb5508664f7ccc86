"""Type stub of the Rust extension module ``tb_cpu_rust._native``."""

TensorArg = tuple[int, list[int] | tuple[int, ...], list[int] | tuple[int, ...], str]

class Executor:
    """A prepared partition, built once from a JSON plan spec (see ``tb_cpu_rust.lower``).

    Raises ``ValueError`` when the spec is malformed or a view leaves its buffer.
    """

    def __new__(cls, spec: str) -> Executor: ...
    def run(self, inputs: list[TensorArg], outputs: list[TensorArg]) -> None:
        """Run once with the GIL released; each tensor is (data_ptr, sizes, strides, dtype name).

        Raises ``ValueError`` for a wrong dtype, shape, stride, count or overlapping outputs,
        and for data errors found while running (an index out of range).
        """
    def run_ptrs(self, inputs: list[int], outputs: list[int]) -> None:
        """Run once on bare data pointers (inputs, then outputs), the GIL released.

        The caller must have matched every tensor's dtype, sizes and strides against the plan's;
        only the pointers are checked here (count, null, alignment, overlapping outputs), each
        failure a ``ValueError``.
        """
    @property
    def n_inputs(self) -> int: ...
    @property
    def n_outputs(self) -> int: ...
    @property
    def n_steps(self) -> int: ...

def validate_tensor(ptr: int, sizes: list[int], strides: list[int], dtype: str) -> int:
    """Check one tensor descriptor; return the number of elements it spans."""

def isa() -> str:
    """The instruction set the kernels dispatch to: avx512, avx2+fma, sse2, neon or scalar."""

def gemm_backend() -> str:
    """The GEMM kernel in use: "gemm" (faer's crate) or "matrixmultiply"."""

def set_gemm_backend(name: str) -> None: ...
def num_threads() -> int:
    """Threads a kernel may use: ``torch.get_num_threads()`` on the OpenMP pool, else the Rayon
    pool's (set RAYON_NUM_THREADS before first use to change it)."""

def set_openmp(parallel: int, max_threads: int, in_parallel: int) -> None:
    """Registers libgomp's GOMP_parallel / omp_get_max_threads / omp_in_parallel addresses."""

def thread_pool() -> str:
    """Where the kernels' parallel loops run: "openmp" (PyTorch's team) or "rayon"."""

def set_thread_pool(name: str) -> None: ...

# -- LLM kernels (tb_cpu_rust.llm, Rust module src/llm/) -------------------------------------
class LLMWeight:
    """A weight packed once for the LLM GEMVs (int8, int4, bf16 or fp32), owned by Rust."""

    def linear(self, x: TensorArg, out: TensorArg, bias: TensorArg | None = None) -> None:
        """``out[M, N] = x[M, K] @ W^T (+ bias)``, float32 contiguous; raises ``ValueError``."""
    def rows(self, ids: TensorArg, out: TensorArg) -> None:
        """``out[i] = W[ids[i]]`` dequantized to float32 (the embedding lookup)."""
    @property
    def shape(self) -> tuple[int, int]: ...
    @property
    def kind(self) -> str: ...
    @property
    def nbytes(self) -> int: ...

_LinArg = tuple[LLMWeight, TensorArg | None]
_LayerArg = tuple[
    TensorArg,
    TensorArg,
    TensorArg | None,
    TensorArg | None,
    list[_LinArg],
    _LinArg,
    TensorArg | None,
    TensorArg | None,
    list[_LinArg],
    _LinArg,
    bool,
]

class LLMKVCache:
    """tb-llm KV cache buffers (per layer ``[B, KV, cap, D]`` float32 k and v), checked once."""

    def __new__(cls, k: list[TensorArg], v: list[TensorArg]) -> LLMKVCache: ...

class LLMModel:
    """A whole decoder over packed weights; ``step`` runs every layer in one call (GIL released)."""

    def __new__(
        cls,
        config: tuple[int, int, int, int, int, int, float, float, float, float | None, float | None, int | None],
        act: str,
        embed_scale: float | None,
        layers: list[_LayerArg],
        norm: TensorArg,
        head: LLMWeight,
    ) -> LLMModel: ...
    def step(
        self,
        x: TensorArg,
        positions: TensorArg,
        cos: TensorArg,
        sin: TensorArg,
        pos: TensorArg,
        length: int,
        cache: LLMKVCache,
        logits: TensorArg,
        last_only: bool,
    ) -> None: ...
    @property
    def num_layers(self) -> int: ...

def llm_pack_int8(qweight: TensorArg, scales: TensorArg) -> LLMWeight: ...
def llm_pack_int4(qweight: TensorArg, scales: TensorArg, zeros: TensorArg, group: int) -> LLMWeight: ...
def llm_pack_dense(weight: TensorArg) -> LLMWeight: ...
def llm_quantize(weight: TensorArg, kind: str, group: int) -> LLMWeight: ...
def llm_quantize_layout(
    weight: TensorArg, kind: str, group: int, q: TensorArg, scales: TensorArg, zeros: TensorArg | None = None
) -> None: ...
def llm_rms_norm(x: TensorArg, weight: TensorArg, out: TensorArg, eps: float, offset: float) -> None: ...
def llm_gated_act(gate: TensorArg, up: TensorArg, out: TensorArg, act: str) -> None: ...
def llm_rope(x: TensorArg, cos: TensorArg, sin: TensorArg, out: TensorArg) -> None: ...
def llm_attention(
    q: TensorArg,
    k: TensorArg,
    v: TensorArg,
    mask: TensorArg,
    out: TensorArg,
    scale: float,
    softcap: float | None = None,
) -> None: ...
def llm_isa() -> str:
    """The instruction set of the LLM kernels: avx512-vnni, avx512, avx2+fma or scalar."""

# the executor's step schema and limits (src/exec/step.rs, src/kernels/gemm): Python's lowering reads them
STEP_SCHEMA_VERSION: int
STEP_KINDS: list[str]
MAX_EPILOGUE: int
