"""`rescore.pipelines.load`: the readers of Rescore outputs under the name the docs and the
commands (`rescore show`, `report`, `export`, `task-stats`) have always imported. They live in
transforms/files/scored.py, below both this package and `rescore.load_scored`."""

from rescore.transforms.files.scored import (  # noqa: F401  (the public names, handed on)
    OutputError,
    check_table_path,
    input_files,
    kind_of,
    load_scored,
    open_table,
)

__all__ = ["load_scored", "OutputError", "kind_of", "open_table", "check_table_path", "input_files"]
