"""Arrow schemas of Rescore's input/output contract and their validation."""

from rescore.schemas.experience import (
    ID_COLUMNS,
    INPUT_COLUMNS,
    INPUT_SCHEMA,
    REJECT_REASON,
    SCORE_COLUMNS,
    SchemaError,
    output_schema,
    rejected_schema,
    unify,
    validate_file_schema,
)
from rescore.schemas.validation import RowCheck, check_rows, reason_category

__all__ = [
    "ID_COLUMNS",
    "INPUT_COLUMNS",
    "INPUT_SCHEMA",
    "REJECT_REASON",
    "SCORE_COLUMNS",
    "RowCheck",
    "SchemaError",
    "check_rows",
    "output_schema",
    "reason_category",
    "rejected_schema",
    "unify",
    "validate_file_schema",
]
