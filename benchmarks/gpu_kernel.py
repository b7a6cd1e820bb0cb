"""Scoring kernel benchmark: the torch math of one bucket, on the CPU and (when present) a GPU.

    python benchmarks/gpu_kernel.py [--groups 65536] [--rows-per-group 8] [--device cpu cuda]

Measures, per device, the median over --repeats of
  - score: the GRPO scoring plan over all groups (segment reductions, per-row broadcast);
  - broadcast: the token-level `score * action_mask` over flat token arrays (200-312 tokens per
    row, as in the end-to-end benchmark).
Reports groups/s for the scoring, and the token broadcast's effective bandwidth: bytes it must
move (int8 mask in, float32 advantages out, the per-row values and lengths) over its time. On a
GPU it also reports that as a fraction of the device's peak memory bandwidth (--peak-gbps, or a
table of known GPUs). Host<->device copies are timed separately ("transfer").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rescore.transforms.strategies import GroupedRows, chain_of  # noqa: E402
from rescore.transforms.strategies.tokens import token_advantages  # noqa: E402

PEAK_GBPS = {"H100": 3350.0, "H200": 4800.0, "A100": 2039.0, "L4": 300.0, "A10G": 600.0, "T4": 320.0}


def synthetic(groups: int, rows_per_group: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    n = groups * rows_per_group
    lengths = rng.integers(200, 313, n)
    return {
        "reward": rng.random(n),
        "offsets": np.arange(0, n + 1, rows_per_group, dtype=np.int64),
        "batch": np.repeat(np.arange(groups, dtype=np.int64) // 64, rows_per_group),
        "run": np.tile(np.arange(rows_per_group, dtype=np.int64), groups),
        "lengths": lengths.astype(np.int64),
        "mask": (rng.random(int(lengths.sum())) > 0.1).astype(np.int8),
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_time(fn, device, repeats: int) -> float:
    fn()  # warm-up (CUDA context, kernels, allocator)
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench(device_name: str, data: dict, repeats: int, peak_gbps: float | None) -> dict:
    device = torch.device(device_name)
    host = {k: torch.from_numpy(v) for k, v in data.items()}

    def upload():
        if device.type == "cpu":
            return dict(host)
        return {k: v.pin_memory().to(device, non_blocking=True) for k, v in host.items()}

    transfer = _median_time(upload, device, repeats)
    t = upload()
    n = int(t["reward"].shape[0])
    rows = GroupedRows(
        reward=t["reward"], offsets=t["offsets"], batch=t["batch"], run=t["run"],
        step=torch.zeros_like(t["run"]), action_tokens=t["lengths"],
    )
    plan = chain_of("grpo")
    with torch.no_grad():
        score_s = _median_time(lambda: plan.score(rows), device, repeats)
        value = plan.score(rows).score
        broadcast_s = _median_time(lambda: token_advantages(value, t["lengths"], t["mask"]), device, repeats)
    tokens = int(data["mask"].shape[0])
    moved = tokens * (1 + 4) + n * (8 + 8)
    out = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "groups": int(data["offsets"].shape[0] - 1),
        "rows": n,
        "tokens": tokens,
        "score_s": round(score_s, 6),
        "groups_per_s": round((data["offsets"].shape[0] - 1) / score_s),
        "broadcast_s": round(broadcast_s, 6),
        "broadcast_gbps": round(moved / broadcast_s / 1e9, 2),
        "transfer_s": round(transfer, 6),
    }
    if device.type == "cuda":
        peak = peak_gbps or next((v for k, v in PEAK_GBPS.items() if k in out["device"]), None)
        if peak:
            out["peak_gbps"] = peak
            out["broadcast_fraction_of_peak"] = round(out["broadcast_gbps"] / peak, 3)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=65536)
    ap.add_argument("--rows-per-group", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", nargs="+", default=["cpu", "cuda"])
    ap.add_argument("--peak-gbps", type=float, help="the GPU's peak memory bandwidth, if not in the table")
    args = ap.parse_args(argv)
    data = synthetic(args.groups, args.rows_per_group)
    for name in args.device:
        if name == "cuda" and not torch.cuda.is_available():
            print(json.dumps({"device": "cuda", "skipped": "no CUDA device"}))
            continue
        print(json.dumps(bench(name, data, args.repeats, args.peak_gbps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
