"""Rescore: an Apache Beam batch job that rescores logged RL experience for LLM training.

Every import name lives under this package: `rescore.pipelines` (entry points, options, pipeline
assembly), `rescore.transforms` (Beam transforms and, in `rescore.transforms.strategies`, the
pure scoring math), `rescore.schemas` (the input/output contract) and `rescore.examples`.
In the repository those are the top-level folders `pipelines/`, `transforms/`, `schemas/` and
`examples/`; pyproject.toml maps them under `rescore` (setuptools `package-dir`), so nothing
generic lands in site-packages and nothing in a user's working directory can shadow them.
"""

import os as _os
import time as _time

_STARTED = _time.monotonic()
"""When this process began to run Rescore: the first thing `rescore` and `python -m rescore`
import is this package (the summary's wall time counts from here, rescore.pipelines.wording)."""

__version__ = "0.1.0"

# In a source checkout (tests, `python -m rescore` from the repository root) the subpackages are
# the folders beside this one; an installed wheel has them inside it. Either way they are only
# reachable as `rescore.<name>`.
_checkout = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if not _os.path.isdir(_os.path.join(__path__[0], "pipelines")) and _os.path.isfile(
    _os.path.join(_checkout, "pipelines", "rescore.py")
):
    __path__.append(_checkout)


def load_scored(path: str, *, columns: list[str] | None = None, storage_options: dict | None = None):
    """The current scored rows of any Rescore output as a `pyarrow.Table`: a one-shot directory
    (`scored-*.parquet` under `_SUCCESS`) or an `--incremental` Delta Lake table. Imports neither
    Beam nor torch, and only when called (`import rescore` stays cheap): the reader lives in the
    file layer, below the launcher (`rescore.transforms.files.scored`)."""
    from rescore.transforms.files.scored import load_scored as _load

    return _load(path, columns=columns, storage_options=storage_options)
