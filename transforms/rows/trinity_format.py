"""Trinity-RFT's "TRXP" experience blobs, read and written without importing Trinity.

A blob (trinity/common/experience.py, `Experience.serialize_many`, version 1) is

    b"TRXP" | version: u8 | len(metadata): u64 LE | len(tensors): u64 LE | metadata | tensors

`metadata` is a pickle of {"version", "num_items", "items": [per-experience dict]} and
`tensors` a safetensors file whose keys are "INDEX:FIELD" (e.g. "0:logprobs").

Unpickling runs whatever the pickle names, so the metadata goes through `_PlainUnpickler`,
which builds only the plain values Trinity writes (dict, list, str, numbers, None, and numpy
scalars/arrays of plain dtypes); any other global (os.system, builtins.eval, a Trinity class)
is refused with BlobError before anything is called. The tensors are parsed here from the
safetensors layout (an 8-byte header length, a JSON header, raw little-endian data): no code
runs while reading them.
"""

from __future__ import annotations

import io
import json
import math
import pickle
import struct
from typing import Any

import torch

from rescore.errors import BlobError, first_line

MAGIC = b"TRXP"
VERSION = 1
_HEADER = len(MAGIC) + 1 + 8 + 8

TENSOR_FIELDS = (
    "tokens", "logprobs", "token_level_reward", "advantages", "returns", "action_mask",
    "chosen", "rejected", "teacher_logprobs", "routed_experts",
)
RESPONSE_FIELDS = ("logprobs", "token_level_reward", "advantages", "returns", "action_mask", "teacher_logprobs")
"""Tensors with one value per response token: their length must be len(tokens) - prompt_length."""

META_FIELDS = (
    "eid", "reward", "truncate_status", "info", "metrics", "prompt_length", "response_text",
    "prompt_text", "messages", "tools", "chosen_messages", "rejected_messages",
)


# (module, name) pairs the metadata pickle may name: numpy scalars and arrays (workflows often
# put np.float64 means into `metrics`/`info`) and a few inert standard-library value types.
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "dtype"), ("numpy", "ndarray"),
    ("collections", "OrderedDict"),
    ("datetime", "datetime"), ("datetime", "date"), ("datetime", "time"), ("datetime", "timedelta"),
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "complex"), ("builtins", "bytearray"),
}


def _bytearray(*args):
    """bytearray(bytes) or bytearray(str, encoding) as pickles of protocol < 5 write it; never
    bytearray(n), which would allocate n bytes on the pickle's say."""
    if not args or not isinstance(args[0], (bytes, str)):
        raise BlobError("unsafe_pickle: the metadata pickle calls bytearray with a size; nothing was allocated")
    return bytearray(*args)


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED_GLOBALS:
            raise BlobError(
                f"unsafe_pickle: the metadata pickle names {module}.{name}; only plain values "
                "(dict, list, str, numbers, numpy scalars) are unpickled, nothing was run"
            )
        if (module, name) == ("builtins", "bytearray"):
            return _bytearray
        return super().find_class(module, name)

    def persistent_load(self, pid):
        raise BlobError("unsafe_pickle: the metadata pickle uses persistent ids; nothing was run")


def loads_plain(data: bytes) -> Any:
    """pickle.loads that builds only plain values (see _ALLOWED_GLOBALS)."""
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except BlobError:
        raise
    except Exception as e:  # truncated or garbled pickles raise many types
        raise BlobError(f"bad_blob: metadata does not unpickle ({type(e).__name__}: {first_line(e, limit=200, blank='')})") from None


# safetensors dtype names <-> torch dtypes
_ST_DTYPES = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32,
    "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
    "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64,
}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}


MAX_DEPTH = 100
"""Deepest nesting of containers a metadata item may have (Trinity's are a few levels deep)."""
MAX_VALUES = 100_000
"""Most values (containers, strings, numbers) a metadata item may hold, counted as a tree: a
pickle can name one list many times, so a few bytes can describe 2**60 values to print."""
MAX_DIMS = 32


def check_plain(value: Any, what: str = "metadata") -> None:
    """BlobError unless `value` nests at most MAX_DEPTH containers deep and holds at most
    MAX_VALUES values counted as a tree (shared references counted each time). Iterative: a
    value nested 100,000 deep is refused here, never by a RecursionError later (json, str,
    pickle all recurse)."""
    stack = [(value, 0)]
    seen = 0
    while stack:
        v, depth = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise BlobError(f"bad_blob: {what} holds more than {MAX_VALUES:,} values")
        if isinstance(v, dict):
            children = [*v.keys(), *v.values()]
        elif isinstance(v, (list, tuple, set, frozenset)):
            children = v
        else:
            continue
        if depth >= MAX_DEPTH and children:
            raise BlobError(f"bad_blob: {what} is nested more than {MAX_DEPTH} levels deep")
        stack.extend((c, depth + 1) for c in children)


