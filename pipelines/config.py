"""Command line and YAML config -> a RunConfig plus the Beam pipeline arguments.

Precedence: command-line flags > --config YAML > defaults. Anything that is not a Rescore flag
must be a Beam pipeline option; a typo fails instead of being dropped silently.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any

import yaml
from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

from rescore.errors import ConfigError
from rescore.pipelines.model_flags import add_model_flags, model_options
from rescore.transforms.files.layout import table_name_problem
from rescore.transforms.rows.model_columns import ModelOptions
from rescore.transforms.strategies import algorithms, names

log = logging.getLogger(__name__)

DEFAULT_RUNNER = "FnApiRunner"
DEFAULT_BUCKETS = 64
LOCAL_BUCKET_ROWS = 131072
"""In-process runs without --buckets: one bucket per this many rows, 8 to DEFAULT_BUCKETS. The
score step runs its buckets one after another there, so more buckets only add per-bucket
overhead (a 204,800-row run: 8 buckets ~6 % faster than 64); the scores do not depend on it."""
DEFAULT_SHARD_ROWS = 65536
DEFAULT_MAX_REJECT_FRACTION = 0.5
DEFAULT_MAX_GROUP_ROWS = 1_000_000

CONFIG_KEYS = {
    "input": "input path or glob (or a list of them)",
    "output": "output directory",
    "strategy": "strategy registry name, or a list of them (filter, advantage, duplicate)",
    "algorithm": "Trinity-RFT algorithm preset (instead of strategy)",
    "params": "mapping of strategy parameters (KEY or STRATEGY.KEY)",
    "buckets": "number of shuffle buckets",
    "shard_rows": "rows per read unit / output file",
    "overwrite": "replace a finished run in the output directory",
    "skip_bad_files": "leave out unreadable or contract-breaking files (listed in metrics.json)",
    "max_reject_fraction": "fail the run when more than this fraction of rows is rejected",
    "max_group_rows": "fail the run when one task group has more rows than this",
    "io_threads": "read units each worker reads or writes at once (0: one per core, at most 4)",
    "device": "where the torch math runs: auto, cpu or cuda",
    "accelerator": "Beam accelerator resource hint for the scoring and writing steps",
    "keep_filtered": "write the rows a filter drops to filtered-*.parquet with a filter_reason",
    "audit_columns": "add group_size, group_reward_mean, group_reward_std, baseline to every scored row",
    "incremental": "keep the output as a Delta Lake table; rescore only batches that new, changed or deleted input touches",
    "pipeline_options": "mapping of Beam pipeline options",
    "input_table": "with a database URL as input: the Trinity-RFT experience buffer (table) to read",
    "input_format": "parquet (default) or verl-rollouts (verl rollout_data_dir *.jsonl)",
    "output_db": "also write the scored experience as a Trinity-RFT buffer into this database URL",
    "output_table": "with output_db: the buffer (table) name to write",
    "models": "mapping of model-stage settings: teacher_model, reward_model, reward_fn, ... (docs/models.md)",
    "wait_for_lock": "seconds to wait for another run writing the same output (default 0: refuse at once)",
    "shared_filesystem": "local --input/--output paths are on a filesystem every worker mounts at the same path",
}
INPUT_FORMATS = ("parquet", "verl-rollouts")

_BOOL_KEYS = ("overwrite", "skip_bad_files", "incremental", "keep_filtered", "audit_columns", "shared_filesystem")
_INT_KEYS = ("buckets", "shard_rows", "max_group_rows", "io_threads")
_FLOAT_KEYS = ("max_reject_fraction", "wait_for_lock")
_STR_KEYS = ("output", "algorithm", "device", "accelerator", "input_table", "input_format", "output_db", "output_table")


@dataclass
class RunConfig:
    inputs: list[str]
    output: str
    strategies: list[str]
    params: dict[str, Any]
    algorithm: str | None = None
    buckets: int = DEFAULT_BUCKETS
    buckets_chosen: bool = False
    """--buckets (or the config's `buckets`) was given: no local default replaces it."""
    shard_rows: int = DEFAULT_SHARD_ROWS
    overwrite: bool = False
    skip_bad_files: bool = False
    max_reject_fraction: float = DEFAULT_MAX_REJECT_FRACTION
    max_group_rows: int = DEFAULT_MAX_GROUP_ROWS
    io_threads: int = 0
    device: str = "auto"
    accelerator: str | None = None
    incremental: bool = False
    keep_filtered: bool = False
    audit_columns: bool = False
    run_name: str | None = None
    wait: bool = True
    quiet: bool = False
    log_level: str = "WARNING"
    beam_args: list[str] = field(default_factory=list)
    input_table: str | None = None
    input_format: str = "parquet"
    output_db: str | None = None
    output_table: str | None = None
    models: ModelOptions = field(default_factory=ModelOptions)
    wait_for_lock: float = 0.0


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would exit; a ConfigError keeps the one-line contract
        raise ConfigError(message)


COMMANDS = """commands:
  rescore --input PATH_OR_GLOB --output DIR --strategy NAME [--set KEY=VALUE ...]
                                          score experience (the options below)
  rescore sample --output DIR [--batches N] [--tasks N] [--runs N] [--seed N]
                                          write sample experience to try it on
  rescore report OUTPUT_DIR [--to DIR] [--solved-at X]
                                          report.html and charts of a finished run
  rescore show PATH [--batches]           what an output or an incremental table holds
  rescore task-stats --input SOURCE --output DIR [--threshold X] [--k 1,4,8]
                                          per-task pass rates, pass@k, Beta posterior (docs/curating.md)
  rescore export OUTPUT_DIR --output DIR --format sft|dpo
                                          SFT rows or DPO pairs for the next run (docs/curating.md)"""


def usage() -> str:
    """What a bare `rescore` prints: the usage line and the commands."""
    return f"{_parser().format_usage()}\n{COMMANDS}\n\nrescore --help lists every option; rescore sample --help, rescore report --help, rescore show --help"


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="rescore",
        description=f"Rescore logged RL experience: Parquet in, scored Parquet out.\n\n{COMMANDS}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Any other --option is passed to Beam (e.g. --runner, --direct_num_workers).",
        allow_abbrev=False,
    )
    p.add_argument("--input", action="append", help="input Parquet path, directory or glob (repeatable)")
    p.add_argument("--output", help="output directory")
    p.add_argument(
        "--strategy",
        action="append",
        help=f"strategy name, or a comma-separated filter,advantage,duplicate chain: {', '.join(names())}",
    )
    p.add_argument("--algorithm", help=f"Trinity-RFT algorithm preset: {', '.join(algorithms.names())}")
    p.add_argument(
        "--group-filter", "--group_filter", metavar="MODULE:FUNCTION",
        help="your function over each task group's rows: True keeps it (the run's filter stage; docs/strategies.md)",
    )
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="strategy parameter, KEY or STRATEGY.KEY (JSON value)"
    )
    p.add_argument("--config", help="YAML run config: a file, or the name of a shipped one (`rescore configs` lists them)")
    p.add_argument("--buckets", type=int, help=f"shuffle buckets (default {DEFAULT_BUCKETS}; in-process: one per {LOCAL_BUCKET_ROWS:,} rows, 8 to {DEFAULT_BUCKETS})")
    p.add_argument("--shard-rows", "--shard_rows", type=int, help=f"rows per read unit and output file (default {DEFAULT_SHARD_ROWS})")
    p.add_argument("--overwrite", action="store_true", default=None, help="replace a finished run in --output")
    p.add_argument(
        "--skip-bad-files",
        "--skip_bad_files",
        action="store_true",
        default=None,
        help="leave out unreadable or contract-breaking input files instead of stopping (listed in metrics.json)",
    )
    p.add_argument(
        "--max-reject-fraction",
        "--max_reject_fraction",
        type=float,
        help=f"fail (no _SUCCESS) when more than this fraction of rows is rejected (default {DEFAULT_MAX_REJECT_FRACTION})",
    )
    p.add_argument(
        "--max-group-rows",
        "--max_group_rows",
        type=int,
        help=f"fail with a clear message when one task group has more rows (default {DEFAULT_MAX_GROUP_ROWS:,})",
    )
    p.add_argument(
        "--io-threads",
        "--io_threads",
        type=int,
        help="read units each worker reads, validates or writes at once (default 0: one per core, at most 4)",
    )
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="where the torch math runs (default auto: cuda if torch sees a GPU)")
    p.add_argument(
        "--accelerator",
        metavar="SPEC",
        help="accelerator resource hint for the scoring and writing steps, e.g. 'type:nvidia-l4;count:1;install-nvidia-driver'",
    )
    p.add_argument(
        "--incremental",
        action="store_true",
        default=None,
        help="keep OUTPUT as a Delta Lake table and rescore only the batches new, changed or deleted input touches (docs/runners.md)",
    )
    p.add_argument(
        "--run-name", "--run_name",
        help="with --incremental: the run's name, one path component [A-Za-z0-9][A-Za-z0-9._=+-]* (default run=YYYYMMDDTHHMMSS, UTC)",
    )
    p.add_argument(
        "--keep-filtered",
        "--keep_filtered",
        action="store_true",
        default=None,
        help="write the rows a filter drops to filtered-*.parquet, each with a filter_reason (stage, statistic, threshold)",
    )
    p.add_argument(
        "--audit-columns",
        "--audit_columns",
        action="store_true",
        default=None,
        help="add to every scored row the numbers its score came from: group_size, group_reward_mean, "
        "group_reward_std, batch_reward_std, baseline",
    )
    p.add_argument(
        "--no-wait", "--no_wait", action="store_true", help="submit to a remote runner and return without waiting (Flex Templates)"
    )
    p.add_argument("--input-table", "--input_table", metavar="NAME",
                   help="read the Trinity-RFT experience buffer NAME from the database URL given as --input")
    p.add_argument("--input-format", "--input_format", choices=INPUT_FORMATS,
                   help="parquet (default) or verl-rollouts (verl trainer.rollout_data_dir {step}.jsonl files)")
    p.add_argument("--output-db", "--output_db", metavar="URL",
                   help="also write the scored experience as a Trinity-RFT buffer into this SQLAlchemy database URL")
    p.add_argument("--output-table", "--output_table", metavar="NAME", help="with --output-db: the buffer name to write")
    p.add_argument(
        "--wait-for-lock",
        "--wait_for_lock",
        type=float,
        metavar="SECONDS",
        help="when another run is writing the same --output, wait up to SECONDS for it (default 0: refuse at once)",
    )
    p.add_argument(
        "--shared-filesystem", "--shared_filesystem", action="store_true", default=None,
        help="local --input/--output paths are on a filesystem every worker of a Flink, Spark, Dask or portable "
        "cluster mounts at the same path (else such a run is refused: docs/runners.md)",
    )
    p.add_argument("--quiet", action="store_true", help="no summary on stderr")
    p.add_argument(
        "--log-level", "--log_level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="WARNING (default): a failure is one `rescore: error:` line, Rescore's warnings come after a successful run, "
        "Beam's logs are not shown; INFO streams the log (Beam's and its workers' too) and prints the plan; DEBUG also the traceback",
    )
    add_model_flags(p)
    return p


