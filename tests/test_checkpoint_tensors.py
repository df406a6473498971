"""Section encoders: tensors (all dtypes, bit-exact), JSON, RNG states, and loading never running code."""
from __future__ import annotations

import io
import json
import pickle
import random
import struct

import numpy as np
import pytest
import torch

from trainer.checkpoint.format import read_checkpoint
from trainer.checkpoint.store import latest_valid, write_checkpoint
from trainer.checkpoint.tensors import (
    capture_rng_state,
    decode_json,
    decode_tensors,
    encode_json,
    encode_tensors,
    restore_rng_state,
)


def _bits(tensor: torch.Tensor) -> bytes:
    """Raw bytes of a tensor: compares NaN payloads and -0.0 exactly, which torch.equal cannot."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _all_dtypes() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    floats = torch.randn(3, 5, generator=g)
    floats[0, 0], floats[0, 1], floats[0, 2] = float("nan"), float("inf"), -0.0
    return {
        "float32": floats,
        "float64": floats.double(),
        "float16": floats.half(),
        "bfloat16": floats.bfloat16(),
        "complex64": torch.complex(floats, -floats),
        "complex128": torch.complex(floats, floats).to(torch.complex128),
        "float8_e4m3fn": torch.randn(7, generator=g).to(torch.float8_e4m3fn),
        "bool": torch.tensor([[True, False, True], [False, False, True]]),
        "uint8": torch.arange(256, dtype=torch.int32).to(torch.uint8),
        "int8": torch.arange(-128, 128, dtype=torch.int32).to(torch.int8),
        "int16": torch.tensor([-(2**15), 2**15 - 1], dtype=torch.int16),
        "int32": torch.tensor([-(2**31), 2**31 - 1], dtype=torch.int32),
        "int64": torch.tensor([-(2**63), 2**63 - 1, 12345], dtype=torch.int64),
        "uint16": torch.tensor([0, 65535], dtype=torch.int32).to(torch.uint16),
        "zero_dim": torch.tensor(3.25, dtype=torch.float64),
        "zero_dim_bool": torch.tensor(True),
        "empty": torch.empty(0, 4, dtype=torch.float32),
        "empty_bf16": torch.empty(2, 0, 3, dtype=torch.bfloat16),
        "transposed": floats.t(),  # non-contiguous
        "sliced": torch.arange(20, dtype=torch.int64)[::3],
        "param": torch.nn.Parameter(torch.ones(2, 2)),
    }


def test_tensors_round_trip_bit_exact_for_every_dtype_and_shape():
    tensors = _all_dtypes()
    decoded = decode_tensors(encode_tensors(tensors))
    assert list(decoded) == list(tensors)
    for name, tensor in tensors.items():
        got = decoded[name]
        assert (got.dtype, got.shape) == (tensor.dtype, tensor.shape), name
        assert got.is_contiguous() and not got.requires_grad, name
        assert _bits(got) == _bits(tensor), name


def test_tensor_bytes_sit_little_endian_at_64_byte_aligned_offsets():
    """Hand-checked: the header JSON says where, and the bytes there are struct's '<' packing."""
    data = encode_tensors({"x": torch.tensor([1.0, -2.0]), "i": torch.tensor([[1, 2]], dtype=torch.int64)})
    (header_len,) = struct.unpack_from("<I", data, 0)
    header = json.loads(data[4 : 4 + header_len])
    assert header["format"] == "alpha-rl.tensors" and header["version"] == 1
    assert header["tensors"] == [
        {"name": "x", "dtype": "float32", "shape": [2], "offset": 0, "nbytes": 8},
        {"name": "i", "dtype": "int64", "shape": [1, 2], "offset": 64, "nbytes": 16},
    ]
    start = -(-(4 + header_len) // 64) * 64
    assert data[start : start + 8] == struct.pack("<2f", 1.0, -2.0)
    assert data[start + 64 : start + 80] == struct.pack("<2q", 1, 2)
    assert len(data) == start + 80


def test_decoded_tensors_own_their_memory_and_can_go_to_a_device():
    buffer = bytearray(encode_tensors({"x": torch.arange(4.0)}))
    decoded = decode_tensors(buffer)["x"]
    buffer[-16:] = bytes(16)  # scribble over the source: the decoded tensor must not change
    assert torch.equal(decoded, torch.arange(4.0))
    decoded += 1  # and it is writable
    on_meta = decode_tensors(bytes(encode_tensors({"x": torch.arange(4.0)})), device="meta")["x"]
    assert on_meta.device.type == "meta" and on_meta.shape == (4,)


def test_unsupported_tensors_are_refused_by_name():
    with pytest.raises(ValueError, match=r"tensors\['s'\]: only dense"):
        encode_tensors({"s": torch.eye(3).to_sparse()})
    with pytest.raises(ValueError, match="expected a torch.Tensor"):
        encode_tensors({"n": np.zeros(3)})


def _damage(data: bytes, edit) -> bytes:
    """Rewrite the header JSON with `edit(header)` and keep the data area where it was."""
    (header_len,) = struct.unpack_from("<I", data, 0)
    header = json.loads(data[4 : 4 + header_len])
    edit(header)
    new = json.dumps(header).encode()
    start = -(-(4 + header_len) // 64) * 64
    head = struct.pack("<I", len(new)) + new
    return head + bytes(-(-len(head) // 64) * 64 - len(head)) + data[start:]


def test_malformed_tensor_sections_are_value_errors_naming_the_rule():
    good = encode_tensors({"x": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.tensor([True])})
    bool_at = len(good) - 1
    cases = {
        "too short": good[:2],
        "overruns": struct.pack("<I", 10**6) + good[4:],
        "not utf-8 JSON": struct.pack("<I", 3) + b"{{{" + good[7:],
        "unknown dtype": _damage(good, lambda h: h["tensors"][0].update(dtype="object")),
        "nbytes": _damage(good, lambda h: h["tensors"][0].update(shape=[2, 4])),
        "not a list of non-negative": _damage(good, lambda h: h["tensors"][0].update(shape=[-2, -3])),
        "unknown version": _damage(good, lambda h: h.update(version=2)),
        "exactly name": _damage(good, lambda h: h["tensors"][0].update(__class__="os.system")),
        "offset": _damage(good, lambda h: h["tensors"][1].update(offset=8)),
        "trailing bytes": good + b"\x00",
        "bool bytes must be 0 or 1": good[:bool_at] + b"\x02",
        "overrun the": good[:-1],
    }
    for rule, data in cases.items():
        with pytest.raises(ValueError, match=rule):
            decode_tensors(data)


def test_json_round_trips_plain_data_and_rejects_duplicate_keys():
    obj = {"b": [1, 2.5, None, True], "a": {"nested": "ü"}, "inf": float("inf")}
    data = encode_json(obj)
    assert data.startswith(b'{"a":')  # canonical: sorted keys, compact
    assert decode_json(data) == obj
    with pytest.raises(ValueError, match="duplicate key 'a'"):
        decode_json(b'{"a": 1, "a": 2}')
    with pytest.raises(ValueError, match="not utf-8 JSON"):
        decode_json(b"\xff\xfe")


def _draws():
    return torch.rand(4).tolist(), np.random.rand(4).tolist(), [random.random() for _ in range(4)], np.random.randn(3).tolist()


def test_rng_restore_replays_torch_numpy_and_python_draws():
    torch.manual_seed(1)
    np.random.seed(1)
    random.seed(1)
    np.random.randn()  # leaves a cached Gaussian in numpy's state
    random.gauss(0, 1)  # and in python's
    state = capture_rng_state()
    assert set(state) >= {"torch_cpu", "numpy", "python"}
    assert all(isinstance(v, bytes) for v in state.values())
    first = _draws()
    assert _draws() != first  # the generators moved on
    restore_rng_state(state)
    assert _draws() == first


def test_malformed_rng_state_is_refused_without_touching_any_generator():
    state = capture_rng_state()
    broken = dict(state, python=encode_json({"version": 3, "internal": [1, 2], "gauss_next": None}))
    before = capture_rng_state()
    with pytest.raises(ValueError, match="rejected by numpy/python"):
        restore_rng_state(broken)
    assert capture_rng_state() == before  # torch and numpy were not half-restored
    with pytest.raises(ValueError, match="missing"):
        restore_rng_state({"torch_cpu": state["torch_cpu"]})
    with pytest.raises(ValueError, match="uint8 tensor"):
        restore_rng_state(dict(state, torch_cpu=encode_tensors({"state": torch.zeros(3)})))


class _Exploit:
    """Unpickling this would create the marker file: the classic pickle code-execution payload."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _is_plain(value) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_is_plain(v) for v in value)
    if isinstance(value, torch.Tensor):
        return type(value) is torch.Tensor
    return value is None or type(value) in (str, int, float, bool, bytes)


def test_a_crafted_checkpoint_cannot_execute_code_on_load(tmp_path):
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Exploit(marker))
    torch_save = io.BytesIO()
    torch.save({"x": _Exploit(marker)}, torch_save)
    sections = {
        "pickle": payload,
        "torch.save": torch_save.getvalue(),
        "json_tricks": json.dumps(
            {"__class__": "os.system", "__reduce__": ["os.system", ["touch pwned"]], "py/object": "os.system"}
        ).encode(),
        "tensor_header_tricks": struct.pack("<I", 60) + b'{"format":"alpha-rl.tensors","version":1,"tensors":[],"__class__":1}'[:60],
    }
    run_dir = tmp_path / "run"
    write_checkpoint(run_dir, 1, sections)
    loaded = [read_checkpoint(run_dir / "checkpoint-000000000001.bin").sections, latest_valid(run_dir).sections]
    for checkpoint_sections in loaded:
        assert checkpoint_sections == sections  # raw bytes, untouched
        for data in checkpoint_sections.values():
            for loader in (decode_tensors, decode_json):
                try:
                    result = loader(data)
                except ValueError:
                    continue
                assert _is_plain(result), (loader.__name__, result)
            with pytest.raises(ValueError):
                restore_rng_state({"torch_cpu": data, "numpy": data, "python": data})
    assert decode_json(sections["json_tricks"])["__class__"] == "os.system"  # a string, nothing more
    assert not marker.exists()
    # The payload is live: the unsafe loader the format avoids would have run it.
    pickle.loads(payload)
    assert marker.exists()


@pytest.mark.gpu
def test_cuda_tensors_are_saved_from_host_copies_and_rng_states_cover_every_device():
    tensors = {"w": torch.randn(3, 4, device="cuda"), "b": torch.ones(2, dtype=torch.bfloat16, device="cuda")}
    decoded = decode_tensors(encode_tensors(tensors), device="cuda")
    for name, tensor in tensors.items():
        assert decoded[name].device.type == "cuda" and _bits(decoded[name].cpu()) == _bits(tensor.cpu())
    torch.cuda.manual_seed_all(3)
    state = capture_rng_state()
    assert "torch_cuda" in state
    assert len(decode_tensors(state["torch_cuda"])) == torch.cuda.device_count()
    first = torch.rand(5, device="cuda").tolist()
    restore_rng_state(state)
    assert torch.rand(5, device="cuda").tolist() == first
