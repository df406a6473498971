"""Section encoders: tensors, JSON and RNG states as plain bytes. No pickle: decoding never runs code.

Tensor section layout:

    [header_len u32][header: utf-8 JSON][zero padding to a 64-byte boundary][tensor bytes ...]

    header = {"format": "alpha-rl.tensors", "version": 1,
              "tensors": [{"name": str, "dtype": "float32", "shape": [int, ...],
                           "offset": int, "nbytes": int}, ...]}

`offset` counts from the start of the data area (the first 64-byte boundary after the header) and is
itself a multiple of 64; tensors are stored in header order, C-contiguous, little-endian. The decoder
checks every field (known dtype name, non-negative shape, nbytes == numel × itemsize, offsets in
order, inside the buffer, no gaps other than alignment padding, no trailing bytes, bool bytes 0 or 1)
before touching tensor data: a damaged section is a ValueError, never a tensor of garbage.
"""
from __future__ import annotations

import json
import math
import random
import struct
import sys
from typing import Any, Mapping

import numpy as np
import torch

__all__ = [
    "capture_rng_state",
    "decode_json",
    "decode_tensors",
    "encode_json",
    "encode_tensors",
    "restore_rng_state",
]

_FORMAT = "alpha-rl.tensors"
_VERSION = 1
_ALIGN = 64
_HEADER_LEN = struct.Struct("<I")