def parse_value(text: str) -> Any:
    """JSON where it parses ('1e-7', 'null', 'true'), else the string itself ('batch')."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def shipped_configs() -> dict[str, str]:
    """{name: path} of the run configs that ship with Rescore (the repository's run_configs/,
    installed as package data): `--config NAME` or `--config run_configs/NAME.yaml` finds them
    from any directory; `rescore configs` lists them."""
    import rescore

    found: dict[str, str] = {}
    for base in [os.path.dirname(rescore.__file__), *rescore.__path__]:
        directory = os.path.join(base, "run_configs")
        if os.path.isdir(directory):
            for name in sorted(os.listdir(directory)):
                if name.endswith(".yaml"):
                    found.setdefault(name[: -len(".yaml")], os.path.join(directory, name))
    return found


def _config_path(path: str) -> str:
    """`path` where it exists; else the shipped config it names (`local`, `local.yaml`,
    `run_configs/local.yaml`)."""
    if os.path.exists(path):
        return path
    head, name = os.path.split(path)
    if head in ("", "run_configs", "./run_configs"):
        shipped = shipped_configs().get(name[: -len(".yaml")] if name.endswith(".yaml") else name)
        if shipped:
            return shipped
    return path


def _load_yaml(path: str) -> dict[str, Any]:
    given, path = path, _config_path(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except OSError as e:
        shipped = ", ".join(shipped_configs())
        raise ConfigError(
            f"cannot read config {given}: {e.strerror}" + (f" (shipped configs: {shipped}; `rescore configs` lists them)" if shipped else "")
        ) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config {path} must be a mapping of keys to values")
    unknown = sorted(set(data) - set(CONFIG_KEYS))
    if unknown:
        raise ConfigError(f"config {path}: unknown key {unknown[0]!r}; valid keys: {', '.join(CONFIG_KEYS)}")
    for key in ("params", "pipeline_options"):
        if not isinstance(data.get(key) or {}, dict):
            raise ConfigError(f"config {path}: {key!r} must be a mapping")
    _check_types(path, data)
    return data


def _kind(value: Any) -> str:
    return "null" if value is None else {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(
        type(value), f"a {type(value).__name__}"
    )


def _check_types(path: str, data: dict[str, Any]) -> None:
    """Each YAML value has its key's type: `overwrite: "false"` (a string) is an error, not true."""
    for key, value in data.items():
        if key in _BOOL_KEYS and not isinstance(value, bool):
            raise ConfigError(f"config {path}: {key!r} must be true or false, got {value!r} ({_kind(value)})")
        if key in _INT_KEYS and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"config {path}: {key!r} must be an integer, got {value!r} ({_kind(value)})")
        if key in _FLOAT_KEYS and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConfigError(f"config {path}: {key!r} must be a number, got {value!r} ({_kind(value)})")
        if key in _STR_KEYS and not isinstance(value, str):
            raise ConfigError(f"config {path}: {key!r} must be a string, got {value!r} ({_kind(value)})")
        if key == "input" and not (
            isinstance(value, str) or (isinstance(value, list) and value and all(isinstance(v, str) for v in value))
        ):
            raise ConfigError(f"config {path}: 'input' must be a path or a list of paths, got {value!r}")


