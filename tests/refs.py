"""The reference projects' own advantage code, imported from their released wheels.

`verl==0.9.1` and `trinity-rft==0.6.0` are downloaded without dependencies (`pip download
--no-deps`) into a cache directory ($RESCORE_REFS_CACHE, default ~/.cache/rescore-refs) and
unpacked there. Their heavy imports (ray, vllm, transformers, tensordict, the trainer configs)
are replaced by minimal stubs while one module file at a time is executed; the functions under
test are the wheels' own code. Where the download or an import fails, the caller skips with the
reason (`load()` raises RefsUnavailable).
"""

from __future__ import annotations

import ast
import dataclasses
import fcntl
import functools
import importlib.util
import os
import subprocess
import sys
import types
import uuid
import zipfile
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Union

import pytest

WHEELS = {"verl": "verl==0.9.1", "trinity": "trinity-rft==0.6.0"}


class RefsUnavailable(RuntimeError):
    pass


def cache_dir() -> str:
    return os.environ.get("RESCORE_REFS_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "rescore-refs")


_locked_depth = 0


def cache_locked(fn):
    """Run `fn` holding an flock on the cache: test processes side by side (pytest -n 2) each
    download and unpack into the same cache; one does it, the others wait and find it done."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        global _locked_depth
        if _locked_depth:  # already held by this process (flock would wait for itself)
            return fn(*args, **kwargs)
        os.makedirs(cache_dir(), exist_ok=True)
        with open(os.path.join(cache_dir(), ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            _locked_depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                _locked_depth -= 1

    return wrapped


@cache_locked
def _unpacked() -> str:
    root = cache_dir()
    src = os.path.join(root, "src")
    marker = os.path.join(src, ".complete")
    if os.path.exists(marker):
        return src
    os.makedirs(root, exist_ok=True)
    wheels = [f for f in os.listdir(root) if f.endswith(".whl")]
    if not (any(w.startswith("verl-0.9.1") for w in wheels) and any(w.startswith("trinity_rft-0.6.0") for w in wheels)):
        try:
            done = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", root, *WHEELS.values()],
                capture_output=True,
                text=True,
                timeout=300,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RefsUnavailable(f"could not download {', '.join(WHEELS.values())}: {e}") from e
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
            raise RefsUnavailable(f"pip download {' '.join(WHEELS.values())} failed: {tail[0]}")
        wheels = [f for f in os.listdir(root) if f.endswith(".whl")]
    os.makedirs(src, exist_ok=True)
    for w in wheels:
        if w.startswith(("verl-0.9.1", "trinity_rft-0.6.0")):
            with zipfile.ZipFile(os.path.join(root, w)) as z:
                z.extractall(src)
    open(marker, "w").close()
    return src


def _module(name: str, **attrs) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__path__ = []  # a package, so submodules can be stubbed too
    m.__dict__.update(attrs)
    return m


@contextmanager
def _stubs(mods: dict[str, types.ModuleType]):
    saved = {k: sys.modules.get(k) for k in mods}
    sys.modules.update(mods)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def _exec_file(path: str, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    with _stubs({name: module}):  # dataclasses look their module up while the file runs
        spec.loader.exec_module(module)
    return module


def _extract(path: str, names: set[str], namespace: dict) -> dict:
    """Execute only the top-level definitions `names` of a source file (the reference's own
    code for small helpers whose module imports the whole framework)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    body = [node for node in tree.body if getattr(node, "name", None) in names]
    holder = _module(namespace["__name__"])
    holder.__dict__.update(namespace)
    with _stubs({holder.__name__: holder}):
        exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), holder.__dict__)
    return holder.__dict__


class DataProto:
    """Stand-in for verl.DataProto: the two dicts the advantage functions read and write."""

    def __init__(self, batch: dict, non_tensor_batch: dict | None = None):
        self.batch = batch
        self.non_tensor_batch = non_tensor_batch or {}


class Experience:
    """Stand-in for trinity.common.experience.Experience with the fields advantage code uses."""

    def __init__(self, eid, reward, action_mask, info=None, metrics=None):
        self.eid = eid
        self.reward = reward
        self.action_mask = action_mask
        self.info = info or {}
        self.metrics = metrics or {}
        self.advantages = None
        self.returns = None


