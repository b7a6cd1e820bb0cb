"""The first read units of a plain local run start decoding before the `rescore` command
imports Beam and torch.

Importing Beam and torch takes ~2 s of one core on every run, and nothing else can happen in
that time but work that does not need the GIL: Parquet decoding. So before those imports, the
command looks at its own command line; where it is a plain run on local Parquet files with the
default in-process runner, it starts decoding the first read units of the first input file on
a thread (transforms/unit_store.py: Prefetch) and hands the Prefetch to the run
(pipelines/cli.py -> rescore.run -> build_job), which puts it in the run's UnitStore. The read
step later takes those tables instead of decoding the units itself; whatever it does not take
is dropped at the end of the run.

Only a command line made of the options declared `plain` qualifies (pipelines/options.py): anything else (a --config file, a Beam
option such as --runner, --incremental, the model stage, SQL buffers or verl dumps, --help) may
change what is read or where, and is simply not prefetched. Nothing here can fail the command or
change its output: a unit decoded here was read exactly as the read step reads it, and is taken
only if its file still has the fingerprint it had then.
"""

from __future__ import annotations

from dataclasses import fields

from rescore.pipelines.options import env_default, plain_flags
from rescore.transforms.settings import DEFAULT_SHARD_ROWS, StepSettings

_MEMORY_MB = next(f for f in fields(StepSettings) if f.name == "memory_mb")

WITH_VALUE, FLAGS = plain_flags()
"""The options a plain run may hold (declared `plain` in pipelines/options.py), with a value and
without."""


def memory_budget_given(argv: list[str]) -> bool:
    """--memory-mb on the command line, or its environment variable set (any run, plain or not)."""
    if any(a.split("=", 1)[0] in ("--memory-mb", "--memory_mb") for a in argv):
        return True
    try:
        return env_default(_MEMORY_MB) is not None
    except Exception:  # noqa: BLE001  (a bad value: the run reports it)
        return False


def plain_run(argv: list[str]) -> dict[str, list[str]] | None:
    """The options of a plain run ({option: [values]}), or None where the command line has
    anything else (or is not a run at all)."""
    found: dict[str, list[str]] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in FLAGS and not eq:
            found.setdefault(name, [])
            i += 1
            continue
        if name not in WITH_VALUE:
            return None
        if not eq:
            if i + 1 >= len(argv):
                return None
            value = argv[i + 1]
            i += 1
        found.setdefault(name.replace("_", "-"), []).append(value)
        i += 1
    return found if found.get("--input") and found.get("--output") else None


def prefetch_from(argv: list[str]):
    """The Prefetch (transforms/unit_store.py) decoding the first read units where `argv` is a
    plain local run, for the run to take over; None otherwise. Never raises."""
    try:
        options = plain_run(argv)
        if options is None:
            return None
        shard_rows = int(options.get("--shard-rows", [DEFAULT_SHARD_ROWS])[-1])
        threads = int(options.get("--io-threads", ["0"])[-1])
        memory = options.get("--memory-mb")
        memory_mb = float(memory[-1]) if memory else env_default(_MEMORY_MB)
        if shard_rows < 1 or threads < 0 or (memory_mb is not None and not memory_mb > 0):
            return None
        from rescore.transforms.unit_store import start_prefetch
        from rescore.transforms.unit_threads import resolve_threads  # no Beam at import

        return start_prefetch(options["--input"], shard_rows=shard_rows, threads=resolve_threads(threads), memory_mb=memory_mb)
    except Exception:  # noqa: BLE001  (the run itself reports any problem with its command line)
        return None
