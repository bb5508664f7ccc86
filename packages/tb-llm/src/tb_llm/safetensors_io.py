"""Safetensors reading with validation, without the ``safetensors`` package and without pickle.

Format: an 8-byte little-endian header length ``n``, ``n`` bytes of JSON mapping tensor names to
``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the end of the header),
then the raw data. Files are memory-mapped copy-on-write, so loading a tensor does not read the
whole file, and the mapped pages are shared with the page cache.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tb_llm.errors import CheckpointError

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
MAX_HEADER = 100 * 1024 * 1024  # the format's own limit


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int  # absolute byte offset in the file
    end: int


class SafetensorsFile:
    """One validated ``.safetensors`` file; tensors are views into a private memory map."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(self.path, "file not found")
        size = self.path.stat().st_size
        with open(self.path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise CheckpointError(self.path, f"truncated: {size} bytes is too short for a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER or 8 + n > size:
                raise CheckpointError(
                    self.path,
                    f"header length {n} points past the end of the file ({size} bytes): truncated or not safetensors",
                )
            raw = fh.read(n)
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(self.path, f"header is not valid JSON ({exc})") from None
        if not isinstance(header, dict):
            raise CheckpointError(self.path, "header is not a JSON object")
        self.metadata: dict[str, str] = header.pop("__metadata__", None) or {}
        data_start = 8 + n
        self.tensors: dict[str, TensorInfo] = {}
        for name, entry in header.items():
            self.tensors[name] = self._entry(name, entry, data_start, size)
        self._mmap: mmap.mmap | None = None

    def _entry(self, name: str, entry: Any, data_start: int, size: int) -> TensorInfo:
        try:
            dtype_name, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(self.path, f"tensor {name!r}: malformed header entry {entry!r}") from None
        if dtype_name not in DTYPES:
            raise CheckpointError(self.path, f"tensor {name!r}: unsupported dtype {dtype_name!r}")
        dtype = DTYPES[dtype_name]
        if not all(isinstance(d, int) and d >= 0 for d in shape):
            raise CheckpointError(self.path, f"tensor {name!r}: bad shape {shape!r}")
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if not (isinstance(begin, int) and isinstance(end, int)) or end < begin or end - begin != nbytes:
            raise CheckpointError(
                self.path,
                f"tensor {name!r}: data_offsets {[begin, end]} do not hold {shape} x {dtype_name} ({nbytes} bytes)",
            )
        if data_start + end > size:
            raise CheckpointError(
                self.path,
                f"tensor {name!r} ends at byte {data_start + end}, past the end of the file ({size} bytes): the file is truncated",
            )
        return TensorInfo(name, dtype, tuple(shape), data_start + begin, data_start + end)

    def keys(self) -> list[str]:
        return list(self.tensors)

    def get(self, name: str) -> torch.Tensor:
        """The tensor as a CPU view of the mapped file (copy-on-write: safe to modify)."""
        info = self.tensors[name]
        if info.end == info.begin:
            return torch.empty(info.shape, dtype=info.dtype)
        if self._mmap is None:
            with open(self.path, "rb") as fh:
                self._mmap = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
        flat = torch.frombuffer(
            self._mmap, dtype=info.dtype, count=(info.end - info.begin) // _itemsize(info.dtype), offset=info.begin
        )
        return flat.reshape(info.shape)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


class CheckpointWeights:
    """Every tensor of a checkpoint folder: one ``model.safetensors`` or shards through an index."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.files: dict[str, SafetensorsFile] = {}
        self.where: dict[str, str] = {}  # tensor name -> file name
        index = self.folder / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
                if not isinstance(weight_map, dict):
                    raise TypeError("weight_map is not an object")
            except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as exc:
                raise CheckpointError(index, f"not a valid safetensors index ({exc})") from None
            for shard in sorted(set(weight_map.values())):
                if not (self.folder / shard).is_file():
                    raise CheckpointError(self.folder / shard, f"shard listed in {index.name} is missing")
                self.files[shard] = SafetensorsFile(self.folder / shard)
            for name, shard in weight_map.items():
                if name not in self.files[shard].tensors:
                    raise CheckpointError(
                        self.folder / shard, f"tensor {name!r} listed in {index.name} is not in this shard"
                    )
                self.where[name] = shard
        else:
            found = sorted(self.folder.glob("*.safetensors"))
            if not found:
                bins = sorted(p.name for p in self.folder.glob("*.bin"))
                extra = (
                    f" (found {', '.join(bins)}: tb-llm never loads pickle files; convert them to safetensors)"
                    if bins
                    else ""
                )
                raise CheckpointError(self.folder, f"no .safetensors weights{extra}")
            for path in found:
                st = SafetensorsFile(path)
                self.files[path.name] = st
                for name in st.tensors:
                    self.where.setdefault(name, path.name)

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def __iter__(self) -> Iterator[str]:
        return iter(self.where)

    def info(self, name: str) -> TensorInfo:
        return self.files[self.where[name]].tensors[name]

    def path_of(self, name: str) -> Path:
        return self.folder / self.where[name]

    def get(self, name: str) -> torch.Tensor:
        return self.files[self.where[name]].get(name)


def save_file(
    tensors: dict[str, torch.Tensor], path: str | os.PathLike[str], metadata: dict[str, str] | None = None
) -> None:
    """Write tensors as safetensors (used by the benchmark and tests to make checkpoints)."""
    names = {v: k for k, v in DTYPES.items()}
    header: dict[str, Any] = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    items = []
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
        items.append(t)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for t in items:
            if t.numel():
                fh.write(t.reshape(-1).view(torch.uint8).numpy().data)