@lru_cache(maxsize=1)
def load() -> types.SimpleNamespace:
    """verl's core_algos, Trinity's advantage classes, and Trinity's EID."""
    try:
        src = _unpacked()
        return _load(src)
    except RefsUnavailable:
        raise
    except Exception as e:  # an import that the stubs do not cover: skip, saying why
        raise RefsUnavailable(f"could not import the reference code: {type(e).__name__}: {e}") from e


def _load(src: str) -> types.SimpleNamespace:
    class _Anything:
        def __init__(self, *a, **k):
            pass

    def deprecated(replacement: str = ""):
        return lambda obj: obj

    verl_utils = _module("verl.utils", as_torch_index=None, group_mean_std=None)
    mods = {
        "verl": _module("verl", DataProto=DataProto),
        "verl.utils": verl_utils,
        "verl.utils.device": _module("verl.utils.device", get_device_name=lambda: "cpu", get_torch_device=lambda: None),
        "verl.utils.import_utils": _module("verl.utils.import_utils", deprecated=deprecated),
        "verl.trainer": _module("verl.trainer"),
        "verl.trainer.config": _module("verl.trainer.config", AlgoConfig=dict),
        "verl.workers": _module("verl.workers"),
        "verl.workers.config": _module("verl.workers.config", ActorConfig=_Anything),
        "omegaconf": _module("omegaconf", DictConfig=dict),
        "tensordict": _module("tensordict", TensorDict=_Anything),
        "transformers": _module("transformers", PreTrainedTokenizer=_Anything),
    }
    with _stubs(mods):
        vf = _exec_file(os.path.join(src, "verl/utils/torch_functional.py"), "verl.utils.torch_functional")
        verl_utils.torch_functional = vf
        mods["verl.utils.torch_functional"] = vf
        with _stubs({"verl.utils.torch_functional": vf}):
            core = _exec_file(os.path.join(src, "verl/trainer/ppo/core_algos.py"), "_ref_verl_core_algos")

    # Trinity: the real advantage_fn base classes and group_by, with the operator base,
    # Experience and metrics helpers they import.
    exp_ns = _extract(
        os.path.join(src, "trinity/common/experience.py"),
        {"EID", "group_by"},
        {"dataclass": dataclasses.dataclass, "field": dataclasses.field, "uuid": uuid, "Union": Union, "Literal": Any, "Dict": dict, "List": list, "__name__": "trinity.common.experience"},
    )
    experience = _module("trinity.common.experience", Experience=Experience, EID=exp_ns["EID"], group_by=exp_ns["group_by"])
    metrics = _exec_file(os.path.join(src, "trinity/utils/metrics.py"), "trinity.utils.metrics")

    class ExperienceOperator:
        pass

    tmods = {
        "trinity": _module("trinity"),
        "trinity.common": _module("trinity.common"),
        "trinity.common.experience": experience,
        "trinity.utils": _module("trinity.utils"),
        "trinity.utils.metrics": metrics,
        "trinity.utils.annotations": _module("trinity.utils.annotations", Deprecated=lambda obj: obj),
        "trinity.buffer": _module("trinity.buffer"),
        "trinity.buffer.operators": _module("trinity.buffer.operators", ExperienceOperator=ExperienceOperator),
        "trinity.algorithm": _module("trinity.algorithm"),
        "verl": _module("verl", DataProto=DataProto),
    }
    adv = os.path.join(src, "trinity/algorithm/advantage_fn")
    trinity = types.SimpleNamespace()
    with _stubs(tmods):
        base = _exec_file(os.path.join(adv, "advantage_fn.py"), "trinity.algorithm.advantage_fn.advantage_fn")
        package = _module("trinity.algorithm.advantage_fn", AdvantageFn=base.AdvantageFn, GroupAdvantage=base.GroupAdvantage)
        utils = _exec_file(os.path.join(src, "trinity/algorithm/utils.py"), "trinity.algorithm.utils")
        with _stubs({"trinity.algorithm.advantage_fn": package, "trinity.algorithm.advantage_fn.advantage_fn": base, "trinity.algorithm.utils": utils}):
            for mod, cls in [
                ("reinforce_plus_plus_advantage", "REINFORCEPLUSPLUSAdvantageFn"),
                ("reinforce_advantage", "REINFORCEGroupAdvantage"),
                ("rec_advantage", "RECGroupedAdvantage"),
                ("remax_advantage", "REMAXAdvantageFn"),
                ("jsd_advantage", "JSDAdvantage"),
                ("gigpo_advantage", "GiGPOAdvantageFn"),
                ("grpo_advantage", "GRPOGroupedAdvantage"),
                ("clipb_advantage", "ClipBAdvantageFn"),
            ]:
                m = _exec_file(os.path.join(adv, f"{mod}.py"), f"_ref_trinity_{mod}")
                setattr(trinity, cls, getattr(m, cls))
                setattr(trinity, f"_module_{mod}", m)
        # The experience operators (filters) the buffer pipeline runs before the advantage.
        filters = _exec_file(os.path.join(src, "trinity/buffer/operators/filters/reward_filter.py"), "_ref_trinity_reward_filter")
        for cls in ("DAPODynamicSamplingFilter", "RewardFilter", "RewardSTDFilter"):
            setattr(trinity, cls, getattr(filters, cls))
    return types.SimpleNamespace(verl=core, trinity=trinity, EID=exp_ns["EID"], Experience=Experience, DataProto=DataProto)