def _option_flags(options: dict[str, Any]) -> list[str]:
    """YAML pipeline_options -> Beam command-line flags."""
    flags = []
    for key, value in options.items():
        name = f"--{key}"
        if value is True:
            flags.append(name)
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            flags += [f"{name}={v}" for v in value]
        elif isinstance(value, dict):
            flags.append(f"{name}={json.dumps(value)}")
        else:
            flags.append(f"{name}={value}")
    return flags


_LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "0.0.0.0")


def _beam_option(args: list[str], name: str) -> str | None:
    value = None
    for i, a in enumerate(args):
        if a == f"--{name}" and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(f"--{name}="):
            value = a.split("=", 1)[1]
    return value


def _is_local_address(address: str) -> bool:
    """host[:port] (or scheme://host:port) names this machine."""
    import socket

    host = address.split("://", 1)[-1].split("/", 1)[0]
    host = host[1:].split("]", 1)[0] if host.startswith("[") else (host.rsplit(":", 1)[0] if host.count(":") == 1 else host)
    return host.lower() in _LOCAL_HOSTS or host.startswith("127.") or host == socket.gethostname()


def _remote_workers(args: list[str]) -> str | None:
    """Where the runner's workers may be other machines ("FlinkRunner's workers (--flink_master=...)"), else None:
    Flink with a JobManager elsewhere, Spark with a cluster master, Dask with a scheduler
    elsewhere, a portable job service elsewhere (Dataflow is checked on its own)."""
    runner = (_runner_name(args) or "").rsplit(".", 1)[-1].lower().removesuffix("runner")
    option = {"flink": "flink_master", "spark": "spark_master_url", "dask": "dask_client_address",
              "portable": "job_endpoint"}.get(runner)
    if option is None:
        return None
    address = _beam_option(args, option)
    if not address or address in ("[auto]", "[local]", "embed") or address.startswith("local"):
        return None  # Beam's defaults run the workers on this machine (Spark: local[N])
    if _is_local_address(address):
        return None
    return f"{_runner_name(args)}'s workers (--{option}={address})"


