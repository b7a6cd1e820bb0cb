"""Without an optional extra a command says which one in one line (exit 2), before any work."""

from __future__ import annotations

import sys

import pytest


def test_dataflow_and_sample_models_without_their_extras(sample, tmp_path, monkeypatch, capsys):
    """Without the [gcp] extra a Dataflow dry run is one line naming it (exit 2); without
    [models] `python -m rescore.pipelines.sample_models` is one line naming that."""
    from rescore.errors import ConfigError
    from rescore.pipelines import sample_models
    from rescore.pipelines.config import parse_args

    monkeypatch.setitem(sys.modules, "apache_beam.runners.dataflow.internal.apiclient", None)
    with pytest.raises(ConfigError, match=r"^--runner DataflowRunner needs the \[gcp\] extra .*pip install 'rescore\[gcp\]'"):
        parse_args(["--config", "dataflow_gpu", "--project=p", "--temp_location=gs://b/tmp", "--no_auth",
                    "--dry_run=True", "--input", sample, "--output", "gs://b/out"])
    monkeypatch.setitem(sys.modules, "transformers", None)
    assert sample_models.main([str(tmp_path / "models")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rescore: error: the tiny models need the [models] extra") and len(err.splitlines()) == 1
    assert not (tmp_path / "models").exists()
