"""Before/after: every output file byte-identical over a matrix of strategies and options.

    .venv/bin/python benchmarks/identical.py                                  # HEAD vs the working tree
    .venv/bin/python benchmarks/identical.py --before 5be73bd --after 4d6d4b7 # issue 14's restructure
    .venv/bin/python benchmarks/identical.py --before 4d6d4b7 --values        # same values, new encoder
    .venv/bin/python benchmarks/identical.py --before main --after HEAD --cases grpo,polaris_kept
    .venv/bin/python benchmarks/identical.py --list                           # the cases

Each revision is checked out with `git worktree add --detach` under a temporary directory (the
working tree is used as it is for the default `--after`), removed at the end. The inputs are
generated once, here, and shared by both sides: single-step experience (2,000 rows + 2 bad ones,
3 files of mixed schemas, row groups of 250) with every optional column a strategy can read,
multi-step experience (string task ids, runs of 1-5 steps), and single-step experience with the
token statistics (behaviour and reference log-probs, sum_pi_squared, entropy) and a task-stats
table that the off-policy, token-baseline, KL and history cases read. Each side runs every case with its own
code: one Python process per side and job (`--jobs`, default 2), started with that revision's
tree as its working directory and PYTHONPATH and this interpreter, calls the CLI's entry point
`rescore.pipelines.cli.main(argv)` (before the split: `rescore.pipelines.rescore.main`) once per case (`--processes`: a `python -m rescore`
process per case instead, slower by the imports). Both sides write each case to the SAME output
path, one side after the other, so no path differs by nature.

Compared per case: the exit status, the set of output files, and every file byte for byte
(Parquet, `_rescore_files.json`, `_SUCCESS`, `metrics.json`, `rejected-*`, `filtered-*`). For a
case failing on both sides the `rescore: error:` line is compared too, and `_staging/` is left
out (it holds whatever parallel work finished before the failure). Nothing is excluded by default:
metrics.json holds no timings, dates or host names, and both sides use the same input and output
paths (`--ignore-key totals.some_key` drops a dotted metrics.json key from the comparison, should
a later revision add one that differs by nature). Not in the matrix: `--incremental` (Delta Lake
logs carry commit timestamps), a buffer written with --output-db and the model sources. The
`door_*` cases read a Trinity SQLite buffer and verl dumps that the working tree's `rescore
sample --format` writes (both sides read the same files).

Prints a table (case, files, identical/DIFF and the first differing file); exit 1 on any DIFF.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEFORE = "HEAD"

POLARIS = "reward_variance,grpo,duplicate_informative"

# name -> (input data, arguments after --input/--output)
CASES: dict[str, tuple[str, list[str]]] = {
    # every advantage strategy on the data it needs
    "grpo": ("one", ["--strategy", "grpo"]),
    "grpo_batch_std": ("one", ["--strategy", "grpo", "--set", "std_cal_level=batch"]),
    "grpo_std_threshold": ("one", ["--strategy", "grpo", "--set", "std_threshold=0"]),
    "correct_bias": ("one", ["--strategy", "correct_bias", "--set", "rank_penalty=0.2"]),
    "opmd": ("one", ["--strategy", "opmd"]),
    "opmd_logavgexp": ("one", ["--strategy", "opmd", "--set", "opmd_baseline=logavgexp", "--set", "tau=0.5"]),
    "asymre": ("one", ["--strategy", "asymre"]),
    "dr_grpo": ("one", ["--strategy", "dr_grpo"]),
    "rloo": ("one", ["--strategy", "rloo"]),
    "rloo_normalized": ("one", ["--strategy", "rloo", "--set", "normalize_advantages=true"]),
    "reinforce_plus_plus_baseline": ("one", ["--strategy", "reinforce_plus_plus_baseline"]),
    "reinforceplusplus": ("one", ["--strategy", "reinforceplusplus", "--set", "gamma=0.99"]),
    "reinforce_plus_plus": ("one", ["--strategy", "reinforce_plus_plus"]),
    "reinforce": ("one", ["--strategy", "reinforce"]),
    "raft": ("one", ["--strategy", "raft"]),
    "constant": ("one", ["--strategy", "constant", "--set", "weight=0.5"]),
    "mix_chord": ("one", ["--strategy", "mix_chord"]),
    "on_policy_distill": ("one", ["--strategy", "on_policy_distill"]),
    "jsd": ("one", ["--strategy", "jsd"]),
    "rec": ("one", ["--strategy", "rec", "--set", "std_normalize=true"]),
    "remax": ("one", ["--strategy", "remax"]),
    "opo": ("one", ["--strategy", "opo"]),
    "grpo_passk": ("one", ["--strategy", "grpo_passk"]),
    "gpg": ("one", ["--strategy", "gpg"]),
    "gdpo": ("one", ["--strategy", "gdpo", "--set", 'gdpo_reward_keys=["acc","format"]']),
    "step_wise_grpo": ("steps", ["--strategy", "step_wise_grpo"]),
    "step_wise_grpo_norm": ("steps", ["--strategy", "step_wise_grpo", "--set", "enable_step_norm=true"]),
    "gigpo": ("steps", ["--strategy", "gigpo"]),
    "gigpo_std": ("steps", ["--strategy", "gigpo", "--set", "fnorm=std", "--set", "gamma=0.9"]),
    "grpo_steps": ("steps", ["--strategy", "grpo"]),
    "reinforce_plus_plus_steps": ("steps", ["--strategy", "reinforce_plus_plus"]),
    # filters
    "reward_variance": ("one", ["--strategy", "reward_variance,grpo"]),
    "filter_groups": ("one", ["--strategy", "filter_groups,grpo"]),
    "dynamic_filtering": ("one", ["--strategy", "dynamic_filtering,rloo"]),
    "mask_truncated": ("one", ["--strategy", "mask_response_truncated,reinforceplusplus"]),
    "mask_truncated_drop": ("one", ["--strategy", "mask_response_truncated,grpo", "--set", "drop=true", "--keep-filtered"]),
    # duplication (POLARIS)
    "polaris": ("one", ["--strategy", POLARIS]),
    "polaris_seed": ("one", ["--strategy", POLARIS, "--set", "duplicate_informative.seed=1"]),
    "polaris_kept": ("one", ["--strategy", POLARIS, "--keep-filtered"]),
    "grpo_duplicate": ("one", ["--strategy", "grpo,duplicate_informative"]),
    "polaris_steps": ("steps", ["--strategy", "reward_variance,step_wise_grpo,duplicate_informative", "--keep-filtered"]),
    # output options
    "audit_grpo": ("one", ["--strategy", "grpo", "--audit-columns"]),
    "audit_polaris_kept": ("one", ["--strategy", POLARIS, "--audit-columns", "--keep-filtered"]),
    "audit_rloo": ("one", ["--strategy", "rloo", "--audit-columns"]),
    "audit_remax": ("one", ["--strategy", "remax", "--audit-columns"]),
    "audit_step_wise": ("steps", ["--strategy", "step_wise_grpo", "--audit-columns"]),
    # I/O and shuffle options: the output is the same for any of them
    "io_threads_1": ("one", ["--strategy", "grpo", "--io-threads", "1"]),
    "io_threads_3": ("one", ["--strategy", POLARIS, "--io-threads", "3"]),
    "shard_rows_300": ("one", ["--strategy", "grpo", "--shard-rows", "300"]),
    "shard_rows_polaris": ("one", ["--strategy", POLARIS, "--shard-rows", "300", "--io-threads", "1", "--keep-filtered"]),
    "shard_rows_steps": ("steps", ["--strategy", "step_wise_grpo", "--shard-rows", "200"]),
    "buckets_3": ("one", ["--strategy", "grpo", "--buckets", "3"]),
    # Trinity-RFT algorithm presets
    "algorithm_dapo": ("one", ["--algorithm", "dapo"]),
    "algorithm_opmd": ("one", ["--algorithm", "opmd"]),
    "algorithm_grpo_verl": ("one", ["--algorithm", "grpo_verl"]),
    "algorithm_multi_step_grpo": ("steps", ["--algorithm", "multi_step_grpo", "--set", "enable_step_norm=true"]),
    # what a stage computes where the row is read (issue 41's features): off-policy corrections
    # (verl, TRL, SkyRL, OpenRLHF), the token-statistics estimators after them, the n-gram
    # ratio, the KL sums (with REINFORCE++'s discount), a task's history, optional and nullable
    # columns; on single-step data with every token column these read
    "offpolicy_verl": ("tokens", ["--strategy", "decoupled_seq_is_rs,grpo", "--audit-columns"]),
    "offpolicy_verl_normalize": ("tokens", ["--strategy", "rollout_correction,grpo", "--set", "rollout_is=token",
                                            "--set", "rollout_is_batch_normalize=true"]),
    "offpolicy_trl": ("tokens", ["--strategy", "trl_token_mask,grpo"]),
    "offpolicy_skyrl": ("tokens", ["--strategy", "skyrl_geometric_mask,grpo"]),
    "offpolicy_openrlhf": ("tokens", ["--strategy", "rollout_correction,grpo", "--set", "is_correction_level=seq",
                                      "--set", "is_correction_threshold=[0.9,1.1]"]),
    "token_baseline": ("tokens", ["--strategy", "optimal_token_baseline"]),
    "token_baseline_tir": ("tokens", ["--strategy", "tir_optimal_token_baseline"]),
    "token_baseline_corrected": ("tokens", ["--strategy", "decoupled_token_is,optimal_token_baseline"]),
    "clipb": ("tokens", ["--strategy", "clipb"]),
    "clipb_corrected": ("tokens", ["--strategy", "skyrl_geometric_mask,clipb"]),
    "repetition": ("tokens", ["--strategy", "ngram_repetition_filter,grpo", "--set", "rep_len=2", "--set", "max_ratio=0.05"]),
    "kl_penalty": ("tokens", ["--strategy", "kl_penalty,grpo", "--set", "kl_coef=0.1"]),
    "kl_penalty_discounted": ("tokens", ["--strategy", "kl_penalty,reinforce_plus_plus", "--set", "kl_penalty=k3",
                                         "--set", "reinforce_plus_plus.gamma=0.9"]),
    "task_history": ("tokens", ["--strategy", "pass_rate_band,grpo", "--set", "task_stats={data}/history",
                                "--set", "lo=0.1", "--set", "hi=0.9", "--set", "unseen=drop"]),
    "normalize_then_sum": ("tokens", ["--strategy", "normalize_then_sum", "--set", 'reward_keys=["acc","format"]']),
    # refused: the same exit status and error line
    "unknown_strategy": ("one", ["--strategy", "grpoo"]),
    "missing_column": ("steps", ["--strategy", "mix_chord"]),
    # the doors (pipelines/doors/): a Trinity SQLite buffer and verl dumps, staged, then the job
    "door_sqlite": ("sqlite", ["--input-table", "experience", "--algorithm", "grpo"]),
    "door_sqlite_ranges": ("sqlite", ["--input-table", "experience", "--strategy", POLARIS, "--shard-rows", "100",
                                      "--keep-filtered"]),
    "door_verl": ("verl", ["--input-format", "verl-rollouts", "--strategy", "grpo"]),
    "door_url_without_table": ("sqlite", ["--strategy", "grpo"]),
    "door_verl_output_db": ("verl", ["--input-format", "verl-rollouts", "--strategy", "grpo", "--output-db",
                                     "sqlite:///never-written.db", "--output-table", "scored"]),
}
# the estimators declared as one function (function_estimator.py): their audit baselines too
for _n, _s in {"opmd": "opmd", "opmd_logavgexp": "opmd --set opmd_baseline=logavgexp", "asymre": "asymre", "reinforce": "reinforce", "constant": "constant",
               "opo": "opo", "grpo_passk": "grpo_passk --set norm_adv_by_std_in_grpo=false", "dr_grpo": "dr_grpo", "maxrl": "maxrl"}.items():
    CASES[f"audit_{_n}"] = ("one", ["--strategy", *_s.split(), "--audit-columns"])
DOOR_SAMPLES = {"sqlite": "trinity-sql", "verl": "verl-rollouts"}
"""Door inputs: `rescore sample --format FORMAT` of the working tree writes them (512 rows)."""


# ---------------------------------------------------------------- inputs


def _tokens(rng, n):
    """prompt_length, tokens, logprobs, teacher_logprobs, action_mask for n rows (short lists)."""
    prompt = rng.integers(3, 9, n)
    response = rng.integers(4, 21, n)
    tokens = [rng.integers(0, 32_000, p + r).astype(np.int32) for p, r in zip(prompt, response)]
    logprobs = [(-rng.random(r) * 3).astype(np.float32) for r in response]
    teacher = [(-rng.random(r) * 3).astype(np.float32) for r in response]
    mask = [(rng.random(r) > 0.1).astype(np.int8) for r in response]
    return prompt, tokens, logprobs, teacher, mask


def _write(table: pa.Table, directory: str, files: int, row_group_rows: int) -> None:
    os.makedirs(directory, exist_ok=True)
    bounds = np.linspace(0, table.num_rows, files + 1).astype(int)
    for i in range(files):
        part = table.slice(bounds[i], bounds[i + 1] - bounds[i])
        if i == files - 1:  # one file with narrower integers and without the pass-through column
            part = part.drop_columns(["note"])
            part = part.set_column(part.schema.get_field_index("run"), "run", part.column("run").cast(pa.int32()))
        pq.write_table(part, os.path.join(directory, f"experience-{i:03d}.parquet"), row_group_size=row_group_rows)


def one_step(directory: str, seed: int = 0) -> None:
    """5 batches x 50 tasks x 8 runs, shuffled over 3 files, and 2 bad rows."""
    rng = np.random.default_rng(seed)
    b, t, r = (a.ravel() for a in np.meshgrid(np.arange(5), np.arange(50), np.arange(8), indexing="ij"))
    n = len(b)
    reward = rng.choice([0.0, 0.25, 0.5, 1.0], n)
    reward = np.where(t % 5 == 0, 0.5, reward)  # a fifth of the groups: no spread
    prompt, tokens, logprobs, teacher, mask = _tokens(rng, n)
    status = rng.choice(["none", "response_truncated", None], n, p=[0.85, 0.1, 0.05])
    table = pa.table({
        "batch": b, "task": t, "run": r, "step": np.zeros(n, np.int64), "reward": reward,
        "tokens": tokens, "prompt_length": prompt, "logprobs": logprobs, "action_mask": mask,
        "teacher_logprobs": teacher, "expert": (r == 0) & (t % 3 == 0),
        "acc": np.where(t % 7 == 0, 1, (reward >= 0.5).astype(np.int64)),
        "format": rng.random(n), "reward_baselines": rng.choice([0.0, 0.5, 1.0], n),
        "truncate_status": pa.array(status, pa.string()), "note": [f"row {i}" for i in range(n)],
    })
    table = table.take(rng.permutation(n))
    # at the end (the last file): a copy of the first row's id (both copies are rejected) and a
    # NaN reward under a new id. Not a file of bad rows alone: at 5be73bd a read unit whose rows
    # are all rejected fails with --audit-columns ('Field "group_size" does not exist').
    bad = table.slice(0, 2)
    bad = bad.set_column(bad.schema.get_field_index("reward"), "reward", pa.array([0.5, float("nan")]))
    bad = bad.set_column(0, "batch", pa.array([table.column("batch")[0].as_py(), 9]))
    _write(pa.concat_tables([table, bad]), directory, 3, 250)


def with_token_stats(directory: str, history: str, seed: int = 2) -> None:
    """one_step's shape (5 batches x 50 tasks x 8 runs, 3 files) with the token columns the
    off-policy corrections and the token-statistics estimators read (behaviour and reference
    log-probs, sum_pi_squared, entropy), a few repeated n-grams, null `format` values, and a
    `rescore task-stats` table at `history` that holds 40 of the 50 tasks."""
    rng = np.random.default_rng(seed)
    b, t, r = (a.ravel() for a in np.meshgrid(np.arange(5), np.arange(50), np.arange(8), indexing="ij"))
    n = len(b)
    reward = rng.choice([0.0, 0.25, 0.5, 1.0], n)
    prompt, tokens, logprobs, _, mask = _tokens(rng, n)
    tokens = [np.where(rng.random(len(x)) < 0.3, 7, x).astype(np.int32) for x in tokens]  # some n-grams repeat

    def near(lp, scale):
        return [np.minimum(x + (rng.standard_normal(len(x)) * scale).astype(np.float32), 0.0).astype(np.float32) for x in lp]

    behaviour = near(logprobs, 0.2)
    behaviour[::97] = near(logprobs[::97], 3.0)  # a few rows far off-policy (masks empty them)
    table = pa.table({
        "batch": b, "task": t, "run": r, "step": np.zeros(n, np.int64), "reward": reward,
        "tokens": tokens, "prompt_length": prompt, "logprobs": logprobs, "action_mask": mask,
        "logprobs_original": behaviour, "ref_logprobs": near(logprobs, 0.1),
        "sum_pi_squared": [rng.random(len(x)).astype(np.float32) * 0.5 for x in logprobs],
        "entropy": [rng.random(len(x)).astype(np.float32) * 2.0 for x in logprobs],
        "acc": (reward >= 0.5).astype(np.int64), "format": pa.array(np.where(rng.random(n) < 0.05, np.nan, rng.random(n)), from_pandas=True),
        "note": [f"row {i}" for i in range(n)],
    })
    _write(table.take(rng.permutation(n)), directory, 3, 250)
    os.makedirs(history, exist_ok=True)
    pq.write_table(pa.table({"task": np.arange(40, dtype=np.int64), "pass_rate": rng.random(40)}), os.path.join(history, "task_stats.parquet"))


def multi_step(directory: str, seed: int = 1) -> None:
    """3 batches x 20 string tasks x 6 runs x 1-5 steps, shuffled over 3 files."""
    rng = np.random.default_rng(seed)
    rows = []
    for batch in range(3):
        for task in range(20):
            for run in range(6):
                for step in range(int(rng.integers(1, 6))):
                    rows.append((batch, f"task-{task:02d}", run, step))
    b, t, r, s = (np.array(c) for c in zip(*rows))
    n = len(rows)
    prompt, tokens, logprobs, teacher, mask = _tokens(rng, n)
    state = rng.choice(["s0", "s1", "s2", "s3", None], n)
    step_reward = pa.array(np.where(rng.random(n) < 0.2, np.nan, rng.random(n)), from_pandas=True)
    table = pa.table({
        "batch": b.astype(np.int64), "task": t.astype(str), "run": r.astype(np.int64), "step": s.astype(np.int64),
        "reward": np.where(np.char.endswith(t.astype(str), "5"), 1.0, rng.choice([0.0, 0.5, 1.0], n)),
        "tokens": tokens, "prompt_length": prompt, "logprobs": logprobs, "action_mask": mask,
        "env_state_hash": pa.array(state, pa.string()), "step_reward": step_reward, "note": [f"row {i}" for i in range(n)],
    })
    _write(table.take(rng.permutation(n)), directory, 3, 200)


# ---------------------------------------------------------------- running one side

_DRIVER = r"""
import contextlib, io, json, os, sys
import rescore
here = os.path.realpath(os.getcwd())
if not os.path.realpath(rescore.__file__).startswith(here + os.sep):
    sys.exit(f"identical.py: imported {rescore.__file__}, not the tree under test {here}")
