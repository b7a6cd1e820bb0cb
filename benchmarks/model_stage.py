"""Model stage benchmark: tokens/s of Rescore's teacher-log-prob stage (ComputeModelColumns on
Beam RunInference) against a plain transformers loop over the same rows and batch size.

    python benchmarks/model_stage.py [--rows 256] [--batch-size 16] [--hidden 256] [--layers 4]
                                     [--device cpu|cuda] [--dtype auto] [--repeats 2] [--model DIR]
                                     [--chain decoupled_geo_rs,grpo]

Builds a random-weight Llama causal LM from a config (nothing downloaded; or --model DIR) and
deterministic rows (prompts of 32-64 tokens, responses of 64-192), written as one Parquet file.
Then, interleaved, --repeats times each (median):
  (a) stage: the Beam pipeline Create(units) | ComputeModelColumns on the in-process runner:
      reading the tokens, RunInference in batches of --batch-size rows, side files written;
  (b) loop:  the same rows in the same length order (the stage sorts each read unit by length),
      batches of --batch-size, `model(input_ids, attention_mask)`, log-softmax gathered at the
      response tokens.
Both take the model already on the device (loading is reported apart) and compute the same
values (checked). Prints one JSON line: tokens/s of each, their ratio (target >= 0.9), the
number of model copies the stage loaded (target 1 per process) and, on a GPU, peak GPU memory.
With --chain STRATEGY, also the whole job over the same rows (their logged log-probs random):
--logprob-model with --entropy --sum-pi-squared, then STRATEGY (a rollout_correction preset and
an advantage), its wall time (model load and Beam start included), tokens/s and peak GPU memory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def build_model(directory: str, *, hidden: int, layers: int, vocab: int, seed: int = 0) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64), num_key_value_heads=max(1, hidden // 128), max_position_embeddings=1024,
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def make_rows(n: int, vocab: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    prompt = rng.integers(32, 65, n)
    response = rng.integers(64, 193, n)
    tokens = [rng.integers(0, vocab, p + r).astype(np.int32) for p, r in zip(prompt, response)]
    return pa.table({
        "batch": np.zeros(n, np.int64), "task": np.arange(n, dtype=np.int64) // 8, "run": np.arange(n, dtype=np.int64) % 8,
        "reward": rng.random(n), "tokens": pa.array([t.tolist() for t in tokens], pa.list_(pa.int32())),
        "prompt_length": prompt.astype(np.int64),
    })


def run_stage(path: str, model_dir: str, work: str, batch_size: int, device: str, dtype: str) -> tuple[float, dict]:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from rescore.transforms import models as model_stage
    from rescore.transforms.settings import StepSettings
    from rescore.transforms.rows.model_columns import ModelOptions
    from rescore.transforms.read import plan_input

    options = ModelOptions(teacher_model=model_dir, batch_size=batch_size, dtype=dtype)
    plan, context = model_stage.plan_with_models(plan_input([path], shard_rows=1 << 20), options, work)
    before = model_stage._Model.loads
    started = time.perf_counter()
    p = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"]))
    _ = p | model_stage.ComputeModelColumns(plan, options, work, StepSettings(device=device), context=context)
    result = p.run()
    result.wait_until_finish()
    seconds = time.perf_counter() - started
    # RunInference's own metric: the time it spent loading the model (the loop's is excluded too).
    load_ms = sum(
        d.committed.sum for d in result.metrics().query()["distributions"] if d.key.metric.name == "load_model_latency_milli_secs"
    ) or sum(c.committed for c in result.metrics().query()["counters"] if c.key.metric.name == "load_model_latency_milli_secs")
    side = pq.read_table(model_stage.side_file(work, 0))
    info = {"copies": model_stage._Model.loads - before, "load_s": load_ms / 1000, "values": side["teacher_logprobs"].to_pylist()}
    return seconds, info


def run_loop(table: pa.Table, model, batch_size: int) -> tuple[float, list]:
    from rescore.transforms.inference import pad

    tokens = [np.asarray(t, dtype=np.int64) for t in table["tokens"].to_pylist()]
    prompt = table["prompt_length"].to_numpy()
    order = np.argsort([len(t) for t in tokens], kind="stable")
    device = next(model.parameters()).device
    out: list = [None] * len(tokens)
    started = time.perf_counter()
    with torch.inference_mode():
        for first in range(0, len(order), batch_size):
            rows = order[first : first + batch_size]
            batch = pad([tokens[i] for i in rows], device=device)
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
            for b, i in enumerate(rows):
                p, n = int(prompt[i]), len(tokens[i])
                logp = torch.log_softmax(logits[b, p - 1 : n - 1].float(), dim=-1)
                out[i] = logp.gather(-1, batch.input_ids[b, p:n, None]).squeeze(-1).cpu().numpy()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started, out


def run_chain(table: pa.Table, model_dir: str, work: str, batch_size: int, device: str, dtype: str, strategy: str) -> tuple[float, dict]:
    """The whole job on the in-process runner: --logprob-model (with --entropy and
    --sum-pi-squared) refreshing logprobs, the logged ones kept as logprobs_original, then
    `strategy` (a correction stage and an advantage). Returns (seconds, metrics.json)."""
    from rescore.pipelines.cli import run

    rng = np.random.default_rng(1)
    lengths = np.array([len(t) for t in table["tokens"].to_pylist()]) - table["prompt_length"].to_numpy()
    logged = pa.array([(-rng.exponential(1.0, n)).tolist() for n in lengths], pa.list_(pa.float32()))
    path = os.path.join(work, "chain-in.parquet")
    os.makedirs(work, exist_ok=True)
    pq.write_table(table.append_column("logprobs", logged), path)
    started = time.perf_counter()
    doc = run([
        "--input", path, "--output", os.path.join(work, "chain-out"), "--runner=FnApiRunner", "--quiet",
        "--strategy", strategy, "--logprob-model", model_dir, "--entropy", "--sum-pi-squared",
        "--model-batch-size", str(batch_size), "--model-dtype", dtype, "--device", device,
    ])
    return time.perf_counter() - started, doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--model", help="a Hugging Face causal LM directory instead of the random one")
    ap.add_argument("--chain", metavar="STRATEGY", help="also time the whole job: --logprob-model (+ --entropy --sum-pi-squared) and STRATEGY, e.g. decoupled_geo_rs,grpo")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"device": "cuda", "skipped": "torch sees no CUDA device"}))
        return 0

    from rescore.transforms import inference

    with tempfile.TemporaryDirectory(prefix="rescore-model-bench-") as tmp:
        model_dir = args.model or build_model(os.path.join(tmp, "model"), hidden=args.hidden, layers=args.layers, vocab=args.vocab)
        table = make_rows(args.rows, args.vocab)
        path = os.path.join(tmp, "rows.parquet")
        pq.write_table(table, path)
        tokens = int(sum(len(t) for t in table["tokens"].to_pylist()))
        device = torch.device(args.device)
        started = time.perf_counter()
        model = inference.load_causal_lm(model_dir, device, inference.torch_dtype(args.dtype, device))
        load_s = time.perf_counter() - started
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        stage_s, stage_load_s, loop_s, copies = [], [], [], []
        for k in range(args.repeats):
            # Warm the stage's own model copy first (Beam keeps it per process, as on a worker).
            seconds, stage = run_stage(path, model_dir, os.path.join(tmp, f"stage-{k}"), args.batch_size, args.device, args.dtype)
            stage_s.append(seconds)
            stage_load_s.append(stage["load_s"])
            copies.append(stage["copies"])
            seconds, loop = run_loop(table, model, args.batch_size)
            loop_s.append(seconds)
        net = [s - load for s, load in zip(stage_s, stage_load_s)]  # the stage's wall time less its model load
        worst = max(float(np.max(np.abs(np.asarray(a) - b))) for a, b in zip(stage["values"], loop))
        result = {
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "dtype": str(inference.torch_dtype(args.dtype, device)).replace("torch.", ""),
            "rows": args.rows, "tokens": tokens, "batch_size": args.batch_size,
            "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
            "model_load_s": round(load_s, 2),
            "stage_s": [round(s, 2) for s in stage_s], "stage_model_load_s": [round(s, 2) for s in stage_load_s],
            "loop_s": [round(s, 2) for s in loop_s],
            "stage_tokens_per_s": round(tokens / statistics.median(net)),
            "loop_tokens_per_s": round(tokens / statistics.median(loop_s)),
            "stage_over_loop": round(statistics.median(loop_s) / statistics.median(net), 3),
            "stage_with_start_over_loop": round(statistics.median(loop_s) / statistics.median(stage_s), 3),
            "stage_model_loads": copies,
            "max_abs_diff": worst,
        }
        if device.type == "cuda":
            result["peak_gpu_mem_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if args.chain:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            seconds, doc = run_chain(table, model_dir, os.path.join(tmp, "chain"), args.batch_size, args.device, args.dtype, args.chain)
            result["chain"] = {
                "strategy": args.chain, "seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds),
                "rows_written": doc["totals"]["rows_written"], "rows_filtered": doc["totals"]["rows_filtered"],
            }
            if device.type == "cuda":
                result["chain"]["peak_gpu_mem_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
