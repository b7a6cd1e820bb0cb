"""Every error Rescore raises on purpose, in one place; each message is one line.

How the command (`pipelines/cli.py` `main`) turns them into exit status:

- 2, bad configuration or input, found before anything is written (`USER_ERRORS`):
  ConfigError (and its kinds OutputError, ModelConfigError), SchemaError, InputError, LockBusy;
- 1, the pipeline failed (`RUN_FAILURES`, and any other exception, a step's crash included):
  RejectBudgetExceeded, ConflictError; raised inside the pipeline: GroupTooLarge, InputChanged,
  BlobError, InjectedFault (tests only).

`rescore show` and `rescore report` exit 2 on NotFinishedOutputError, ReportError and InputError;
DeviceError becomes a ConfigError before a local run starts. Nothing here imports Beam, Arrow or
torch.
"""

from __future__ import annotations

import re


class ConfigError(ValueError):
    """A bad strategy name or parameter. The message is one line and lists the valid choices."""


class OutputError(ConfigError):
    """An --output Rescore must not write to (exit 2). One-line message."""


class ModelConfigError(ConfigError):
    """A model flag that cannot work (missing package, unreadable model directory, bad function)."""


class SchemaError(ValueError):
    """A file whose columns break the input contract. The message is one line."""


class InputError(ValueError):
    """Input that cannot be read at all (no match, unreadable file). One-line message."""


class LockBusy(ValueError):
    """Another run holds the output lock (or the output cannot be written at all). One-line
    message naming the holder; exit 2."""


class RejectBudgetExceeded(RuntimeError):
    """More rows were rejected than --max-reject-fraction allows."""


class ConflictError(RuntimeError):
    """Another run committed to the table, or holds its lock (exit 1, one line)."""


class GroupTooLarge(ValueError):
    """A task group beyond --max-group-rows: the run stops rather than risk running out of memory."""


class InputChanged(RuntimeError):
    """An input file differs from the one the run planned from. One-line message."""


class BlobError(ValueError):
    """A blob that is not a readable, safe TRXP payload. The message is one line."""


class LineError(ValueError):
    """A verl rollout-dump line that becomes one rejected row; the message is the reason."""


class DeviceError(RuntimeError):
    """--device cuda where no CUDA device is visible."""


class NotFinishedOutputError(ValueError):
    """`path` is not a finished Rescore output (one-line message). Raised by `load_scored` and
    `rescore show`; also importable as `rescore.pipelines.load.OutputError`."""


class ReportError(ValueError):
    """The directory holds no finished run to report on."""


class InjectedFault(RuntimeError):
    """A fault the reliability tests injected (transforms/fault_injection.py)."""


USER_ERRORS = (ConfigError, SchemaError, InputError, OutputError, LockBusy)
"""Exit 2: the run was refused before it wrote anything."""

RUN_FAILURES = (RejectBudgetExceeded, ConflictError)
"""Exit 1 with the error's own line (any other exception is exit 1 as `pipeline failed: ...`)."""


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]")


def plain(text: str) -> str:
    """`text` without terminal escape sequences (colours a library put in its message: delta-rs
    and object_store colour their error chains) and other control characters but tab."""
    text = _ANSI.sub("", text)
    return "".join(ch for ch in text if ch in "\t\n" or ch >= " " and ch != "\x7f")


def first_line(error: BaseException | str, *, limit: int | None = None, blank: str | None = None) -> str:
    """The first non-blank line of an error's message, stripped and cut to `limit` characters:
    what a one-line message quotes of an error it did not write (a database driver's, a
    parser's, a user function's). A message with no such line gives `blank`, by default the
    error's class name."""
    text = plain(error if isinstance(error, str) else str(error))
    line = next((x.strip() for x in text.splitlines() if x.strip()), None)
    if line is None:
        return blank if blank is not None else type(error).__name__
    return line[:limit] if limit is not None else line


def last_line(error: BaseException) -> str:
    """The last non-blank line of an error's message, stripped (a runner's wrapped error ends with
    the step's own), or the error's class name: what `pipeline failed: ...` quotes."""
    lines = [x.strip() for x in plain(str(error)).splitlines() if x.strip()]
    return lines[-1] if lines else type(error).__name__
