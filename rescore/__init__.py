"""Rescore: an Apache Beam batch job that rescores logged RL experience for LLM training.

Every import name lives under this package: `rescore.pipelines` (entry points, options, pipeline
assembly), `rescore.transforms` (Beam transforms and, in `rescore.transforms.strategies`, the
pure scoring math), `rescore.schemas` (the input/output contract) and `rescore.examples`.
In the repository those are the top-level folders `pipelines/`, `transforms/`, `schemas/` and
`examples/`; pyproject.toml maps them under `rescore` (setuptools `package-dir`), so nothing
generic lands in site-packages and nothing in a user's working directory can shadow them.
"""

import os as _os

__version__ = "0.1.0"

# In a source checkout (tests, `python -m rescore` from the repository root) the subpackages are
# the folders beside this one; an installed wheel has them inside it. Either way they are only
# reachable as `rescore.<name>`.
_checkout = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if not _os.path.isdir(_os.path.join(__path__[0], "pipelines")) and _os.path.isfile(
    _os.path.join(_checkout, "pipelines", "rescore.py")
):
    __path__.append(_checkout)
