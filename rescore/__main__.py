"""`python -m rescore ...`: the same as the `rescore` console script."""

import sys

try:
    from rescore.pipelines.cli import main
except ModuleNotFoundError as e:
    if e.name not in ("rescore.pipelines", "rescore.pipelines.cli"):
        raise
    # A source checkout run by path, never installed: its folders become `rescore.*` only through
    # pyproject.toml's package-dir, which an install applies (rescore/__init__.py).
    sys.exit("rescore: error: this copy of Rescore is not installed: run `pip install -e .` in its folder first")

main()
