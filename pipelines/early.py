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

Only a command line made of the options declared `plain` (pipelines/options.py) qualifies, as
the run's own parser reads it (options.parser(), built without the help texts that would import
the strategies): anything else (a --config file, a Beam option such as --runner, --incremental,
the model stage, SQL buffers or verl dumps, --help, a value the parser refuses) may change what
is read or where, and is simply not prefetched. The values the prefetch is sized with
(--shard-rows, --io-threads, --memory-mb and their environment variables) are the run's own,
checked as the run checks them (options.value_of). Nothing here can fail the command or change
its output: a unit decoded here was read exactly as the read step reads it, and is taken only if
its file still has the fingerprint it had then.
"""

from __future__ import annotations

import argparse
import importlib.abc
import sys
from contextlib import contextmanager
from functools import lru_cache

from rescore.pipelines.options import dest, parser, table, value_of
from rescore.transforms.settings import spec

HELP = ("-h", "--help")


@lru_cache(maxsize=4)
def _parsed(argv: tuple[str, ...]) -> tuple[argparse.Namespace, list[str]] | None:
    """The run parser's reading of `argv` ((options, what it does not know)); None where it
    refuses it, `argv` asks for help (argparse would print it and exit) or names a command
    (`rescore sample ...`: a run's command line starts with an option)."""
    if not argv or not argv[0].startswith("-") or any(a in HELP for a in argv):
        return None
    try:
        return parser(helps=False).parse_known_args(list(argv))
    except Exception:  # noqa: BLE001  (ConfigError, or any other complaint: the run itself reports it)
        return None


@lru_cache(maxsize=1)
def _plain_dests() -> frozenset[str]:
    return frozenset(dest(f) for f in table() if spec(f).plain)


def _value(args: argparse.Namespace, name: str):
    """The run's value of option `name`: flag over environment variable over default, checked
    (ConfigError where it is refused)."""
    return value_of(next(f for f in table() if f.name == name), args, {})[0]


def memory_budget_given(argv: list[str]) -> bool:
    """--memory-mb on the command line, or its environment variable set (any run, plain or not;
    False for what is not a run)."""
    parsed = _parsed(tuple(argv))
    if parsed is None:
        return False
    try:
        return _value(parsed[0], "memory_mb") is not None
    except Exception:  # noqa: BLE001  (a bad value: the run reports it)
        return False


def plain_run(argv: list[str]) -> argparse.Namespace | None:
    """The options of a plain run as the run's parser reads them, or None where the command line
    has anything else (or is not a run at all)."""
    parsed = _parsed(tuple(argv))
    if parsed is None or parsed[1]:  # refused, or holds what only Beam knows
        return None
    args = parsed[0]
    plain = _plain_dests()
    if any(value is not None and name not in plain for name, value in vars(args).items()):
        return None
    return args if args.input and args.output else None


def prefetch_from(argv: list[str]):
    """The Prefetch (transforms/unit_store.py) decoding the first read units where `argv` is a
    plain local run, for the run to take over; None otherwise. Never raises."""
    try:
        args = plain_run(argv)
        if args is None:
            return None
        shard_rows, threads, memory_mb = (_value(args, n) for n in ("shard_rows", "io_threads", "memory_mb"))
        from rescore.transforms.unit_store import start_prefetch
        from rescore.transforms.unit_threads import resolve_threads  # no Beam at import

        return start_prefetch(args.input, shard_rows=shard_rows, threads=resolve_threads(threads), memory_mb=memory_mb)
    except Exception:  # noqa: BLE001  (the run itself reports any problem with its command line)
        return None



OPTIONAL_IMPORTS = (
    "pandas",  # Beam's typehints (pandas types of batched DoFns); pyarrow's first ChunkedArray.to_numpy
    "google.cloud", "google.api_core", "google.auth", "google.oauth2", "apitools",  # GCS, BigQuery, Pub/Sub ([gcp])
    "boto3", "botocore",  # Beam's S3 file system ([aws]; Rescore's [s3])
    "pymongo", "bson",  # Beam's MongoDB IO
    # Beam's BigQuery and Pub/Sub IO themselves: without google.cloud they fail anyway, but only
    # after their own imports (requests, regex, ...: ~60 ms)
    "apache_beam.io.gcp.bigquery", "apache_beam.io.gcp.pubsub",
)
"""What a plain local run loads where it is installed and never uses. `import apache_beam` loads
Beam's optional integrations (each under `try: ... except ImportError`, going on without it),
and pyarrow imports pandas the first time a column is converted to numpy (for pandas'
sentinels). With the test environment's packages ([gcp], pandas) that is ~0.9 s of one core
before the first unit is read and ~85 MB resident (benchmarks/README.md, issue 42)."""


class _SkipOptional(importlib.abc.MetaPathFinder):
    """A finder ahead of every other that answers OPTIONAL_IMPORTS as not installed."""

    def find_spec(self, name, path=None, target=None):
        if any(name == top or name.startswith(top + ".") for top in OPTIONAL_IMPORTS):
            raise ModuleNotFoundError(f"No module named {name!r} (a plain local run skips it: pipelines/early.py)", name=name)
        return None


def local_plain_run(argv: list[str]) -> bool:
    """`argv` is a plain run (plain_run) whose inputs and output are all local paths."""
    try:
        args = plain_run(argv)
    except Exception:  # noqa: BLE001  (never fails the command: the run reports any problem)
        return False
    return args is not None and all("://" not in p for p in [*args.input, args.output])


@contextmanager
def lean_imports(argv: list[str]):
    """Around the console script's imports (Beam's among them): where `argv` is a plain local run
    (the in-process runner, local files: no GCS, S3, BigQuery, Pub/Sub, MongoDB or pandas in it),
    the modules OPTIONAL_IMPORTS names import as if not installed, for the duration of the block.
    At its end pyarrow makes its one look for pandas (its first conversion to numpy), which would
    otherwise import pandas on the read step's first conversion. After the block every module
    imports as usual (a user's filter function may use pandas), and Beam and pyarrow go on as
    they found things. Any other command line (a remote path, a runner, --config, a subcommand)
    imports everything as usual. Yields whether the modules are skipped."""
    finder = _SkipOptional() if local_plain_run(argv) else None
    if finder is not None:
        sys.meta_path.insert(0, finder)
    try:
        yield finder is not None
        if finder is not None:
            import pyarrow as pa

            pa.chunked_array([pa.array([0])]).to_numpy()  # (pyarrow looks for pandas once per process)
    finally:
        if finder is not None:
            sys.meta_path.remove(finder)
