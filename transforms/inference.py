"""Model math for the model stage: log-probs of logged response tokens under a causal LM, a
reward model's scalar, a verifier function's reward. Pure torch/numpy over lists of rows; no
Beam (transforms/models.py wraps these in RunInference).

A row is (tokens (L,) int, prompt_length P): the response is tokens[P:]. The log-prob of
response token t (position P + t) is log_softmax(logits[P + t - 1])[tokens[P + t]], the same
value a direct `model(input_ids=tokens[None]).logits` gives. Only those values leave the model:
never the full logits.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rescore.errors import ModelConfigError, first_line

INSTALL_HINT = "pip install 'rescore[models]' (transformers)"


def require_transformers():
    """The transformers module, or ModelConfigError saying what to install. Its progress bars
    ("Loading weights: 100%") and info logs are turned off: they would go to stderr, where a
    failure is one line and a --quiet run prints nothing."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        import transformers
    except ImportError:
        raise ModelConfigError(f"the model flags need the transformers package: {INSTALL_HINT}") from None
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    return transformers


def torch_dtype(name: str, device: torch.device) -> torch.dtype:
    """--model-dtype: auto is bfloat16 on a GPU that supports it (else float16), float32 on CPU."""
    if name == "auto":
        if device.type != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def context_length(config: Any) -> int | None:
    """The longest sequence the model takes (max_position_embeddings / n_positions), or None."""
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def load_causal_lm(path: str, device: torch.device, dtype: torch.dtype):
    transformers = require_transformers()
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model.to(device).eval().requires_grad_(False)


def load_reward_model(path: str, device: torch.device, dtype: torch.dtype):
    transformers = require_transformers()
    model = transformers.AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype)
    return model.to(device).eval().requires_grad_(False)


def check_model_dir(path: str, flag: str) -> Any:
    """The model's config (read before the pipeline starts), or ModelConfigError."""
    transformers = require_transformers()
    try:
        return transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as e:  # transformers raises OSError, ValueError, KeyError for bad dirs
        raise ModelConfigError(f"{flag} {path}: not a Hugging Face model directory ({first_line(e)})") from None


@dataclass(frozen=True)
class Padded:
    input_ids: torch.Tensor
    """(B, L) int64."""
    attention_mask: torch.Tensor
    """(B, L) int64, 1 on real tokens."""
    position_ids: torch.Tensor
    """(B, L) int64: 0, 1, ... over each row's real tokens (pads 0 or 1, never used)."""
    start: np.ndarray
    """(B,) int64: column of each row's first real token (0 with right padding)."""


def pad(rows: Sequence[np.ndarray], *, pad_id: int = 0, side: str = "right", device: torch.device | None = None) -> Padded:
    """Rows of token ids as one padded batch; position ids count real tokens only, so a row's
    values do not depend on its padding."""
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    width = max(int(lengths.max(initial=0)), 1)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    start = (width - lengths) if side == "left" else np.zeros(len(rows), dtype=np.int64)
    for i, r in enumerate(rows):
        ids[i, start[i] : start[i] + len(r)] = r
        mask[i, start[i] : start[i] + len(r)] = 1
    positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
    device = device or torch.device("cpu")
    return Padded(
        torch.from_numpy(ids).to(device),
        torch.from_numpy(mask).to(device),
        torch.from_numpy(positions).to(device),
        start,
    )


TOKEN_STATS = ("entropy", "sum_pi_squared")
"""Per-token statistics of the policy's whole distribution that the log-prob forward pass can
also give: entropy -sum_v p_v log p_v and sum_pi_squared sum_v p_v^2 (v over the vocabulary)."""


