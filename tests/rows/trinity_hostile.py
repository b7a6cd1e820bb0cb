"""Hostile TRXP blobs for the decoder's tests (test_trinity_decoder.py) and the buffer's
end-to-end ones (test_trinity_buffers.py): each is what a lying writer could put in a buffer."""

import json
import pickle
import struct

import torch

from rescore.transforms.rows import trinity_format as trxp


def item(**eid):
    return trxp.new_item(eid={"batch": 0, "task": "t", "run": 0, "step": 0, "suffix": "s", **eid}, reward=1.0,
                         prompt_length=2)


def valid_blob(response: int = 3, **eid) -> bytes:
    fields = {"tokens": torch.arange(2 + response, dtype=torch.int32), "logprobs": -torch.rand(response),
              "action_mask": torch.ones(response, dtype=torch.bool)}
    return trxp.encode([(item(**eid), fields)])


def raw(meta: bytes, tensors: bytes) -> bytes:
    return b"TRXP" + struct.pack("<B", 1) + struct.pack("<QQ", len(meta), len(tensors)) + meta + tensors


def meta_pickle(it=None) -> bytes:
    return pickle.dumps({"version": 1, "num_items": 1, "items": [it or item()]})


def with_header(header: dict, body: bytes, declared: int | None = None) -> bytes:
    """A blob whose safetensors header is `header` (a lie, or not), over `body`."""
    text = json.dumps(header).encode()
    tensors = struct.pack("<Q", len(text) if declared is None else declared) + text + body
    return raw(meta_pickle(), tensors)


def tokens_header(**spec) -> dict:
    return {"0:tokens": {"dtype": "I32", "shape": [5], "data_offsets": [0, 20], **spec}}


def _with_info_ops(ops: bytes) -> bytes:
    """A metadata pickle whose item's `info` is what the pickle opcodes `ops` build (an
    attacker writes opcodes, not Python objects: no recursion limit applies to them)."""
    it = item()
    it["info"] = "@@INFO@@"
    head = pickle.dumps({"version": 1, "num_items": 1, "items": [it]}, protocol=2)
    sentinel = b"X\x08\x00\x00\x00@@INFO@@"
    assert head.count(sentinel) == 1
    return head.replace(sentinel, ops, 1)


def deep_info_pickle(depth: int) -> bytes:
    """`info` nesting `depth` dicts: {"a": {"a": ...}}."""
    return _with_info_ops(b"}" + b"X\x01\x00\x00\x00a}" * depth + b"s" * depth)


def shared_list_bomb(levels: int) -> bytes:
    """`info` a list naming the list below it twice, `levels` times: 2**levels values as a
    tree, a few hundred bytes as a pickle (memo references, slots from 1000 on)."""
    def put(k):
        return b"r" + struct.pack("<I", 1000 + k)  # LONG_BINPUT

    def get(k):
        return b"j" + struct.pack("<I", 1000 + k)  # LONG_BINGET

    # l0 = []; l_k = [l_{k-1}, l_{k-1}]; each built, memoized and popped; then l_levels pushed
    ops = b"]" + put(0) + b"0"
    ops += b"".join(b"(" + get(k - 1) + get(k - 1) + b"l" + put(k) + b"0" for k in range(1, levels + 1))
    return raw(_with_info_ops(ops + get(levels)), trxp.save_tensors({"0:tokens": torch.arange(5)}))


HOSTILE = {
    # name: (blob, reason prefix)
    "negative_shape": (with_header(tokens_header(shape=[-1, -5]), bytes(20)), "bad_blob: tensor '0:tokens' has shape [-1, -5]"),
    "overflowing_shape": (with_header(tokens_header(shape=[2**62, 2**62, 4]), bytes(20)), "bad_blob: tensor '0:tokens' data offsets"),
    "int64_wrapping_shape": (with_header(tokens_header(shape=[2**32, 2**32, 5]), bytes(20)), "bad_blob: tensor '0:tokens' data offsets"),
    "float_shape": (with_header(tokens_header(shape=[5.0]), bytes(20)), "bad_blob: tensor '0:tokens' has shape [5.0]"),
    "offsets_beyond": (with_header(tokens_header(data_offsets=[0, 10**12]), bytes(20)), "bad_blob: tensor '0:tokens' data offsets 0..1000000000000"),
    "offsets_reversed": (with_header(tokens_header(data_offsets=[20, 0]), bytes(20)), "bad_blob: tensor '0:tokens' data offsets 20..0"),
    "negative_offsets": (with_header(tokens_header(data_offsets=[-20, 0]), bytes(20)), "bad_blob: tensor '0:tokens' has data_offsets [-20, 0]"),
    "huge_header_length": (with_header(tokens_header(), bytes(20), declared=2**64 - 1), "bad_blob: tensor header of 18446744073709551615 bytes overruns"),
    "wrong_dtype": (with_header(tokens_header(dtype="I128"), bytes(20)), "bad_blob: tensor '0:tokens' has an unreadable or unsupported spec"),
    "dtype_not_text": (with_header(tokens_header(dtype=["I32"]), bytes(20)), "bad_blob: tensor '0:tokens' has an unreadable"),
    "spec_not_mapping": (with_header({"0:tokens": [1, 2]}, bytes(20)), "bad_blob: tensor '0:tokens' has an unreadable"),
    "bool_not_0_1": (with_header({"0:tokens": {"dtype": "I32", "shape": [5], "data_offsets": [0, 20]},
                                  "0:action_mask": {"dtype": "BOOL", "shape": [3], "data_offsets": [20, 23]}}, bytes(20) + b"\x01\x07\x00"),
                     "bad_blob: tensor '0:action_mask' is BOOL but holds bytes other than 0 and 1"),
    "deep_tensor_header": (raw(meta_pickle(), struct.pack("<Q", 200_000) + b"[" * 100_000 + b"]" * 100_000), "bad_blob: tensor header is nested too deeply"),
    "deep_info": (raw(deep_info_pickle(100_000), trxp.save_tensors({"0:tokens": torch.arange(5)})), "bad_blob: metadata item 0 is nested more than 100 levels deep"),
    "shared_list_bomb": (shared_list_bomb(60), "bad_blob: metadata item 0 holds more than 100,000 values"),
    "bytearray_size": (raw(b"\x80\x02cbuiltins\nbytearray\nq\x00J\x00\xca\x9a;\x85R.", b""), "unsafe_pickle: the metadata pickle calls bytearray with a size"),
    "float_tokens": (trxp.encode([(item(), {"tokens": torch.rand(5)})]), "bad_blob: tokens is torch.float32"),
    "2d_tokens": (trxp.encode([(item(), {"tokens": torch.zeros(5, 2, dtype=torch.int64)})]), "bad_blob: tokens is torch.int64 of shape [5, 2]"),
    "mask_not_0_1": (trxp.encode([(item(), {"tokens": torch.arange(5), "action_mask": torch.tensor([0, 1, 2], dtype=torch.int8)})]),
                     "bad_action_mask: action_mask values must be 0 or 1"),
    "surrogate_text": (trxp.encode([({**item(), "response_text": "a\ud800"}, {"tokens": torch.arange(5)})]), "bad_blob: response_text is not valid UTF-8"),
    "huge_batch": (valid_blob(batch=2**70), "bad_eid: eid.batch 1180591620717411303424 is beyond the int64 range"),
    "two_experiences": (trxp.encode([(item(), {"tokens": torch.arange(5)})] * 2), "bad_blob: holds 2 experiences"),
}
