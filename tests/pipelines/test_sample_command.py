"""`rescore sample`: the quickstart's input, rewritten in place without stale files."""

from __future__ import annotations

import os


def test_sample_removes_stale_files_and_counts_right(tmp_path, capsys):
    from rescore.pipelines.sample import main as sample_main

    out = tmp_path / "s"
    assert sample_main(["--output", str(out), "--files", "3"]) == 0
    (out / "notes.parquet").write_text("mine")
    assert sample_main(["--output", str(out), "--files", "1"]) == 0
    assert sorted(os.listdir(out)) == ["experience-000.parquet", "notes.parquet"]
    assert capsys.readouterr().err.splitlines()[-1] == f"wrote 512 rows to 1 file in {out}"