# --- TRL, OpenRLHF, SkyRL and AReaL: their pure functions and inline advantage code ----------------

EXTRA_WHEELS = {
    "trl": ("trl==1.16.0", "trl-1.16.0"),
    "openrlhf": ("openrlhf==0.11.2", "openrlhf-0.11.2"),
    "skyrl": ("skyrl==0.4.0", "skyrl-0.4.0"),
    "areal": ("areal==1.0.4", "areal-1.0.4"),
}
"""Downloaded with `pip download --no-deps` like verl and Trinity (skyrl's wheel says Python
3.12, so it is fetched as a wheel for 3.12: only pure Python is read from it)."""


@cache_locked
def _extra_unpacked(name: str) -> str:
    requirement, prefix = EXTRA_WHEELS[name]
    root = os.path.join(cache_dir(), "extra")
    src = os.path.join(root, "src-" + name)
    marker = os.path.join(src, ".complete")
    if os.path.exists(marker):
        return src
    os.makedirs(root, exist_ok=True)
    wheels = [f for f in os.listdir(root) if f.startswith(prefix.replace("-", "_", 1)) or f.startswith(prefix)]
    if not wheels:
        args = ["--python-version", "3.12", "--only-binary=:all:"] if name == "skyrl" else []
        try:
            done = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", root, *args, requirement],
                capture_output=True, text=True, timeout=300,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RefsUnavailable(f"could not download {requirement}: {e}") from e
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
            raise RefsUnavailable(f"pip download {requirement} failed: {tail[0]}")
        wheels = [f for f in os.listdir(root) if f.startswith(prefix.replace("-", "_", 1)) or f.startswith(prefix)]
    os.makedirs(src, exist_ok=True)
    with zipfile.ZipFile(os.path.join(root, wheels[0])) as z:
        z.extractall(src)
    open(marker, "w").close()
    return src


def _find(src: str, relative: str) -> str:
    """A file of an unpacked wheel (OpenRLHF's lives under openrlhf-X.data/purelib/)."""
    for root, _, files in os.walk(src):
        path = os.path.join(root, os.path.basename(relative))
        if path.endswith(relative) and os.path.basename(relative) in files:
            return path
    raise RefsUnavailable(f"{relative} is not in the wheel")


def _method_block(path: str, method: str, first_test: str) -> ast.Module:
    """The `if` statement inside `method` of `path` whose test's source is `first_test`,
    as a module to execute (inline advantage code that is no function of its own)."""
    source = open(path, encoding="utf-8").read()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == method:
            for inner in ast.walk(node):
                if isinstance(inner, ast.If) and ast.get_source_segment(source, inner.test) == first_test:
                    return ast.Module(body=[inner], type_ignores=[])
    raise RefsUnavailable(f"{path}: no `if {first_test}` in {method}")


@lru_cache(maxsize=None)
def load_extra(name: str) -> types.SimpleNamespace:
    """The reference code of one of EXTRA_WHEELS; RefsUnavailable (the reason) where it
    cannot be had."""
    try:
        src = _extra_unpacked(name)
        return _LOADERS[name](src)
    except RefsUnavailable:
        raise
    except Exception as e:  # noqa: BLE001
        raise RefsUnavailable(f"could not import {name}'s reference code: {type(e).__name__}: {e}") from e


