"""`rescore export`: SFT rows and DPO pairs checked one by one against the scored rows (an
independent polars computation), loaded back with `datasets` and TRL's data collators, every
row accounted for, one-line errors that leave an earlier export untouched."""

import json
import os

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batched import run_many

pytestmark = pytest.mark.slow  # ~10 exports and a scoring run in one child: ~1 min


def _experience(d):
    """Groups with ties, an all-equal group, and the same response to a task in two batches."""
    rng = np.random.default_rng(4)
    rows = []
    for batch in range(3):
        for task in range(6):
            prompt = [100 + task, 7, 7]
            for run in range(5):
                reward = float(rng.choice([0.0, 0.5, 1.0]))
                if task == 5:
                    reward = 1.0  # no spread: a tie for dpo
                response = [int(x) for x in rng.integers(1000, 1100, int(rng.integers(2, 6)))]
                if task == 2 and run == 0:
                    response, reward = [1, 2, 3], 9.0  # the same best response in every batch: duplicates
                rows.append({"batch": batch, "task": task, "run": run, "step": 0, "reward": reward,
                             "tokens": prompt + response, "prompt_length": len(prompt)})
    os.makedirs(d)
    t = pa.Table.from_pylist(rows)
    order = np.random.default_rng(1).permutation(t.num_rows)
    t = t.take(order)
    pq.write_table(t.slice(0, 40), os.path.join(d, "a.parquet"))
    pq.write_table(t.slice(40), os.path.join(d, "b.parquet"))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    _experience(str(tmp / "exp"))
    tok = str(tmp / "tokenizer")
    transformers = pytest.importorskip("transformers")  # noqa: F841
    from rescore.pipelines.sample_models import _tokenizer

    _tokenizer(32000).save_pretrained(tok)
    scored = str(tmp / "scored")
    runs = [
        ["--input", str(tmp / "exp" / "*.parquet"), "--output", scored, "--strategy", "grpo", "--quiet"],
        ["export", scored, "--output", str(tmp / "sft"), "--format", "sft", "--k", "2", "--quiet"],
        ["export", scored, "--output", str(tmp / "dpo"), "--format", "dpo", "--tokenizer", tok, "--quiet"],
        ["export", scored, "--output", str(tmp / "dpo_json"), "--format", "dpo", "--file-format", "jsonl",
         "--min-margin", "0.75", "--ties", "skip"],
        ["export", scored, "--output", str(tmp / "raft"), "--format", "sft", "--rule", "raft", "--by", "score"],
        # errors: one line, exit 2, nothing replaced
        ["export", scored, "--output", str(tmp / "dpo"), "--format", "dpo", "--overwrite", "--tokenizer", str(tmp / "nope")],
        ["export", scored, "--output", str(tmp / "x"), "--format", "sft", "--rule", "threshold"],
        ["export", str(tmp / "exp"), "--output", str(tmp / "x"), "--format", "sft"],
        ["export", scored, "--output", str(tmp / "sft"), "--format", "sft"],
        ["export", scored, "--output", str(tmp / "x"), "--format", "dpo", "--k", "2"],
    ]
    results = run_many(tmp / "logs", runs)
    return tmp, results


def _scored(tmp):
    return pl.read_parquet(str(tmp / "scored" / "scored-*.parquet")).with_columns(
        response=pl.col("tokens").list.slice(pl.col("prompt_length")), prompt=pl.col("tokens").list.head(pl.col("prompt_length")))


def test_exports_succeed_and_errors_are_one_line(exported):
    tmp, results = exported
    assert [c for c, _ in results[:5]] == [0] * 5, results
    assert "exported" in results[3][1] and "below_margin" in results[3][1] or "tie" in results[3][1]
    for code, err in results[5:]:
        assert code == 2 and err.startswith("rescore: error: ") and err.count("\n") == 1, err
    assert "--tokenizer" in results[5][1] and "--threshold" in results[6][1] and "not a finished Rescore output" in results[7][1]
    assert "--overwrite" in results[8][1] and "--format sft" in results[9][1]
    assert sorted(os.listdir(tmp / "dpo")) == ["_SUCCESS", "_rescore_files.json", "dpo.parquet", "export.json"]  # the failed overwrite left it
    assert not os.path.exists(tmp / "x")


def test_sft_rows_are_the_top_k_without_repeated_responses(exported):
    tmp, _ = exported
    import datasets

    scored = _scored(tmp)
    ranked = scored.sort(["batch", "task", "reward", "run"], descending=[False, False, True, False]).with_columns(
        rank=pl.col("run").cum_count().over("batch", "task"))
    want = ranked.filter(pl.col("rank") <= 2).unique(subset=["prompt", "response"], keep="first", maintain_order=True)
    ds = datasets.load_dataset("parquet", data_files=str(tmp / "sft" / "sft.parquet"), split="train")
    got = [(r["batch"], r["task"], r["run"]) for r in ds]
    assert got == want.select("batch", "task", "run").rows()
    assert want.height < ranked.filter(pl.col("rank") <= 2).height  # the duplicates were there to drop
    by_id = {(r["batch"], r["task"], r["run"]): r for r in scored.iter_rows(named=True)}
    for r in ds:
        row = by_id[(r["batch"], r["task"], r["run"])]
        assert r["input_ids"] == row["tokens"] and r["prompt_ids"] + r["completion_ids"] == row["tokens"]
        assert r["completion_mask"] == [0] * row["prompt_length"] + [1] * (len(row["tokens"]) - row["prompt_length"])
        assert r["reward"] == row["reward"] and r["score"] == pytest.approx(row["score"])
    doc = json.load(open(tmp / "sft" / "export.json"))
    assert doc["rows"]["exported"] == ds.num_rows and sum(doc["rows"].values()) == scored.height
    assert doc["rows"]["duplicate"] == ranked.filter(pl.col("rank") <= 2).height - want.height


