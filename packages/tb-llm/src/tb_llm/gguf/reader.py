"""Open and validate a ``.gguf`` file with the ``gguf`` package's reader (memory-mapped, no pickle).

``gguf.GGUFReader`` reports a damaged file as whatever numpy or ``struct`` raise on the way; this
module checks what it can up front (magic, version), translates the reader's failure into a
:class:`CheckpointError` and, on that failure path only, walks the header itself to say where
the file ends too early (header, metadata key, tensor index, tensor data).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tb_llm.errors import CheckpointError, LLMError
from tb_llm.gguf.dequantize import DEQUANTIZERS

MAGIC = b"GGUF"
VERSIONS = (2, 3)
HEADER_BYTES = 24  # magic, u32 version, u64 tensor count, u64 metadata count


def _gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise LLMError(
            "reading GGUF checkpoints needs the `gguf` package: pip install 'tb-llm[gguf]' (or pip install gguf)"
        ) from None
    return gguf


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    type_name: str  # GGML type: "F32", "Q4_K", ...
    shape: tuple[int, ...]  # row-major (PyTorch) order: [rows, cols] for a matrix
    raw: npt.NDArray[np.uint8]  # [rows, bytes per row], a view into the file's memory map


class GGUFFile:
    """A validated GGUF file: ``metadata`` (key -> Python value) and ``tensors`` (name -> GGUFTensor)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(self.path, "file not found")
        size = self.path.stat().st_size
        with open(self.path, "rb") as fh:
            head = fh.read(HEADER_BYTES)
        if head[:4] != MAGIC:
            raise CheckpointError(
                self.path, f"not a GGUF file (starts with {head[:4]!r}, a GGUF file starts with b'GGUF')"
            )
        if len(head) < HEADER_BYTES:
            raise CheckpointError(
                self.path, f"truncated: {size} bytes is too short for the {HEADER_BYTES}-byte GGUF header"
            )
        version_le, version_be = struct.unpack("<I", head[4:8])[0], struct.unpack(">I", head[4:8])[0]
        if version_le not in VERSIONS and version_be not in VERSIONS:
            raise CheckpointError(
                self.path, f"GGUF version {version_le} is not supported (tb-llm reads GGUF versions 2 and 3)"
            )
        gguf = _gguf()
        try:
            reader = _reader_class(gguf)(self.path, "r")
        except Exception as exc:  # whatever numpy/struct raise on a damaged file
            where = diagnose(self.path)
            raise CheckpointError(self.path, where or f"corrupt GGUF file ({type(exc).__name__}: {exc})") from None
        self.version = version_le if version_le in VERSIONS else version_be
        self.alignment = int(reader.alignment)
        self.metadata: dict[str, Any] = {}
        for key, field in reader.fields.items():
            if key.startswith("GGUF."):
                continue
            try:
                self.metadata[key] = field.contents()
            except Exception as exc:
                raise CheckpointError(self.path, f"metadata key {key!r} cannot be read ({exc})") from None
        self.tensors: dict[str, GGUFTensor] = {}
        for t in reader.tensors:
            type_name = t.tensor_type.name
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            if type_name not in DEQUANTIZERS:
                raise CheckpointError(
                    self.path,
                    f"tensor {t.name!r} has GGML type {type_name}, which tb-llm does not read "
                    f"(supported: {', '.join(DEQUANTIZERS)})",
                )
            block, block_bytes, _ = DEQUANTIZERS[type_name]
            cols = shape[-1] if shape else 1
            if cols % block:
                raise CheckpointError(
                    self.path,
                    f"tensor {t.name!r} {list(shape)}: row length {cols} is not a multiple of {type_name}'s block of {block}",
                )
            end = int(t.data_offset) + int(t.n_bytes)
            if end > size:
                raise CheckpointError(
                    self.path,
                    f"truncated: tensor {t.name!r} data ends at byte {end}, past the end of the file ({size} bytes)",
                )
            rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
            raw = np.asarray(t.data).view(np.uint8).reshape(rows, cols // block * block_bytes)
            self.tensors[t.name] = GGUFTensor(t.name, type_name, shape, raw)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise CheckpointError(self.path, f"metadata key {key!r} is missing")
        return self.metadata[key]


def _reader_class(gguf: Any) -> Any:
    class Reader(gguf.GGUFReader):  # type: ignore[misc, name-defined]
        """``GGUFReader`` parsing its header from a plain ndarray view of the memory map: slicing
        an ``np.memmap`` runs ``memmap.__array_finalize__`` on every one of the ~10^5 small reads
        a vocabulary takes, a few seconds per file. Same buffer, same pages, no copy."""

        def _build_fields(self, offs: int, count: int) -> int:
            self.data = self.data.view(np.ndarray)  # type: ignore[has-type]
            return int(super()._build_fields(offs, count))

    return Reader


# -- diagnosis of a file the reader refused ---------------------------------------------------
# GGUF metadata value types: id -> struct format of a scalar (8: string, 9: array)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


class _Short(Exception):
    pass


def diagnose(path: Path) -> str | None:
    """Where a GGUF file is cut short or malformed, as a sentence; None when the walk finds nothing."""
    with open(path, "rb") as fh:
        data = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return _walk(data)
    finally:
        data.close()


def _walk(data: mmap.mmap) -> str | None:
    pos = 0
    alignment = 32

    def take(n: int) -> bytes:
        nonlocal pos
        if n < 0 or pos + n > len(data):
            raise _Short
        out = data[pos : pos + n]
        pos += n
        return out

    def unpack(fmt: str) -> Any:
        return struct.unpack("<" + fmt, take(struct.calcsize(fmt)))[0]

    def string() -> str:
        return take(unpack("Q")).decode("utf-8", errors="replace")

    def value(vtype: int) -> Any:
        if vtype == 8:
            return string()
        elif vtype == 9:
            inner, count = unpack("I"), unpack("Q")
            if inner in _SCALARS:
                take(count * struct.calcsize(_SCALARS[inner]))
            else:
                for _ in range(count):
                    value(inner)
        elif vtype in _SCALARS:
            return unpack(_SCALARS[vtype])
        else:
            raise ValueError(f"unknown metadata value type {vtype}")

    take(8)
    n_tensors, n_kv = unpack("Q"), unpack("Q")
    key = "?"
    for i in range(n_kv):
        try:
            key = string()
            got = value(unpack("I"))
            if key == "general.alignment" and isinstance(got, int) and got > 0:
                alignment = got
        except _Short:
            return f"truncated: the file ends inside metadata entry {i} of {n_kv} ({key!r})"
        except ValueError as exc:
            return f"corrupt metadata entry {i} ({key!r}): {exc}"
    infos = []
    for i in range(n_tensors):
        try:
            name = string()
            dims = [unpack("Q") for _ in range(unpack("I"))]
            infos.append((name, dims, unpack("I"), unpack("Q")))
        except _Short:
            return f"truncated: the file ends inside the tensor index (tensor {i} of {n_tensors})"
    gguf = _gguf()
    known = {int(t): t for t in gguf.GGMLQuantizationType}
    start = -(-pos // alignment) * alignment
    for name, dims, type_id, offset in infos:
        if type_id not in known:
            return f"tensor {name!r} has unknown GGML type id {type_id}"
        block, block_bytes = gguf.GGML_QUANT_SIZES[known[type_id]]
        end = start + offset + int(np.prod(dims, dtype=np.uint64)) // block * block_bytes
        if end > len(data):
            return f"truncated: tensor {name!r} data ends at byte {end}, past the end of the file ({len(data)} bytes)"
    return None