import inspect
from rescore.pipelines import cli
if "argv" in inspect.signature(cli.main).parameters:
    main = cli.main  # the command's entry point, pipelines/cli.py
else:  # a revision before the job and the command line were split
    from rescore.pipelines.rescore import main
cases = json.loads(sys.argv[1])
results = {}
for name, argv in cases:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
    results[name] = {"exit": code, "stderr": err.getvalue()}
print(json.dumps(results))
"""


def door_sample(which: str, path: str) -> None:
    """The sample experience as the door `which` reads it (DOOR_SAMPLES), written by the working tree."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    subprocess.run([sys.executable, "-m", "rescore", "sample", "--format", DOOR_SAMPLES[which], "--output", path],
                   cwd=ROOT, env=env, check=True, capture_output=True)


def _input(which: str, data: dict[str, str]) -> str:
    if which == "sqlite":
        return f"sqlite:///{data[which]}"
    if which == "verl":
        return data[which]  # a dump directory
    return os.path.join(data[which], "*.parquet")


def _argv(name: str, data: dict[str, str], out: str) -> list[str]:
    which, args = CASES[name]
    args = [a.replace("{data}", os.path.dirname(data[which])) for a in args]
    return ["--input", _input(which, data), "--output", os.path.join(out, name), "--quiet", *args]


