"""Entry points: option parsing and pipeline assembly (`python -m rescore`)."""

__version__ = "0.1.0"


from rescore import transforms  # noqa: F401  (installs the Beam import-noise filter first)
