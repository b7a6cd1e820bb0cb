"""rescore.torch.ScoredBatches: the batches equal the scored rows (values, padding, order,
seeded shuffling), from a one-shot output and from an --incremental table (docs/training.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import RUNNER


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    from rescore.pipelines.cli import main
    from rescore.pipelines.sample import main as sample_main

    d = tmp_path_factory.mktemp("torch-loader")
    assert sample_main(["--output", str(d / "data"), "--batches", "2", "--tasks", "5"]) == 0
    data = str(d / "data" / "*.parquet")
    assert main(["--input", data, "--output", str(d / "out"), RUNNER, "--quiet", "--strategy", "grpo"]) == 0
    assert main(["--input", data, "--output", str(d / "table"), RUNNER, "--quiet", "--strategy", "grpo",
                 "--incremental"]) == 0
    return str(d / "out"), str(d / "table")


def _expected(row: dict, P: int, R: int, pad: int):
    """One row as verl's tensors, built by hand from the row's lists."""
    p = row["prompt_length"]
    prompt, response = row["tokens"][:p], row["tokens"][p:]
    r = len(response)
    return {
        "prompts": [pad] * (P - p) + prompt,
        "responses": response + [pad] * (R - r),
        "input_ids": [pad] * (P - p) + prompt + response + [pad] * (R - r),
        "attention_mask": [0] * (P - p) + [1] * (p + r) + [0] * (R - r),
        "position_ids": [0] * (P - p) + list(range(p + r)) + [p + r - 1] * (R - r),
        "response_mask": [int(m) for m in row["action_mask"]] + [0] * (R - r),
        "advantages": row["advantages"] + [0.0] * (R - r),
        "returns": row["returns"] + [0.0] * (R - r),
        "old_log_probs": row["logprobs"] + [0.0] * (R - r),
    }


@pytest.mark.parametrize("which", ["one-shot", "incremental"])
def test_the_batches_are_the_scored_rows_in_order(outputs, which):
    import rescore
    from rescore.torch import ScoredBatches

    path = outputs[0] if which == "one-shot" else outputs[1]
    rows = rescore.load_scored(path).to_pylist()
    assert len(rows) == 80
    dataset = ScoredBatches(path, batch_size=7, pad_token_id=-1)
    batches = list(dataset)
    assert len(batches) == len(dataset) == 12  # 11 full batches and one of 3
    assert [len(b["task"]) for b in batches] == [7] * 11 + [3]
    seen = 0
    for batch in batches:
        chunk = rows[seen:seen + len(batch["task"])]
        seen += len(chunk)
        P = max(r["prompt_length"] for r in chunk)
        R = max(len(r["tokens"]) - r["prompt_length"] for r in chunk)
        assert batch["prompts"].shape == (len(chunk), P) and batch["responses"].shape == (len(chunk), R)
        assert batch["input_ids"].dtype == torch.int64 and batch["advantages"].dtype == torch.float32
        for b, row in enumerate(chunk):
            for key, values in _expected(row, P, R, -1).items():
                assert batch[key][b].tolist() == pytest.approx(values, abs=0), (key, b)
            assert batch["score"][b].item() == pytest.approx(row["score"], abs=0)
        assert [(r["batch"], r["task"], r["run"], r["step"]) for r in chunk] == list(
            zip(batch["batch"], batch["task"], batch["run"], batch["step"]))
    assert seen == len(rows)
    # the advantages are the score over the action mask, token for token
    first = batches[0]
    assert torch.equal(first["advantages"], first["score"][:, None] * first["response_mask"].float())


@pytest.mark.slow
def test_shuffling_is_seeded_by_seed_and_epoch_and_keeps_every_row_once(outputs):
    import rescore
    from rescore.torch import ScoredBatches

    rows = rescore.load_scored(outputs[0]).to_pylist()
    key = [(r["batch"], r["task"], r["run"], r["step"]) for r in rows]

    def order(ds):
        return [k for b in ds for k in zip(b["batch"], b["task"], b["run"], b["step"])]

    a = ScoredBatches(outputs[0], batch_size=16, shuffle=True, seed=3)
    first = order(a)
    assert sorted(first) == sorted(key) and first != key  # a permutation of every row
    assert order(ScoredBatches(outputs[0], batch_size=16, shuffle=True, seed=3)) == first  # same seed, same order
    assert first == [key[i] for i in np.random.default_rng([3, 0]).permutation(len(rows))]
    a.set_epoch(1)
    assert order(a) != first and sorted(order(a)) == sorted(key)
    assert order(ScoredBatches(outputs[0], batch_size=16, shuffle=True, seed=4)) != first
    # a shuffled batch holds the values of the rows it names
    batch = next(iter(ScoredBatches(outputs[0], batch_size=5, shuffle=True, seed=3)))
    by_key = dict(zip(key, rows))
    for b, k in enumerate(zip(batch["batch"], batch["task"], batch["run"], batch["step"])):
        row = by_key[k]
        r = len(row["tokens"]) - row["prompt_length"]
        assert batch["advantages"][b, :r].tolist() == pytest.approx(row["advantages"], abs=0)
        assert batch["responses"][b, :r].tolist() == row["tokens"][row["prompt_length"]:]


@pytest.mark.slow
def test_drop_last_fixed_widths_and_dataloader_workers(outputs):
    from torch.utils.data import DataLoader

    from rescore.torch import ScoredBatches

    ds = ScoredBatches(outputs[0], batch_size=7, drop_last=True, prompt_length=64, response_length=128)
    batches = list(ds)
    assert len(batches) == len(ds) == 11 and all(b["input_ids"].shape == (7, 192) for b in batches)
    with pytest.raises(ValueError, match="more than response_length=8"):
        next(iter(ScoredBatches(outputs[0], batch_size=7, response_length=8)))
    # two DataLoader workers: each row once, batches as one process makes them
    loader = DataLoader(ScoredBatches(outputs[0], batch_size=7), batch_size=None, num_workers=2)
    got = sorted(tuple(b["input_ids"][0].tolist()) for b in loader)
    assert got == sorted(tuple(b["input_ids"][0].tolist()) for b in ScoredBatches(outputs[0], batch_size=7))


@pytest.mark.slow
def test_trl_layout(outputs):
    import rescore
    from rescore.torch import ScoredBatches

    rows = rescore.load_scored(outputs[0]).to_pylist()[:4]
    batch = next(iter(ScoredBatches(outputs[0], batch_size=4, layout="trl")))
    assert set(batch) >= {"prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "tool_mask", "advantages",
                          "num_items_in_batch", "old_per_token_logps"}
    width = batch["completion_ids"].shape[1]
    for b, row in enumerate(rows):
        p, r = row["prompt_length"], len(row["tokens"]) - row["prompt_length"]
        assert batch["prompt_ids"][b, batch["prompt_ids"].shape[1] - p:].tolist() == row["tokens"][:p]
        # TRL's convention: completion_mask every real token, tool_mask the generated ones (padded with 1)
        assert batch["completion_mask"][b].tolist() == [1] * r + [0] * (width - r)
        assert batch["tool_mask"][b].tolist() == [int(m) for m in row["action_mask"]] + [1] * (width - r)
        assert batch["advantages"][b, :r].tolist() == pytest.approx(row["advantages"], rel=1e-6)
        assert batch["old_per_token_logps"][b, :r].tolist() == pytest.approx(row["logprobs"], abs=0)
    assert batch["num_items_in_batch"].item() == sum(sum(int(m) for m in row["action_mask"]) for row in rows)
    with pytest.raises(ValueError, match="layout must be one of verl, trl"):
        ScoredBatches(outputs[0], layout="openrlhf")