def _check_paths_reach_workers(args: list[str], inputs: list[str], output: str, input_table,
                               shared_filesystem: bool = False) -> None:
    """A runner whose workers are other machines reads and publishes every path there: a local
    input or output would be read or published on disks the launcher never sees (or fail
    half-way). Dataflow's workers never mount the launcher's disk: refused. Flink, Spark, Dask
    and portable clusters elsewhere may share a mount, which Rescore cannot tell: refused unless
    `--shared-filesystem` says so (docs/runners.md, "What a cluster changes")."""
    if any(a in ("--dry_run=True", "--dry_run=true") for a in args):
        return  # the job graph is built, nothing runs
    paths = [("--output", output)] + ([] if input_table else [("--input", i) for i in inputs])
    local = [(flag, path) for flag, path in paths if "://" not in path]
    if not local:
        return
    flag, path = local[0]
    if (_runner_name(args) or "").lower() in ("dataflowrunner", "dataflow"):
        raise ConfigError(
            f"{flag} {path!r} is a local path, which DataflowRunner's workers cannot reach: use gs://BUCKET/..."
        )
    where = _remote_workers(args)
    if where and not shared_filesystem:
        raise ConfigError(
            f"{flag} {path!r} is a local path, which {where} may not reach: use gs://, s3:// or hdfs://, "
            "or pass --shared-filesystem if every worker mounts it at the same path"
        )


