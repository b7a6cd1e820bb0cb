"""Flink's own pipeline options, by name: the options Beam's Flink runner (Java) reads that
Beam's Python SDK does not define.

Beam's Python SDK forwards a flag it does not know to the job server as a string (a bare flag as
`true`); the Java runner maps `snake_case` to its camelCase option and converts the value. Rescore
refuses every flag that is neither its own nor a Beam option (a typo fails instead of being
dropped), so the Flink runner's options are listed here, with the Java type each has, and are
accepted only with `--runner FlinkRunner`, with their values checked before any work.

The list is Beam's Java `FlinkPipelineOptions` (and `VersionDependentFlinkPipelineOptions`) of
the job server Rescore runs (beam-runners-flink-1.19 2.62.0, read from its jar with `javap`), and
the Java `PortablePipelineOptions`/`ApplicationNameOptions` the runner honours, less those Beam's
Python SDK defines itself (`--flink_master`, `--parallelism`, `--max_parallelism`,
`--environment_*`, `--sdk_worker_parallelism`, `--environment_cache_millis`, `--job_endpoint`,
`--job_server_timeout`, `--output_executable_path`, `--files_to_stage`, `--streaming`,
`--job_name`, ...: Python's FlinkRunnerOptions and PortableOptions, checked by Beam's parser).
"""

from __future__ import annotations

BOOL = "true or false"
INT = "a whole number"
TEXT = "text"

FLINK_OPTIONS: dict[str, str | tuple[str, ...]] = {
    # execution (batch)
    "execution_mode_for_batch": ("PIPELINED", "PIPELINED_FORCED", "BATCH", "BATCH_FORCED"),
    "object_reuse": BOOL,
    "operator_chaining": BOOL,
    "max_bundle_size": INT,
    "max_bundle_time_mills": INT,
    "re_iterable_group_by_key_result": BOOL,
    "faster_copy": BOOL,
    "use_data_stream_for_batch": BOOL,
    "file_input_split_max_size_m_b": INT,  # Java's fileInputSplitMaxSizeMB, as Beam spells it in snake case
    "auto_balance_write_files_sharding_enabled": BOOL,
    "disable_metrics": BOOL,
    "latency_tracking_interval": INT,
    "auto_watermark_interval": INT,
    "attached_mode": BOOL,
    "job_check_interval_in_secs": INT,
    "flink_conf_dir": TEXT,
    # recovery (streaming jobs; a batch job's restarts come from the cluster's restart strategy)
    "number_of_execution_retries": INT,
    "execution_retry_delay": INT,
    # checkpointing and state (streaming)
    "checkpointing_interval": INT,
    "checkpointing_mode": ("EXACTLY_ONCE", "AT_LEAST_ONCE"),
    "checkpoint_timeout_millis": INT,
    "min_pause_between_checkpoints": INT,
    "num_concurrent_checkpoints": INT,
    "fail_on_checkpointing_errors": BOOL,
    "finish_bundle_before_checkpointing": BOOL,
    "unaligned_checkpoint_enabled": BOOL,
    "force_unaligned_checkpoint_enabled": BOOL,
    "externalized_checkpoints_enabled": BOOL,
    "retain_externalized_checkpoints_on_cancellation": BOOL,
    "report_checkpoint_duration": TEXT,
    "shutdown_sources_after_idle_ms": INT,
    "state_backend": ("rocksdb", "hashmap", "filesystem"),
    "state_backend_factory": TEXT,
    "state_backend_storage_path": TEXT,
    "savepoint_path": TEXT,
    "allow_non_restored_state": BOOL,
    "enable_stable_input_drain": BOOL,
    # the portable runner's Java options Python does not define
    "environment_expiration_millis": INT,
    "load_balance_bundles": BOOL,
    "enable_heap_dumps": BOOL,
    "app_name": TEXT,
}
"""{option name: its type} for every option Beam's Flink runner reads that Beam's Python SDK
does not define: BOOL, INT, TEXT or the tuple of the values Java accepts."""

TRUE_BY_DEFAULT = ("operator_chaining", "attached_mode", "fail_on_checkpointing_errors")
"""The boolean options whose Java default is true (@Default.Boolean(true)); every other one's is false."""

FLINK_RUNNERS = ("flinkrunner", "flink")


def is_flink(runner: str | None) -> bool:
    return (runner or "").rsplit(".", 1)[-1].lower() in FLINK_RUNNERS


def _value_problem(name: str, value: str | None) -> str | None:
    kind = FLINK_OPTIONS[name]
    if kind == BOOL:
        if value is None or value.lower() in ("true", "false"):
            return None
        return f"--{name} takes true or false, got {value!r}"
    if value is None:
        return f"--{name} needs a value ({kind if isinstance(kind, str) else ', '.join(kind)})"
    if kind == INT:
        try:
            int(value)
        except ValueError:
            return f"--{name} takes {INT}, got {value!r}"
    elif isinstance(kind, tuple) and value not in kind:
        return f"--{name} takes one of {', '.join(kind)}, got {value!r}"
    return None


def as_beam_passes_them(flink: list[str]) -> list[str]:
    """The checked Flink options (split_flink_options) as Beam's Python FlinkRunner forwards them.

    Beam asks the job server for its options (DescribePipelineOptions) and parses the command
    line with them: an integer or text option as `--name=value`; a boolean option only as a bare
    flag, which sets the opposite of the Java default (`--operator_chaining` turns chaining off;
    `--object_reuse=true` is an argparse error at submission). So a boolean given its default is
    dropped, and one given the other value becomes the bare flag."""
    out = []
    for flag in flink:
        name, eq, value = flag[2:].partition("=")
        if FLINK_OPTIONS[name] == BOOL:
            wanted = True if not eq else value.lower() == "true"
            if wanted != (name in TRUE_BY_DEFAULT):
                out.append(f"--{name}")
        else:
            out.append(flag)
    return out


def split_flink_options(args: list[str], runner: str | None) -> tuple[list[str], list[str]]:
    """(the Flink options of `args`, the rest), each Flink option's value checked. A Flink option
    with another runner, or with a bad value, is a one-line problem (ValueError). A bare boolean
    flag means true (`--object_reuse`, as a Beam flag reads)."""
    flink, rest = [], []
    i = 0
    while i < len(args):
        a = args[i]
        name, eq, value = a[2:].partition("=") if a.startswith("--") else ("", "", "")
        if name not in FLINK_OPTIONS:
            rest.append(a)
            i += 1
            continue
        if not eq:  # `--name VALUE`, or a bare boolean flag
            nxt = args[i + 1] if i + 1 < len(args) else None
            if nxt is not None and not nxt.startswith("-") and (FLINK_OPTIONS[name] != BOOL or nxt.lower() in ("true", "false")):
                value = nxt
                i += 1
            else:
                value = None
        if not is_flink(runner):
            raise ValueError(f"--{name} is an option of Beam's Flink runner: it needs --runner FlinkRunner "
                             f"(this run's runner: {runner or 'the default, in-process'})")
        problem = _value_problem(name, value)
        if problem:
            raise ValueError(problem)
        flink.append(f"--{name}" if value is None else f"--{name}={value}")
        i += 1
    return flink, rest