_DTYPES: dict[str, torch.dtype] = {
    "bool": torch.bool,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
}
# Newer unsigned and float8 dtypes, where this torch build has them.
for _name in ("uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        _DTYPES[_name] = getattr(torch, _name)
_DTYPE_NAMES = {dtype: name for name, dtype in _DTYPES.items()}
_LITTLE_ENDIAN_HOST = sys.byteorder == "little"


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _swap_unit(dtype: torch.dtype) -> int:
    """Bytes per byte-swapped scalar: a complex number is two floats, each swapped on its own."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return itemsize // 2 if dtype.is_complex else itemsize


def _flip_byte_order(flat_u8: torch.Tensor, unit: int) -> torch.Tensor:
    """Reverse the bytes of every `unit`-byte scalar; little ↔ big endian. Only big-endian hosts call it."""
    if unit == 1:
        return flat_u8
    return flat_u8.view(-1, unit).flip(1).reshape(-1)


def encode_tensors(tensors: Mapping[str, torch.Tensor]) -> bytes:
    """Serialise named tensors (any device; CUDA ones are copied to host) to bytes.

    Gradients, `requires_grad` and strides are not kept: a decoded tensor is a fresh contiguous copy.
    Costs one device→host copy per CUDA tensor (a host sync each) and one memcpy of all bytes.
    """
    entries: list[dict[str, Any]] = []
    blobs: list[memoryview] = []
    offset = 0
    for name, tensor in tensors.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"tensor names must be non-empty str, got {name!r}")
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"tensors[{name!r}]: expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.layout != torch.strided or tensor.is_quantized:
            raise ValueError(f"tensors[{name!r}]: only dense tensors are supported, got layout {tensor.layout}")
        if tensor.dtype not in _DTYPE_NAMES:
            raise ValueError(f"tensors[{name!r}]: dtype {tensor.dtype} is not supported")
        host = tensor.detach().to("cpu").contiguous()  # host sync for CUDA tensors
        flat = host.reshape(-1).view(torch.uint8)  # (numel * itemsize,) bytes, no copy
        if not _LITTLE_ENDIAN_HOST:
            flat = _flip_byte_order(flat, _swap_unit(host.dtype))
        entries.append(
            {
                "name": name,
                "dtype": _DTYPE_NAMES[host.dtype],
                "shape": list(host.shape),
                "offset": offset,
                "nbytes": flat.numel(),
            }
        )
        # bfloat16/float8 have no numpy dtype, but their uint8 view does.
        blobs.append(memoryview(flat.numpy()))
        offset = _align(offset + flat.numel())
    header = json.dumps(
        {"format": _FORMAT, "version": _VERSION, "tensors": entries}, separators=(",", ":")
    ).encode("utf-8")
    head = _HEADER_LEN.pack(len(header)) + header
    parts: list[bytes | memoryview] = [head, bytes(_align(len(head)) - len(head))]
    position = 0
    for entry, blob in zip(entries, blobs):
        parts.append(bytes(entry["offset"] - position))
        parts.append(blob)
        position = entry["offset"] + entry["nbytes"]
    return b"".join(parts)


def _bad(rule: str) -> ValueError:
    return ValueError(f"tensor section: {rule}")


def _non_negative_int(value: Any) -> bool:
    return type(value) is int and value >= 0


def decode_tensors(data: bytes | bytearray | memoryview, device: torch.device | str | None = None) -> dict[str, torch.Tensor]:
    """Inverse of encode_tensors. Tensors are new memory (not views of `data`), moved to `device` if given.

    Raises ValueError naming the rule for any malformed or inconsistent section.
    """
    view = memoryview(data).cast("B")
    if view.nbytes < _HEADER_LEN.size:
        raise _bad(f"{view.nbytes} bytes is too short for the header length")
    (header_len,) = _HEADER_LEN.unpack_from(view, 0)
    head_end = _HEADER_LEN.size + header_len
    if head_end > view.nbytes:
        raise _bad(f"header length {header_len} overruns the {view.nbytes}-byte section")
    try:
        header = json.loads(bytes(view[_HEADER_LEN.size : head_end]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _bad(f"header is not utf-8 JSON ({exc})") from None
    if not isinstance(header, dict) or header.get("format") != _FORMAT:
        raise _bad(f"header format is not {_FORMAT!r}")
    if header.get("version") != _VERSION:
        raise _bad(f"unknown version {header.get('version')!r} (this decoder knows {_VERSION})")
    entries = header.get("tensors")
    if not isinstance(entries, list):
        raise _bad("header 'tensors' is not a list")
    data_start = _align(head_end)
    if data_start > view.nbytes and entries:
        raise _bad("data area starts past the end of the section")
    payload = view[min(data_start, view.nbytes) :]
    out: dict[str, torch.Tensor] = {}
    expected_offset = 0
    end = 0
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or set(entry) != {"name", "dtype", "shape", "offset", "nbytes"}:
            raise _bad(f"entry {index} must have exactly name, dtype, shape, offset, nbytes")
        name, dtype_name, shape = entry["name"], entry["dtype"], entry["shape"]
        offset, nbytes = entry["offset"], entry["nbytes"]
        if not isinstance(name, str) or not name or name in out:
            raise _bad(f"entry {index} name {name!r} is not a new non-empty string")
        if not isinstance(dtype_name, str) or dtype_name not in _DTYPES:
            raise _bad(f"tensor {name!r}: unknown dtype {dtype_name!r}")
        if not isinstance(shape, list) or not all(_non_negative_int(d) for d in shape):
            raise _bad(f"tensor {name!r}: shape {shape!r} is not a list of non-negative ints")
        dtype = _DTYPES[dtype_name]
        itemsize = torch.empty((), dtype=dtype).element_size()
        if not _non_negative_int(nbytes) or nbytes != math.prod(shape) * itemsize:
            raise _bad(f"tensor {name!r}: nbytes {nbytes!r} != numel {math.prod(shape)} × itemsize {itemsize}")
        if offset != expected_offset:
            raise _bad(f"tensor {name!r}: offset {offset!r}, expected {expected_offset}")
        end = offset + nbytes
        if end > payload.nbytes:
            raise _bad(f"tensor {name!r}: bytes [{offset}, {end}) overrun the {payload.nbytes}-byte data area")
        flat = torch.empty(nbytes, dtype=torch.uint8)  # (nbytes,) fresh memory the tensor will own
        if nbytes:  # np.frombuffer refuses an empty slice at the very end of a buffer
            flat.numpy()[:] = np.frombuffer(payload, dtype=np.uint8, count=nbytes, offset=offset)
        if dtype == torch.bool and nbytes and bool((flat > 1).any()):
            raise _bad(f"tensor {name!r}: bool bytes must be 0 or 1")
        if not _LITTLE_ENDIAN_HOST:
            flat = _flip_byte_order(flat, _swap_unit(dtype))
        tensor = flat.view(dtype).reshape(shape)
        out[name] = tensor if device is None else tensor.to(device)
        expected_offset = _align(end)
    if payload.nbytes != end:
        raise _bad(f"{payload.nbytes - end} trailing bytes after the last tensor")
    return out


# ── JSON ─────────────────────────────────────────────────────────────────────────────────────────


def encode_json(obj: Any) -> bytes:
    """Canonical JSON bytes (sorted keys, compact, utf-8). Tuples come back as lists.

    Non-finite floats are written as NaN/Infinity (Python's JSON dialect) so a config holding inf
    round-trips; types json cannot represent raise TypeError.
    """
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"JSON section: duplicate key {key!r}")
        out[key] = value
    return out


def decode_json(data: bytes | bytearray | memoryview) -> Any:
    """Plain data (dict/list/str/int/float/bool/None) from encode_json bytes; ValueError if malformed.

    json.loads builds only built-in types: a key such as "__class__" is just a string.
    """
    try:
        return json.loads(bytes(data).decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"JSON section: not utf-8 JSON ({exc})") from None


# ── RNG states ───────────────────────────────────────────────────────────────────────────────────

_RNG_REQUIRED = {"torch_cpu", "numpy", "python"}
_RNG_KNOWN = _RNG_REQUIRED | {"torch_cuda"}


def capture_rng_state() -> dict[str, bytes]:
    """Every global generator's state as bytes: torch CPU, torch CUDA (all devices, if CUDA is up),
    numpy's global RandomState (np.random.*), and python `random`.

    Generators a component owns (torch.Generator, np.random.Generator) belong in that component's own
    state. Capturing CUDA states is a host sync.
    """
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state(legacy=True)
    py_version, py_internal, py_gauss = random.getstate()
    state = {
        "torch_cpu": encode_tensors({"state": torch.get_rng_state()}),
        "numpy": encode_json(
            {
                "bit_generator": np_kind,
                "keys": [int(k) for k in np_keys],
                "pos": int(np_pos),
                "has_gauss": int(np_has_gauss),
                "cached_gaussian": float(np_gauss),
            }
        ),
        "python": encode_json({"version": py_version, "internal": list(py_internal), "gauss_next": py_gauss}),
    }
    if torch.cuda.is_available():
        states = torch.cuda.get_rng_state_all()
        state["torch_cuda"] = encode_tensors({str(i): s for i, s in enumerate(states)})
    return state


def restore_rng_state(state: Mapping[str, bytes]) -> None:
    """Set every global generator back to a capture_rng_state() result. ValueError if malformed.

    CUDA states are restored for the devices present in both the capture and this process; a capture
    without CUDA leaves CUDA generators alone (and vice versa), so a GPU checkpoint can be inspected
    on a CPU box.
    """
    missing, unknown = _RNG_REQUIRED - set(state), set(state) - _RNG_KNOWN
    if missing or unknown:
        raise ValueError(f"RNG state: missing {sorted(missing)}, unknown {sorted(unknown)}")
    # Decode and check everything before setting anything: no half-restored generators.
    cpu = decode_tensors(state["torch_cpu"]).get("state")
    expected_cpu = torch.get_rng_state()
    if cpu is None or cpu.dtype != torch.uint8 or cpu.shape != expected_cpu.shape:
        raise ValueError(f"RNG state: torch_cpu must be a uint8 tensor of shape {tuple(expected_cpu.shape)}")
    np_state = decode_json(state["numpy"])
    py_state = decode_json(state["python"])
    try:
        np_tuple = (
            np_state["bit_generator"],
            np.asarray(np_state["keys"], dtype=np.uint32),
            int(np_state["pos"]),
            int(np_state["has_gauss"]),
            float(np_state["cached_gaussian"]),
        )
        py_tuple = (int(py_state["version"]), tuple(int(v) for v in py_state["internal"]), py_state["gauss_next"])
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"RNG state: malformed numpy or python state ({exc!r})") from None
    cuda = decode_tensors(state["torch_cuda"]) if "torch_cuda" in state else {}
    if set(cuda) != {str(i) for i in range(len(cuda))} or any(s.dtype != torch.uint8 for s in cuda.values()):
        raise ValueError("RNG state: torch_cuda must hold uint8 tensors named 0..n-1")
    probe_np, probe_py = np.random.RandomState(), random.Random()
    try:
        probe_np.set_state(np_tuple)
        probe_py.setstate(py_tuple)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"RNG state: rejected by numpy/python ({exc})") from None
    torch.set_rng_state(cpu)
    np.random.set_state(np_tuple)
    random.setstate(py_tuple)
    if cuda and torch.cuda.is_available():
        for index in range(min(len(cuda), torch.cuda.device_count())):
            torch.cuda.set_rng_state(cuda[str(index)], index)  # host sync
