"""The output layout's names live in transforms/files/layout.py and nowhere else."""

import ast
import fnmatch
import os

from rescore.transforms.files import layout

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE_DIRS = ("rescore", "pipelines", "transforms", "schemas")


def _names() -> set[str]:
    return {v for k, v in vars(layout).items() if k.isupper() and isinstance(v, str)}


def _spelled(path: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, literal) of every string constant in `path` that is an output name, docstrings and
    the text of messages (f-string parts) left out."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }
    in_fstrings = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and id(node) not in docstrings and id(node) not in in_fstrings
        and (node.value in names or node.value.startswith(("scored-", "filtered-", "rejected-", "report-")))
    ]


def test_no_module_but_layout_spells_an_output_name():
    names = _names()
    assert {"_SUCCESS", "metrics.json", "_staging", "scored-*.parquet", "_rescore.lock"} <= names
    found = []
    for top in PACKAGE_DIRS:
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                path = os.path.join(folder, f)
                if f.endswith(".py") and path != layout.__file__:
                    found += [(os.path.relpath(path, ROOT), *hit) for hit in _spelled(path, names)]
    assert not found, f"import these from rescore.transforms.files.layout: {found}"


def test_the_check_sees_a_spelled_name(tmp_path):
    source = tmp_path / "m.py"
    source.write_text('"""Writes _SUCCESS."""\nA = "_SUCCESS"\nB = f"{A}/_SUCCESS"\nC = "scored-1.parquet"\n')
    assert _spelled(str(source), _names()) == [(2, "_SUCCESS"), (4, "scored-1.parquet")]


def test_data_file_names_match_their_patterns():
    assert layout.scored_file(3, 12) == "scored-00003-of-00012.parquet"
    assert layout.scored_file(3, 12, 1) == "scored-00003-of-00012-part-001.parquet"
    assert layout.filtered_file(0, 1) == "filtered-00000-of-00001.parquet"
    assert layout.rejected_file(99999, 100000) == "rejected-99999-of-100000.parquet"
    for name, pattern in [(layout.scored_file(3, 12, 1), layout.SCORED_FILES),
                          (layout.filtered_file(0, 1), layout.FILTERED_FILES),
                          (layout.rejected_file(7, 9), layout.REJECTED_FILES)]:
        assert [p for p in layout.DATA_NAMES if fnmatch.fnmatch(name, p)] == [pattern]
    assert layout.report_chart("reward") == "report-reward.png"
    assert fnmatch.fnmatch(layout.report_chart("reward"), layout.REPORT_CHARTS)


def test_staging_dir_local_and_object_store():
    assert layout.staging_dir("/data/out") == "/data/out/_staging"
    assert layout.staging_dir("gs://bucket/out") == "gs://bucket/out/_staging"