def test_dpo_pairs_are_each_groups_best_and_worst(exported):
    tmp, _ = exported
    import datasets

    scored = _scored(tmp)
    ds = datasets.load_dataset("parquet", data_files=str(tmp / "dpo" / "dpo.parquet"), split="train")
    by_id = {(r["batch"], r["task"], r["run"]): r for r in scored.iter_rows(named=True)}
    groups = scored.group_by("batch", "task").agg(hi=pl.col("reward").max(), lo=pl.col("reward").min())
    spread = {(b, t): (hi, lo) for b, t, hi, lo in groups.rows() if hi > lo}
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tmp / "tokenizer"))
    seen = set()
    for r in ds:
        chosen, rejected = by_id[(r["batch"], r["task"], r["chosen_run"])], by_id[(r["batch"], r["task"], r["rejected_run"])]
        hi, lo = spread[(r["batch"], r["task"])]
        assert (chosen["reward"], rejected["reward"]) == (hi, lo) == (r["chosen_reward"], r["rejected_reward"])
        assert r["margin"] == hi - lo > 0
        # ties: the lowest run among the rows sharing the best (worst) reward
        group = scored.filter((pl.col("batch") == r["batch"]) & (pl.col("task") == r["task"]))
        assert r["chosen_run"] == group.filter(pl.col("reward") == hi)["run"].min()
        assert r["rejected_run"] == group.filter(pl.col("reward") == lo)["run"].min()
        assert r["prompt_ids"] + r["chosen_ids"] == chosen["tokens"] and r["prompt_ids"] + r["rejected_ids"] == rejected["tokens"]
        assert (r["prompt"], r["chosen"], r["rejected"]) == tuple(
            tok.decode(x, skip_special_tokens=False) for x in (r["prompt_ids"], r["chosen_ids"], r["rejected_ids"]))
        key = (tuple(r["prompt_ids"]), tuple(r["chosen_ids"]), tuple(r["rejected_ids"]))
        assert key not in seen
        seen.add(key)
    doc = json.load(open(tmp / "dpo" / "export.json"))
    assert ds.num_rows == len(spread) - doc["rows"]["duplicate"] // 2
    assert sum(doc["rows"].values()) == scored.height and doc["rows"]["exported"] == 2 * ds.num_rows
    no_spread = scored.group_by("batch", "task").len().filter(
        ~pl.struct("batch", "task").is_in([{"batch": b, "task": t} for b, t in spread]))
    assert (no_spread["task"] == 5).sum() == 3  # task 5 has no spread in any batch
    assert doc["rows"]["tie"] == no_spread["len"].sum()

    skip = datasets.load_dataset("json", data_files=str(tmp / "dpo_json" / "dpo.jsonl"), split="train")
    assert all(m >= 0.75 for m in skip["margin"])
    doc = json.load(open(tmp / "dpo_json" / "export.json"))
    assert doc["rule"] == {"by": "reward", "min_margin": 0.75, "ties": "skip"} and sum(doc["rows"].values()) == scored.height
    for r in skip:  # ties=skip: best and worst are each the only row with their reward
        group = scored.filter((pl.col("batch") == r["batch"]) & (pl.col("task") == r["task"]))
        assert (group["reward"] == r["chosen_reward"]).sum() == 1 and (group["reward"] == r["rejected_reward"]).sum() == 1


def test_trl_collators_take_the_exports(exported):
    tmp, _ = exported
    trl = pytest.importorskip("trl", reason="trl is not installed")  # noqa: F841
    import datasets
    from trl.trainer.dpo_trainer import DataCollatorForPreference
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    dpo = datasets.load_dataset("parquet", data_files=str(tmp / "dpo" / "dpo.parquet"), split="train")
    batch = DataCollatorForPreference(pad_token_id=0)([{k: r[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")} for r in dpo])
    assert batch["input_ids"].shape[0] == 2 * dpo.num_rows
    first = dpo[0]
    n = len(first["prompt_ids"]) + len(first["chosen_ids"])
    assert batch["input_ids"][0, :n].tolist() == first["prompt_ids"] + first["chosen_ids"]
    assert batch["completion_mask"][0, :n].tolist() == [0] * len(first["prompt_ids"]) + [1] * len(first["chosen_ids"])
    sft = datasets.load_dataset("parquet", data_files=str(tmp / "sft" / "sft.parquet"), split="train")
    # SFTTrainer folds completion_mask into labels (completion_only_loss) before its collator
    out = DataCollatorForLanguageModeling(pad_token_id=0)(
        [{"input_ids": r["input_ids"], "labels": [t if m else -100 for t, m in zip(r["input_ids"], r["completion_mask"])]}
         for r in sft])
    assert out["input_ids"].shape[0] == sft.num_rows
    first = sft[0]
    labels = out["labels"][0, : len(first["input_ids"])].tolist()
    assert labels == [-100] * len(first["prompt_ids"]) + first["completion_ids"]