def _runner_name(args: list[str]) -> str | None:
    return _beam_option(args, "runner")


def _import_runner_options(args: list[str]) -> str | None:
    """Import the module of the named runner, so the options it defines (DaskRunner's
    `--dask_client_address`, a custom runner's) are Beam options like the ones Rescore imports
    itself. Returns why the module could not be imported, or None."""
    runner = _runner_name(args)
    if not runner:
        return None
    from apache_beam.runners import runner as beam_runner

    known = {**beam_runner._RUNNER_MAP, "daskrunner": "apache_beam.runners.dask.dask_runner.DaskRunner"}
    path = known.get(runner.lower(), known.get(runner.lower() + "runner", runner))
    if "." not in path:
        return None
    try:
        importlib.import_module(path.rsplit(".", 1)[0])
    except Exception as e:  # a missing extra (dask, ...): the option stays unknown, and we say why
        return f"{type(e).__name__}: {e}".splitlines()[0]
    return None


def _check_beam_args(args: list[str]) -> None:
    why_not = _import_runner_options(args)
    parser = _BeamArgumentParser(allow_abbrev=False)
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)  # the same parser Beam builds in get_all_options
    try:
        _, unknown = parser.parse_known_args(args)
    except SystemExit:
        raise ConfigError(f"invalid Beam pipeline options: {' '.join(args)}") from None
    if unknown:
        first = unknown[0]
        if not first.startswith("-"):
            raise ConfigError(f"unexpected argument {first!r}")
        flag = first.split("=", 1)[0]
        known = [o for a in parser._actions for o in a.option_strings] + [
            o for a in _parser()._actions for o in a.option_strings
        ]
        hint = difflib.get_close_matches(flag, known, n=1)
        did_you_mean = f" (did you mean {hint[0]}?)" if hint else ""
        runner_note = f" (runner {_runner_name(args)}'s module did not import: {why_not})" if why_not else ""
        raise ConfigError(
            f"unknown option {flag!r}{did_you_mean}: not a Rescore flag nor a Beam pipeline option{runner_note}"
        )


