"""`rescore sample`: the quickstart's input, rewritten in place without stale files."""

from __future__ import annotations

import os

import pytest


def test_sample_removes_stale_files_and_counts_right(tmp_path, capsys):
    from rescore.pipelines.sample import main as sample_main

    out = tmp_path / "s"
    assert sample_main(["--output", str(out), "--files", "3"]) == 0
    (out / "notes.parquet").write_text("mine")
    assert sample_main(["--output", str(out), "--files", "1"]) == 0
    assert sorted(os.listdir(out)) == ["experience-000.parquet", "notes.parquet"]
    assert capsys.readouterr().err.splitlines()[-1] == f"wrote 512 rows to 1 file in {out}"


@pytest.mark.slow
def test_logged_by_is_the_models_logprobs_with_engine_noise_and_stale_rows(tmp_path, capsys):
    """`rescore sample --logged-by DIR` (docs/offpolicy.md): every column but `logprobs` is the
    default sample's; `logprobs` are DIR's own log-probs (the model stage's function) within the
    engine noise, except on about one row in ten, whose every token drifts by 0.005 to 0.05 nats,
    so verl's geometric bounds [0.999, 1.001] keep exactly the fresh rows."""
    import numpy as np
    import pyarrow.parquet as pq

    pytest.importorskip("transformers", reason="--logged-by needs the [models] extra")
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from rescore.pipelines import sample
    from rescore.transforms.inference import response_logprobs

    torch.manual_seed(0)
    student = str(tmp_path / "student")  # sample_models' student, smaller: the sample's vocabulary
    GPT2LMHeadModel(GPT2Config(vocab_size=32000, n_embd=8, n_layer=1, n_head=2, n_positions=128)).save_pretrained(student)
    out = tmp_path / "reused"
    assert sample.main(["--output", str(out), "--logged-by", student, "--batches", "2"]) == 0
    logged = pq.read_table(sorted(str(p) for p in out.glob("*.parquet"))).sort_by([("batch", "ascending"), ("task", "ascending"), ("run", "ascending")])
    default = sample.make_experience(batches=2).sort_by([("batch", "ascending"), ("task", "ascending"), ("run", "ascending")])
    assert logged.drop_columns(["logprobs"]).equals(default.drop_columns(["logprobs"]))
    model = GPT2LMHeadModel.from_pretrained(student).eval()
    own = response_logprobs(model, [np.asarray(t) for t in logged["tokens"].to_pylist()], logged["prompt_length"].to_numpy())
    drift = np.array([np.mean(np.asarray(l) - o) for l, o in zip(logged["logprobs"].to_pylist(), own)])
    fresh = np.abs(drift) < 0.001
    assert np.all(fresh | (np.abs(drift) >= 0.005 - 1e-4)) and np.all(np.abs(drift) <= 0.05 + 0.001)
    assert 0.05 < 1 - fresh.mean() < 0.15  # the stale share: one row in ten
    assert sample.main(["--output", str(tmp_path / "x"), "--logged-by", str(tmp_path / "nowhere")]) == 2
    assert "--logged-by" in capsys.readouterr().err.splitlines()[-1]