def _load_trl(src: str) -> types.SimpleNamespace:
    import torch

    utils = _extract(_find(src, "trl/trainer/utils.py"), {"nanstd"}, {"torch": torch, "__name__": "_ref_trl_utils"})
    path = _find(src, "trl/trainer/grpo_trainer.py")
    block = compile(_method_block(path, "_generate_and_score_completions", 'self.multi_objective_aggregation == "sum_then_normalize"'), path, "exec")

    def advantages(rewards_per_func, weights, num_generations: int, scale_rewards: str, aggregation: str):
        """TRL GRPOTrainer's own lines: (B, K) rewards (NaN: the function abstained) ->
        (B,) advantages, NaN rows zeroed as the trainer does next."""
        me = types.SimpleNamespace(
            multi_objective_aggregation=aggregation, scale_rewards=scale_rewards,
            reward_weights=torch.as_tensor(weights, dtype=rewards_per_func.dtype), reward_funcs=[None] * rewards_per_func.shape[1],
        )
        ns = {"self": me, "torch": torch, "nanstd": utils["nanstd"], "rewards_per_func": rewards_per_func,
              "num_generations": num_generations, "device": rewards_per_func.device,
              "unscorable_mask": torch.isnan(rewards_per_func).all(dim=1)}
        exec(block, ns)
        return torch.nan_to_num(ns["advantages"], nan=0.0)

    return types.SimpleNamespace(nanstd=utils["nanstd"], advantages=advantages)


def _load_openrlhf(src: str) -> types.SimpleNamespace:
    import torch

    path = _find(src, "openrlhf/trainer/ppo_utils/experience_maker.py")
    block = compile(_method_block(path, "compute_advantages_and_returns", 'args.algo.advantage.estimator == "rloo"'), path, "exec")

    def shaped(rewards, estimator: str, n_samples: int):
        """OpenRLHF's baseline step: (prompts * n_samples,) rewards -> the same, shaped."""
        args = types.SimpleNamespace(
            algo=types.SimpleNamespace(advantage=types.SimpleNamespace(estimator=estimator)),
            rollout=types.SimpleNamespace(n_samples_per_prompt=n_samples),
        )
        ns = {"args": args, "torch": torch, "rewards": rewards.reshape(-1, n_samples)}
        exec(block, ns)
        return ns["rewards"].reshape(-1)

    return types.SimpleNamespace(shaped=shaped)


def _load_skyrl(src: str) -> types.SimpleNamespace:
    from collections import defaultdict

    import numpy as np
    import torch

    ns = {
        "torch": torch, "np": np, "defaultdict": defaultdict, "Optional": Any, "Float": Any, "__name__": "_ref_skyrl_ppo_utils",
        "register_advantage_estimator": lambda name: (lambda fn: fn),
        "AdvantageEstimator": types.SimpleNamespace(MAXRL="maxrl", GRPO="grpo", RLOO="rloo"),
    }
    path = _find(src, "skyrl/backends/skyrl_train/utils/ppo_utils.py")
    out = _extract(path, {"compute_maxrl_advantage", "compute_grpo_outcome_advantage"}, ns)
    utils = _extract(
        _find(src, "skyrl/train/utils/trainer_utils.py"), {"zero_variance_filter"},
        {"defaultdict": defaultdict, "List": list, "Optional": Any, "__name__": "_ref_skyrl_trainer_utils"},
    )
    return types.SimpleNamespace(compute_maxrl_advantage=out["compute_maxrl_advantage"],
                                 compute_grpo_outcome_advantage=out["compute_grpo_outcome_advantage"],
                                 zero_variance_filter=utils["zero_variance_filter"])


def _load_areal(src: str) -> types.SimpleNamespace:
    import numpy as np
    import torch
    import torch.distributed as dist

    ns = {"torch": torch, "np": np, "dist": dist, "NormConfig": Any, "__name__": "_ref_areal_data"}
    out = _extract(_find(src, "areal/utils/data.py"), {"Normalization"}, ns)

    def config(**kw):
        base = dict(mean_level="batch", mean_leave1out=False, std_level="batch", std_unbiased=True, eps=1e-5, group_size=1)
        return types.SimpleNamespace(**{**base, **kw})

    return types.SimpleNamespace(Normalization=out["Normalization"], NormConfig=config)


_LOADERS = {"trl": _load_trl, "openrlhf": _load_openrlhf, "skyrl": _load_skyrl, "areal": _load_areal}


@pytest.fixture(scope="module")
def ref() -> types.SimpleNamespace:
    """A test's fixture (`from refs import ref`): load(), or a skip with the reason."""
    try:
        return load()
    except RefsUnavailable as e:
        pytest.skip(str(e))
