"""The frameworks' own off-policy correction code, imported from their released wheels.

verl 0.9.1 `rollout_corr_helper.py` (the wheel tests/refs.py already unpacks), TRL 1.16.0
(GRPOTrainer's vLLM importance-sampling block and `get_off_policy_mask`), SkyRL 0.3.0
(`off_policy_correction_utils.py`) and OpenRLHF 0.11.2 (`PolicyLoss`'s is_correction gate).
Each wheel is fetched with `pip download --no-deps` into $RESCORE_REFS_CACHE/offpolicy (default
~/.cache/rescore-refs/offpolicy); heavy imports are stubbed and only the pure functions run.
Where a wheel cannot be fetched or imported, its loader raises RefsUnavailable with the
reason (the tests skip with it).
"""

from __future__ import annotations

import ast
import math
import os
import subprocess
import sys
import textwrap
import types
import zipfile
from functools import lru_cache
from typing import Any, Optional

import torch

import refs
from refs import RefsUnavailable, _exec_file, _extract, _module, _stubs

WHEELS = {"trl": "trl==1.16.0", "skyrl": "skyrl==0.3.0", "openrlhf": "openrlhf==0.11.2"}


@refs.cache_locked
def _wheel_src(key: str) -> str:
    """The unpacked wheel of WHEELS[key] (downloaded once)."""
    root = os.path.join(refs.cache_dir(), "offpolicy")
    src = os.path.join(root, "src-" + key)
    marker = os.path.join(src, ".complete")
    if os.path.exists(marker):
        return src
    os.makedirs(root, exist_ok=True)
    name, version = WHEELS[key].split("==")
    prefix = f"{name.replace('-', '_')}-{version}"
    wheels = [f for f in os.listdir(root) if f.startswith(prefix) and f.endswith(".whl")]
    if not wheels:
        try:
            done = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", root, WHEELS[key]],
                capture_output=True, text=True, timeout=300,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RefsUnavailable(f"could not download {WHEELS[key]}: {e}") from e
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
            raise RefsUnavailable(f"pip download {WHEELS[key]} failed: {tail[0]}")
        wheels = [f for f in os.listdir(root) if f.startswith(prefix) and f.endswith(".whl")]
        if not wheels:
            raise RefsUnavailable(f"pip download {WHEELS[key]} left no wheel")
    with zipfile.ZipFile(os.path.join(root, wheels[0])) as z:
        z.extractall(src)
    open(marker, "w").close()
    return src


def _guard(load):
    def wrapped():
        try:
            return load()
        except RefsUnavailable:
            raise
        except Exception as e:  # an import the stubs do not cover: skip, saying why
            raise RefsUnavailable(f"could not import the reference code: {type(e).__name__}: {e}") from e

    return lru_cache(maxsize=1)(wrapped)


@_guard
def verl() -> types.ModuleType:
    """verl 0.9.1's verl/trainer/ppo/rollout_corr_helper.py."""
    src = refs._unpacked()
    vf = refs.load().verl.verl_F  # the torch_functional core_algos imported

    class DataProto:
        @staticmethod
        def from_dict(tensors):
            return types.SimpleNamespace(batch=tensors)

    mods = {
        "verl": _module("verl", DataProto=DataProto),
        "verl.utils": _module("verl.utils", torch_functional=vf),
        "verl.utils.torch_functional": vf,
        "verl.protocol": _module("verl.protocol", DataProto=DataProto),
        "verl.trainer": _module("verl.trainer"),
        "verl.trainer.config": _module("verl.trainer.config"),
        "verl.trainer.config.algorithm": _module("verl.trainer.config.algorithm", RolloutCorrectionConfig=dict),
        "verl.workers": _module("verl.workers"),
        "verl.workers.config": _module("verl.workers.config"),
        "verl.workers.config.actor": _module("verl.workers.config.actor", PolicyLossConfig=dict),
    }
    with _stubs(mods):
        return _exec_file(os.path.join(src, "verl/trainer/ppo/rollout_corr_helper.py"), "_ref_verl_rollout_corr_helper")


def _method(path: str, cls: str, name: str) -> ast.FunctionDef:
    tree = ast.parse(open(path, encoding="utf-8").read())
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == name)