def response_logprobs(
    model, rows: Sequence[np.ndarray], prompt_lengths: Sequence[int], *, pad_id: int = 0, side: str = "right",
) -> list[np.ndarray]:
    """(R_i,) float32 log-probs of each row's response tokens tokens[P_i:] under `model`.

    Every row needs P_i >= 1 where it has a response (the first token has no context); a row
    without a response gives an empty array. The log-softmax runs in float32 over the response
    positions of one row at a time, so the extra memory is R_i x vocab, not B x L x vocab.
    """
    return [v["logprobs"] for v in response_token_values(model, rows, prompt_lengths, pad_id=pad_id, side=side)]


def response_token_values(
    model, rows: Sequence[np.ndarray], prompt_lengths: Sequence[int], *, pad_id: int = 0, side: str = "right",
    stats: Sequence[str] = (),
) -> list[dict[str, np.ndarray]]:
    """Per row, {"logprobs": (R_i,) float32, and each of `stats` (TOKEN_STATS): (R_i,) float32}
    over its response tokens, all from one forward pass (response_logprobs' rules). The
    statistics of position t use the same float32 log-softmax row as its log-prob."""
    names = ("logprobs", *stats)
    out: list[dict[str, np.ndarray] | None] = [None] * len(rows)
    work = [i for i, r in enumerate(rows) if len(r) - int(prompt_lengths[i]) > 0]
    for i in set(range(len(rows))) - set(work):
        out[i] = {n: np.zeros(0, dtype=np.float32) for n in names}
    if work:
        device = next(model.parameters()).device
        # Left padding needs explicit position ids; a model whose forward takes none (ALiBi
        # models such as Bloom) is padded on the right, where the default positions are right.
        takes_positions = "position_ids" in inspect.signature(model.forward).parameters
        side = side if takes_positions else "right"
        batch = pad([rows[i] for i in work], pad_id=pad_id, side=side, device=device)
        inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
        if side == "left":
            inputs["position_ids"] = batch.position_ids
        with torch.inference_mode():
            logits = model(**inputs).logits
            for b, i in enumerate(work):
                p, n = int(prompt_lengths[i]), len(rows[i])
                s = int(batch.start[b])
                # logits at position t predict token t + 1: positions P-1 .. n-2 score tokens P .. n-1.
                step = logits[b, s + p - 1 : s + n - 1].float()
                target = batch.input_ids[b, s + p : s + n].unsqueeze(-1)
                logp = torch.log_softmax(step, dim=-1)
                row = {"logprobs": logp.gather(-1, target).squeeze(-1)}
                if stats:
                    probs = logp.exp()
                    if "entropy" in stats:
                        row["entropy"] = -(probs * logp).sum(-1)
                    if "sum_pi_squared" in stats:
                        row["sum_pi_squared"] = probs.square().sum(-1)
                out[i] = {n: row[n].cpu().numpy().astype(np.float32, copy=False) for n in names}
    return out  # type: ignore[return-value]


def reward_scores(model, rows: Sequence[np.ndarray], *, pad_id: int | None) -> np.ndarray:
    """(B,) float64: a sequence-classification reward model's first logit for each full row
    (prompt + response), the value `model(input_ids=tokens[None]).logits[0, 0]` gives.

    Hugging Face finds each row's last token through config.pad_token_id; without one, rows
    are scored one at a time (no padding), as a direct call would.
    """
    device = next(model.parameters()).device
    out = np.zeros(len(rows), dtype=np.float64)
    with torch.inference_mode():
        if pad_id is None:
            for i, r in enumerate(rows):
                ids = torch.as_tensor(np.asarray(r, dtype=np.int64), device=device)[None]
                out[i] = float(model(input_ids=ids).logits[0, 0].float())
            return out
        batch = pad(rows, pad_id=pad_id, side="right", device=device)
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        out[:] = logits[:, 0].float().cpu().numpy()
    return out


# --- --reward-fn: transforms/verifier.py (no torch: its worker process starts light) ---------

from rescore.transforms.verifier import REWARD_FN_ARGS, RewardFn, call_reward_fn, load_reward_fn  # noqa: E402,F401