def _nonnegative_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def load_tensors(data: bytes) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors payload (what safetensors.torch.load returns).

    Every number of the header is checked before it is used: a header that lies (negative or
    huge shapes, offsets beyond the data, a length beyond the section, an unknown dtype) is a
    BlobError; nothing is allocated on its say beyond the bytes present."""
    if len(data) < 8:
        raise BlobError("bad_blob: tensor section is shorter than its header")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise BlobError(f"bad_blob: tensor header of {n} bytes overruns the {len(data)}-byte section")
    try:
        header = json.loads(bytes(data[8 : 8 + n]).decode("utf-8"))
    except RecursionError:
        raise BlobError("bad_blob: tensor header is nested too deeply") from None
    except ValueError:  # UnicodeDecodeError too
        raise BlobError("bad_blob: tensor header is not JSON") from None
    if not isinstance(header, dict):
        raise BlobError("bad_blob: tensor header is not a mapping")
    body = memoryview(data)[8 + n :]
    out = {}
    for key, spec in header.items():
        if key == "__metadata__":
            continue
        shown = f"tensor {key[:60]!r}"
        if not isinstance(spec, dict) or not isinstance(spec.get("dtype"), str) or spec["dtype"] not in _ST_DTYPES:
            raise BlobError(f"bad_blob: {shown} has an unreadable or unsupported spec {_short(spec)}")
        dtype = _ST_DTYPES[spec["dtype"]]
        shape, offsets = spec.get("shape"), spec.get("data_offsets")
        if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(map(_nonnegative_int, shape)):
            raise BlobError(f"bad_blob: {shown} has shape {_short(shape)}, not a list of at most {MAX_DIMS} sizes >= 0")
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_nonnegative_int, offsets)):
            raise BlobError(f"bad_blob: {shown} has data_offsets {_short(offsets)}, not [start, end]")
        start, end = offsets
        count = math.prod(shape)  # Python ints: no overflow
        itemsize = torch.empty(0, dtype=dtype).element_size()
        if not start <= end <= len(body) or end - start != count * itemsize:
            raise BlobError(f"bad_blob: {shown} data offsets {start}..{end} do not fit its shape {_short(shape)} "
                            f"of {spec['dtype']} in {len(body)} bytes")
        raw = bytearray(body[start:end])  # a private, writable copy
        if dtype == torch.bool and raw.translate(None, b"\x00\x01"):
            raise BlobError(f"bad_blob: {shown} is BOOL but holds bytes other than 0 and 1")
        t = torch.frombuffer(raw, dtype=dtype) if count else torch.empty(0, dtype=dtype)
        out[key] = t.reshape(shape)
    return out


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def save_tensors(tensors: dict[str, torch.Tensor]) -> bytes:
    """A safetensors payload (what safetensors.torch.save writes: 8-aligned header, data in key order)."""
    header: dict[str, Any] = {}
    chunks = []
    offset = 0
    for key in sorted(tensors):
        t = tensors[key].detach().contiguous().cpu()
        raw = t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[key] = {"dtype": _ST_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def decode(blob: bytes) -> list[tuple[dict, dict[str, torch.Tensor]]]:
    """[(metadata item, {field: tensor})] for each experience of a TRXP blob; BlobError if unreadable.

    The blob is untrusted input: whatever its bytes, this returns or raises BlobError (a
    reason), never another exception, and runs no code (see _PlainUnpickler)."""
    try:
        return _decode(blob)
    except BlobError:
        raise
    except RecursionError:
        raise BlobError("bad_blob: nested too deeply to read") from None
    except Exception as e:  # noqa: BLE001  (defence in depth: the checks above should come first)
        raise BlobError(f"bad_blob: unreadable ({type(e).__name__}: {first_line(e, limit=200, blank='')})") from None


def _decode(blob) -> list[tuple[dict, dict[str, torch.Tensor]]]:
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise BlobError("bad_blob: experience_bytes is not binary")
    blob = bytes(blob)
    if not blob.startswith(MAGIC):
        raise BlobError(
            "bad_blob: not a TRXP blob (a legacy pickled Experience or foreign bytes); "
            "only Trinity-RFT >= 0.6 serialisation is read"
        )
    if len(blob) < _HEADER:
        raise BlobError(f"bad_blob: {len(blob)} bytes, shorter than the TRXP header")
    version = blob[4]
    if version != VERSION:
        raise BlobError(f"bad_blob: TRXP version {version}, this reader knows version {VERSION}")
    meta_len, tensor_len = struct.unpack("<QQ", blob[5:_HEADER])
    if _HEADER + meta_len + tensor_len > len(blob):
        raise BlobError(f"bad_blob: truncated ({len(blob)} bytes, the header promises {_HEADER + meta_len + tensor_len})")
    metadata = loads_plain(blob[_HEADER : _HEADER + meta_len])
    tensors = load_tensors(blob[_HEADER + meta_len : _HEADER + meta_len + tensor_len])
    if not isinstance(metadata, dict) or not isinstance(metadata.get("items"), list):
        raise BlobError("bad_blob: metadata has no 'items' list")
    out = []
    for index, item in enumerate(metadata["items"]):
        if not isinstance(item, dict):
            raise BlobError(f"bad_blob: metadata item {index} is not a mapping")
        check_plain(item, f"metadata item {index}")
        prefix = f"{index}:"
        fields = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        out.append((item, fields))
    return out


def encode(items: list[tuple[dict, dict[str, torch.Tensor]]]) -> bytes:
    """A TRXP blob from [(metadata item, {field: tensor})], as Experience.serialize_many writes it."""
    metadata = {"version": VERSION, "num_items": len(items), "items": [item for item, _ in items]}
    tensors = {f"{i}:{name}": t for i, (_, fields) in enumerate(items) for name, t in fields.items()}
    meta_bytes = pickle.dumps(metadata, protocol=pickle.HIGHEST_PROTOCOL)
    tensor_bytes = save_tensors(tensors)
    return MAGIC + struct.pack("<B", VERSION) + struct.pack("<QQ", len(meta_bytes), len(tensor_bytes)) + meta_bytes + tensor_bytes


def new_item(*, eid: dict, reward: float | None, prompt_length: int, info: dict | None = None) -> dict:
    """The metadata item of an experience built from columns (no Trinity blob to start from)."""
    item = {name: None for name in META_FIELDS}
    item.update(eid=eid, reward=reward, prompt_length=int(prompt_length), info=info or {}, metrics={})
    item["custom_fields"] = []
    item["multi_modal_input_keys"] = []
    return item