@_guard
def trl() -> types.SimpleNamespace:
    """TRL 1.16.0 GRPOTrainer: `get_off_policy_mask` and the importance-sampling block of
    `_generate_and_score_completions`, as functions (the trainer's own statements)."""
    path = os.path.join(_wheel_src("trl"), "trl/trainer/grpo_trainer.py")
    ns: dict[str, Any] = {"torch": torch, "math": math, "__name__": "_ref_trl"}
    mask_fn = _method(path, "GRPOTrainer", "get_off_policy_mask")
    mask_fn.decorator_list = []
    exec(compile(ast.Module(body=[mask_fn], type_ignores=[]), path, "exec"), ns)
    gen = _method(path, "GRPOTrainer", "_generate_and_score_completions")
    block = None
    for node in ast.walk(gen):
        if isinstance(node, ast.If) and "vllm_importance_sampling_correction" in ast.unparse(node.test):
            if "per_token_logps_diff" in ast.unparse(node):
                block = node
                break
    if block is None:
        raise RefsUnavailable("TRL's importance-sampling block was not found in GRPOTrainer")
    body = textwrap.indent("\n".join(ast.unparse(s) for s in block.body), "    ")
    code = (
        "def importance_sampling_ratio(self, old_per_token_logps, sampling_per_token_logps, completion_mask, tool_mask=None):\n"
        f"{body}\n    return vllm_importance_sampling_ratio\n"
    )
    exec(compile(code, path, "exec"), ns)
    return types.SimpleNamespace(get_off_policy_mask=ns["get_off_policy_mask"], importance_sampling_ratio=ns["importance_sampling_ratio"])


@_guard
def skyrl() -> types.ModuleType:
    """SkyRL 0.3.0's skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py."""
    src = _wheel_src("skyrl")
    utils = os.path.join(src, "skyrl/backends/skyrl_train/utils")
    tu = _extract(os.path.join(utils, "torch_utils.py"), {"masked_mean", "safe_exp_delta"}, {"torch": torch, "Optional": Optional, "__name__": "skyrl.backends.skyrl_train.utils.torch_utils"})
    torch_utils = _module("skyrl.backends.skyrl_train.utils.torch_utils", masked_mean=tu["masked_mean"], safe_exp_delta=tu["safe_exp_delta"])
    mods = {
        "omegaconf": _module("omegaconf", DictConfig=dict),
        "skyrl": _module("skyrl"),
        "skyrl.backends": _module("skyrl.backends"),
        "skyrl.backends.skyrl_train": _module("skyrl.backends.skyrl_train"),
        "skyrl.backends.skyrl_train.utils": _module("skyrl.backends.skyrl_train.utils"),
        "skyrl.backends.skyrl_train.utils.torch_utils": torch_utils,
    }
    with _stubs(mods):
        return _exec_file(os.path.join(utils, "off_policy_correction_utils.py"), "_ref_skyrl_off_policy_correction_utils")


def skyrl_config(**values) -> types.SimpleNamespace:
    """SkyRL's off_policy_correction config with its defaults (skyrl/train/config/config.py)."""
    base = dict(
        tis_ratio_type=None, token_tis_ratio_clip_high=2.0, sequence_tis_ratio_clip_high=5.0,
        sequence_mask_metric=None, geo_mask_high=1.01, geo_mask_low=0.99, product_mask_high=2.0, product_mask_low=0.5,
        outlier_token_is_threshold_low=None, outlier_token_is_threshold_high=None,
        token_mask_is_threshold_low=None, token_mask_is_threshold_high=None,
    )
    base.update(values)
    return types.SimpleNamespace(**base)


@_guard
def openrlhf() -> type:
    """OpenRLHF 0.11.2's PolicyLoss, with aggregate_loss replaced by the identity so that
    forward() returns the per-token loss (the gate's coefficient times the PPO term)."""
    src = _wheel_src("openrlhf")
    purelib = next(os.path.join(src, d, "purelib") for d in os.listdir(src) if d.endswith(".data"))
    models = os.path.join(purelib, "openrlhf/models")
    util = _extract(os.path.join(models, "utils.py"), {"masked_mean"}, {"torch": torch, "Optional": Optional, "__name__": "openrlhf.models.utils"})
    import torch.nn as nn

    ns = _extract(
        os.path.join(models, "loss.py"),
        {"PolicyLoss"},
        {"torch": torch, "nn": nn, "Optional": Optional, "Tuple": tuple, "masked_mean": util["masked_mean"], "__name__": "openrlhf.models.loss"},
    )
    ns["aggregate_loss"] = lambda loss, action_mask, **kwargs: loss
    return ns["PolicyLoss"]