def run_side(tree: str, names: list[str], data: dict[str, str], out: str, jobs: int, processes: bool) -> dict:
    """Every case with the code in `tree`; {case: {"exit", "stderr"}}."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RESCORE_FAULT", "RESCORE_TEST_INJECT_FAULT")}
    # The tree's own code, whichever checkout the interpreter's environment has installed
    # (tools/checkout_site: `rescore.*` mapped to the tree's folders, in every child process too)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "tools", "checkout_site"), tree])
    env["RESCORE_CHECKOUT"] = tree
    if processes:
        results = {}
        for name in names:
            proc = subprocess.run([sys.executable, "-m", "rescore", *_argv(name, data, out)], cwd=tree, env=env,
                                  capture_output=True, text=True)
            results[name] = {"exit": proc.returncode, "stderr": proc.stderr}
        return results
    chunks = [names[i::jobs] for i in range(jobs) if names[i::jobs]]
    procs = [subprocess.Popen([sys.executable, "-c", _DRIVER, json.dumps([(n, _argv(n, data, out)) for n in chunk])],
                              cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for chunk in chunks]
    results = {}
    for proc in procs:
        stdout, stderr = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"identical.py: the driver in {tree} failed:\n{stderr[-3000:]}")
        results.update(json.loads(stdout.splitlines()[-1]))
    return results


# ---------------------------------------------------------------- comparing


def _files(directory: str) -> list[str]:
    found = []
    for base, _, names in os.walk(directory):
        found += [os.path.relpath(os.path.join(base, n), directory) for n in names]
    return sorted(found)


def _drop(doc, dotted: str) -> None:
    head, _, rest = dotted.partition(".")
    items = doc if isinstance(doc, list) else [doc]
    for item in items:
        if isinstance(item, dict) and head in item:
            if rest:
                _drop(item[head], rest)
            else:
                del item[head]
        elif isinstance(item, dict) and head == "*":
            for value in item.values():
                _drop(value, rest)


def _nan_free(value):
    """A decoded value with NaN turned into a marker, so that NaN equals NaN (rejected rows keep
    the NaN reward they were rejected for)."""
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, list):
        return [_nan_free(v) for v in value]
    if isinstance(value, dict):
        return {k: _nan_free(v) for k, v in value.items()}
    return value


def _same_values(a: str, b: str) -> bool:
    """Two Parquet files hold the same Arrow schema (field and file metadata included) and the
    same values, whatever the encoder, codec or chunking."""
    ta, tb = pq.read_table(a), pq.read_table(b)
    if not ta.schema.equals(tb.schema, check_metadata=True) or ta.num_rows != tb.num_rows:
        return False
    for name in ta.column_names:
        x, y = ta[name].combine_chunks(), tb[name].combine_chunks()
        if not x.equals(y) and _nan_free(x.to_pylist()) != _nan_free(y.to_pylist()):
            return False
    return True


def _same(a: str, b: str, ignore: list[str], values: bool = False) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        da, db = fa.read(), fb.read()
    if da == db:
        return True
    if values and a.endswith(".parquet"):
        return _same_values(a, b)
    if ignore and os.path.basename(a) == "metrics.json":
        ja, jb = json.loads(da), json.loads(db)
        for key in ignore:
            _drop(ja, key)
            _drop(jb, key)
            for entry in (ja.get("batches") or []) + (jb.get("batches") or []):  # per-batch copies of totals keys
                _drop(entry, key.removeprefix("totals."))
        return ja == jb
    return False


def _error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("rescore: error:")]
    return lines[-1] if lines else ""


def compare(name: str, before_dir: str, after_dir: str, before: dict, after: dict, ignore: list[str], values: bool = False) -> tuple[int, str]:
    """(number of files, "" when identical else what differs first)."""
    a, b = os.path.join(before_dir, name), os.path.join(after_dir, name)
    fa, fb = (_files(a) if os.path.isdir(a) else []), (_files(b) if os.path.isdir(b) else [])
    if before["exit"] != after["exit"]:
        return len(fa), f"exit {before['exit']} vs {after['exit']}: {_error_line(after['stderr']) or _error_line(before['stderr'])}"
    if before["exit"] and _error_line(before["stderr"]) != _error_line(after["stderr"]):
        return len(fa), f"error line: {_error_line(before['stderr'])!r} vs {_error_line(after['stderr'])!r}"
    if before["exit"]:  # a failed run's _staging holds whatever parallel work finished first
        fa, fb = ([f for f in files if not f.startswith("_staging" + os.sep)] for files in (fa, fb))
    if fa != fb:
        only = sorted(set(fa) ^ set(fb))
        return len(fa), f"file sets differ: {only[0]}" + (f" (+{len(only) - 1})" if len(only) > 1 else "")
    for rel in fa:
        if not _same(os.path.join(a, rel), os.path.join(b, rel), ignore, values):
            return len(fa), rel
    return len(fa), ""


# ---------------------------------------------------------------- main


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default=BEFORE, help=f"git revision (default {BEFORE})")
    ap.add_argument("--after", default=None, help="git revision (default: the working tree, as it is)")
    ap.add_argument("--cases", default=None, help="comma-separated case names (default: all; --list)")
    ap.add_argument("--jobs", type=int, default=2, help="processes per side (default 2)")
    ap.add_argument("--processes", action="store_true", help="a `python -m rescore` process per case")
    ap.add_argument("--ignore-key", action="append", default=[], metavar="DOTTED",
                    help="a metrics.json key not to compare (e.g. totals.some_timing); repeatable")
    ap.add_argument("--values", action="store_true",
                    help="Parquet files may differ in bytes if their Arrow schema (with metadata) and every "
                         "value are the same: for a deliberate encoder or codec change (docs/output.md)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (its path is printed)")
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    args = ap.parse_args(argv)
    if args.list:
        for name, (which, case_args) in CASES.items():
            print(f"{name:32} {which:6} {' '.join(case_args)}")
        return 0
    names = args.cases.split(",") if args.cases else list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"identical.py: unknown case(s) {', '.join(unknown)} (see --list)", file=sys.stderr)
        return 2

    tmp = tempfile.mkdtemp(prefix="rescore-identical-")
    trees: list[str] = []
    started = time.monotonic()
    try:
        def tree(rev: str | None) -> str:
            if rev is None:
                return ROOT
            path = os.path.join(tmp, f"tree-{len(trees)}")
            _git("worktree", "add", "--detach", "--quiet", path, _git("rev-parse", "--verify", rev + "^{commit}"))
            trees.append(path)
            return path

        before_tree, after_tree = tree(args.before), tree(args.after)
        data = {k: os.path.join(tmp, "data", k) for k in ("one", "steps", "tokens")}
        if any(CASES[n][0] == "one" for n in names):
            one_step(data["one"])
        if any(CASES[n][0] == "tokens" for n in names):
            with_token_stats(data["tokens"], os.path.join(tmp, "data", "history"))
        if any(CASES[n][0] == "steps" for n in names):
            multi_step(data["steps"])
        data.update(sqlite=os.path.join(tmp, "data", "buffer.db"), verl=os.path.join(tmp, "data", "verl"))
        for which in DOOR_SAMPLES:
            if any(CASES[n][0] == which for n in names):
                door_sample(which, data[which])
        out = os.path.join(tmp, "out")  # both sides write here, one after the other
        sides = {}
        for side, where in (("before", before_tree), ("after", after_tree)):
            sides[side] = run_side(where, names, data, out, max(1, args.jobs), args.processes)
            os.rename(out, os.path.join(tmp, side)) if os.path.isdir(out) else os.makedirs(os.path.join(tmp, side))

        after_label = args.after or "working tree"
        print(f"before {args.before} ({_git('rev-parse', '--short', args.before)}) vs after {after_label}; "
              f"{len(names)} cases in {time.monotonic() - started:.0f} s")
        print(f"{'case':32} {'files':>5}  result")
        diffs = 0
        for name in names:
            files, what = compare(name, os.path.join(tmp, "before"), os.path.join(tmp, "after"),
                                  sides["before"][name], sides["after"][name], args.ignore_key, args.values)
            code = sides["before"][name]["exit"]
            note = f" (exit {code} on both sides)" if code else ""
            print(f"{name:32} {files:5}  {'DIFF ' + what if what else 'identical' + note}")
            diffs += bool(what)
        print(f"{len(names) - diffs} identical, {diffs} differ" + (f"; outputs kept in {tmp}" if args.keep else ""))
        return 1 if diffs else 0
    finally:
        for path in trees:
            subprocess.run(["git", "worktree", "remove", "--force", path], cwd=ROOT, capture_output=True)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
