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
    """Threads of the Rayon pool (set RAYON_NUM_THREADS before first use to change it)."""
