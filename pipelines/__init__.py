"""Entry points: option parsing and pipeline assembly (`python -m pipelines.rescore`)."""

__version__ = "0.1.0"


import transforms  # noqa: F401  (installs the Beam import-noise filter first)