def _with_default_runner(args: list[str]) -> list[str]:
    """Pin a local runner that never downloads anything.

    Beam 2.77's DirectRunner first fetches the Prism binary; Rescore runs its in-process
    FnApiRunner instead, the runner DirectRunner itself falls back to for batch jobs.
    """
    runner = _runner_name(args)
    if runner is None:
        return [*args, f"--runner={DEFAULT_RUNNER}"]
    if runner in ("DirectRunner", "SwitchingDirectRunner"):
        log.info("running %s as the in-process FnApiRunner (no Prism download)", runner)
        return [*args, f"--runner={DEFAULT_RUNNER}"]
    if runner in ("PrismRunner", "Prism") and not any(a.startswith("--prism_location") for a in args):
        return [*args, f"--prism_location={prism_binary()}"]
    return args


def prism_binary() -> str:
    """The Prism binary `--runner PrismRunner` uses when no --prism_location is given:
    $RESCORE_PRISM, or the one `go install` built into ~/.cache/rescore/prism/ for this Beam.

    Beam would download a release zip from GitHub at run time (and can hang where that host is
    unreachable); Rescore refuses instead, saying how to build the binary."""
    import apache_beam

    path = os.environ.get("RESCORE_PRISM") or os.path.join(
        os.path.expanduser("~"), ".cache", "rescore", "prism", f"bin-{apache_beam.__version__}", "prism")
    if not os.access(path, os.X_OK):
        raise ConfigError(
            f"--runner PrismRunner needs Beam's Prism binary at {path}: build it with "
            f"`GOBIN={os.path.dirname(path)} go install github.com/apache/beam/sdks/v2/go/cmd/prism@v{apache_beam.__version__}`"
            " or pass --prism_location=PATH"
        )
    return path


def _with_worker_log_level(args: list[str], level: str) -> list[str]:
    """SDK workers (multi-process, portable) log at INFO by default; follow --log-level.

    Written as Java's level name (`WARN`, which Python's logging also knows): a Java job server
    (Flink's, Spark's) parses the pipeline options into its own enum and rejects `WARNING`."""
    if any(a.startswith("--default_sdk_harness_log_level") for a in args):
        return args
    return [*args, f"--default_sdk_harness_log_level={'WARN' if level == 'WARNING' else level}"]


def _names(value: Any, where: str) -> list[str]:
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"{where} must be a strategy name or a list of names, got {item!r}")
        out += [n.strip() for n in item.split(",") if n.strip()]
    return out


def _strategies(args, config: dict[str, Any], params: dict[str, Any]) -> tuple[list[str], str | None, dict[str, Any]]:
    """(stage names, algorithm preset or None, parameters) from flags over the YAML config.

    A flag replaces its YAML counterpart: --strategy drops a YAML algorithm and vice versa.
    """
    strategy = _names(args.strategy, "--strategy") if args.strategy else None
    algorithm = args.algorithm
    if strategy and algorithm:
        raise ConfigError("pass --strategy or --algorithm, not both")
    if not strategy and not algorithm:
        if config.get("strategy") and config.get("algorithm"):
            raise ConfigError("the config sets both 'strategy' and 'algorithm'; keep one")
        strategy = _names(config["strategy"], "config 'strategy'") if config.get("strategy") else None
        algorithm = config.get("algorithm")
    if algorithm:
        preset = algorithms.preset(str(algorithm))
        return list(preset.strategies), str(algorithm), {**preset.params, **params}
    if not strategy:
        raise ConfigError(
            f"no strategy: pass --strategy NAME or --algorithm NAME; valid strategies: {', '.join(names())}"
        )
    return strategy, None, params


def _with_group_filter(strategies: list[str], params: dict[str, Any], function: str) -> tuple[list[str], dict[str, Any]]:
    """--group-filter MODULE:FUNCTION as the chain's filter stage (`group_filter`), after any
    reward shaping; one filter per run, so a chain that has one already is refused."""
    from rescore.transforms.strategies.registry import FILTER, SHAPE, spec

    kinds = [spec(n).kind for n in strategies]
    if FILTER in kinds:
        raise ConfigError(
            f"--group-filter is the run's filter stage, and the chain already has one ({strategies[kinds.index(FILTER)]})"
        )
    at = sum(1 for k in kinds if k == SHAPE)
    return [*strategies[:at], "group_filter", *strategies[at:]], {**params, "group_filter.function": function}


def parse_args(argv: list[str]) -> RunConfig:
    args, rest = _parser().parse_known_args(argv)
    config = _load_yaml(args.config) if args.config else {}

    params = dict(config.get("params") or {})
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        params[key.strip()] = parse_value(value)

    inputs = args.input or config.get("input")
    if isinstance(inputs, str):
        inputs = [inputs]
    output = args.output or config.get("output")
    if not inputs:
        raise ConfigError("no input: pass --input PATH_OR_GLOB (or 'input:' in --config)")
    if not output:
        raise ConfigError("no output: pass --output DIR (or 'output:' in --config)")
    strategies, algorithm, params = _strategies(args, config, params)
    group_filter = args.group_filter
    if group_filter:
        strategies, params = _with_group_filter(strategies, params, str(group_filter))

    buckets = args.buckets if args.buckets is not None else config.get("buckets", DEFAULT_BUCKETS)
    shard_rows = args.shard_rows if args.shard_rows is not None else config.get("shard_rows", DEFAULT_SHARD_ROWS)
    for name, value in (("buckets", buckets), ("shard-rows", shard_rows)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"--{name} must be a positive integer, got {value!r}")

    fraction = args.max_reject_fraction if args.max_reject_fraction is not None else config.get(
        "max_reject_fraction", DEFAULT_MAX_REJECT_FRACTION
    )
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction <= 1.0:
        raise ConfigError(f"--max-reject-fraction must be a number from 0 to 1, got {fraction!r}")
    max_group_rows = args.max_group_rows if args.max_group_rows is not None else config.get(
        "max_group_rows", DEFAULT_MAX_GROUP_ROWS
    )
    if not isinstance(max_group_rows, int) or isinstance(max_group_rows, bool) or max_group_rows < 1:
        raise ConfigError(f"--max-group-rows must be a positive integer, got {max_group_rows!r}")

    io_threads = args.io_threads if args.io_threads is not None else config.get("io_threads", 0)
    if not isinstance(io_threads, int) or isinstance(io_threads, bool) or io_threads < 0:
        raise ConfigError(f"--io-threads must be 0 (one per core) or a positive integer, got {io_threads!r}")

    device = args.device or config.get("device", "auto")
    if device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"device must be one of auto, cpu, cuda, got {device!r}")
    accelerator = args.accelerator or config.get("accelerator")
    wait_for_lock = args.wait_for_lock if args.wait_for_lock is not None else config.get("wait_for_lock", 0.0)
    if not 0.0 <= wait_for_lock < float("inf"):  # also NaN
        raise ConfigError(f"--wait-for-lock must be a number of seconds >= 0, got {wait_for_lock!r}")

    input_table = args.input_table or config.get("input_table")
    input_format = args.input_format or config.get("input_format", "parquet")
    if input_format not in INPUT_FORMATS:
        raise ConfigError(f"input format must be one of {', '.join(INPUT_FORMATS)}, got {input_format!r}")
    output_db = args.output_db or config.get("output_db")
    output_table = args.output_table or config.get("output_table")
    if bool(output_db) != bool(output_table):
        raise ConfigError("--output-db URL and --output-table NAME go together")
    if output_table and table_name_problem(output_table):  # nothing a user types is ever SQL
        raise ConfigError(table_name_problem(output_table))
    if input_table and input_format != "parquet":
        raise ConfigError("--input-table reads a Trinity-RFT SQL buffer; it takes no --input-format")

    beam_args = _option_flags(config.get("pipeline_options") or {}) + rest
    _check_beam_args(beam_args)
    _check_paths_reach_workers(beam_args, [str(i) for i in inputs], str(output), input_table,
                               bool(args.shared_filesystem or config.get("shared_filesystem", False)))
    cfg = RunConfig(
        inputs=[str(i) for i in inputs],
        output=str(output),
        strategies=strategies,
        params=params,
        algorithm=algorithm,
        buckets=buckets,
        buckets_chosen=args.buckets is not None or config.get("buckets") is not None,
        shard_rows=shard_rows,
        overwrite=bool(args.overwrite if args.overwrite is not None else config.get("overwrite", False)),
        skip_bad_files=bool(args.skip_bad_files if args.skip_bad_files is not None else config.get("skip_bad_files", False)),
        max_reject_fraction=float(fraction),
        max_group_rows=max_group_rows,
        io_threads=io_threads,
        device=device,
        accelerator=str(accelerator) if accelerator else None,
        incremental=bool(args.incremental if args.incremental is not None else config.get("incremental", False)),
        keep_filtered=bool(args.keep_filtered if args.keep_filtered is not None else config.get("keep_filtered", False)),
        audit_columns=bool(args.audit_columns if args.audit_columns is not None else config.get("audit_columns", False)),
        run_name=args.run_name,
        wait=not args.no_wait,
        quiet=args.quiet,
        log_level=args.log_level,
        beam_args=_with_worker_log_level(_with_default_runner(beam_args), args.log_level),
        input_table=str(input_table) if input_table else None,
        input_format=str(input_format),
        output_db=str(output_db) if output_db else None,
        output_table=str(output_table) if output_table else None,
        models=model_options(args, config.get("models")),
        wait_for_lock=float(wait_for_lock),
    )
    if cfg.incremental and cfg.models.enabled:  # the model stage is not wired into incremental runs
        flags = [f"--{k.replace('_', '-')}" for k in ("teacher_model", "logprob_model", "reward_model", "reward_fn")
                 if getattr(cfg.models, k)]
        raise ConfigError(f"{' and '.join(flags)} cannot be used with --incremental (the model stage runs only in one-shot runs); drop --incremental to run the model stage (docs/models.md)")
    _check_runner_extra(cfg.beam_args)
    if cfg.run_name and not cfg.incremental:
        raise ConfigError("--run-name names an --incremental run; pass --incremental or drop --run-name")
    return cfg


def _check_runner_extra(beam_args: list[str]) -> None:
    """The Dataflow runner needs the [gcp] extra where the job is launched (a dry run too):
    without it, one line naming the extra, before any work (Beam's own ImportError would come
    from inside the pipeline's run)."""
    if _runner_name(beam_args) not in ("DataflowRunner", "dataflow", "Dataflow"):
        return
    try:  # by module name: an attribute left on the package by an earlier import does not count
        importlib.import_module("apache_beam.runners.dataflow.internal.apiclient")
    except ImportError:
        raise ConfigError(
            "--runner DataflowRunner needs the [gcp] extra where the job is launched (a --dry_run=True too): "
            "pip install 'rescore[gcp]' (from the repository: .venv/bin/pip install '.[gcp]')"
        ) from None


def local_buckets(rows: int) -> int:
    """The default bucket count of an in-process run of `rows` rows."""
    return min(DEFAULT_BUCKETS, max(8, -(-rows // LOCAL_BUCKET_ROWS)))
