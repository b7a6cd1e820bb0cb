"""The `rescore` command: parse the command line, dispatch it, say how it went.

    rescore --input 'PATH_OR_GLOB' --output DIR --strategy NAME [--set key=value ...]
            [--config FILE.yaml] [beam options...]
    rescore sample --output DIR [--rows N]      # write sample experience to try it on
    rescore report OUTPUT_DIR [--to DIR]        # report.html and charts of a finished run
    rescore show OUTPUT [--batches]             # rows, batches, runs, pending input (pipelines/show.py)
    rescore strategies [NAME]                   # strategies, or one's parameters and defaults
    rescore configs                             # the shipped run configs (--config NAME)

A run's command line becomes a RunConfig (pipelines/config.py: parse_args) that the job runs,
in whatever mode (pipelines/job.py: run_job); a subcommand goes to its module. Here: the
exit status (0 success, 1 the pipeline failed, 2 bad configuration or input), the one
`rescore: error:` line of a failure, the summary of a success, log records held until the run
ends, and Ctrl-C.

    main(argv)   one command in this process, its exit status returned (tests, Python callers)
    main()       the console script (`rescore`, `python -m rescore`): the process's own command
                 line, started as fast as it can be (below), the exit status via os._exit
"""

from __future__ import annotations

import gc
import logging
import os
import platform
import re
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from rescore import errors
from rescore.pipelines import wording
from rescore.transforms.files.layout import FILTERED_FILES

if TYPE_CHECKING:
    from rescore.transforms.unit_store import Prefetch

log = logging.getLogger("rescore")

EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2
INTERRUPTED = "rescore: interrupted; this run published nothing (an earlier finished run in the output is left as it was)"
USER_ERRORS = errors.USER_ERRORS


def run(argv: list[str] | None = None, *, prefetch: "Prefetch | None" = None) -> dict[str, Any]:
    """Run the job a command line describes; returns the metrics.json document. Raises on failure.

    With Beam's --dry_run=True (Dataflow) the job graph is built and not submitted; the result
    is {"dry_run": True, "job": the runner's job object, ...}. With --no-wait the job is
    submitted and {"submitted": True, ...} returned. With --incremental, see
    pipelines/incremental.py; {"nothing_new": True, ...} when every input file is scored.
    `prefetch`: the first read units the command started decoding (pipelines/early.py).
    """
    from rescore.pipelines.config import parse_args

    cfg = parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.getLogger().setLevel(cfg.log_level)
    from rescore.pipelines import job as job  # Beam: not for option errors and --help

    return job.run_job(cfg, prefetch=prefetch)


def _summary(doc: dict[str, Any], seconds: float) -> str:
    t = doc["totals"]
    rate = t["rows_read"] / seconds if seconds > 0 else 0.0
    reasons = ", ".join(f"{k} {v:,}" for k, v in t["reject_reasons"].items())
    lines = [
        f"rescore: {doc['strategy']} done -> {doc['output']}",
        f"  rows read        {t['rows_read']:>12,}",
        f"  rows written     {t['rows_written']:>12,}"
        + (f"  ({t['rows_written_original']:,} originals + {t['rows_duplicated']:,} copies)" if t["rows_duplicated"] else ""),
        f"  rows duplicated  {t['rows_duplicated']:>12,}",
        f"  rows filtered    {t['rows_filtered']:>12,}  (dropped by the strategy"
        + (f"; kept in {FILTERED_FILES})" if doc.get("keep_filtered") else ", not written)"),
        f"  rows rejected    {t['rows_rejected']:>12,}" + (f"  ({reasons})" if reasons else ""),
        f"  groups           {t['groups']:>12,}  ({t['groups_filtered']:,} filtered, {t['groups_duplicated']:,} copies)",
        f"  batches          {len([b for b in doc['batches'] if b['batch'] is not None]):>12,}",
        f"  wall time        {seconds:>11.1f}s  ({rate:,.0f} rows/s)",
    ]
    for skipped in doc.get("skipped_files", []):
        lines.append(f"  skipped file     {skipped['reason']}")
    return "\n".join(lines)


_BEAM_SOURCE = f"{os.sep}apache_beam{os.sep}"
"""In a log record's pathname: Beam's code logged it (through any logger, the root's too)."""


class _HeldLogs(logging.Handler):
    """Log records (Rescore's warnings, Beam's ERROR log of a failing step, Python warnings) held
    until the run ends: written to stderr after a success, dropped after a failure, whose one
    `rescore: error:` line says what went wrong. Beam's own records (its workers' logs, which a
    multi-process run relays to this process) are dropped after a success too: they are about
    Beam, not the run. --log-level INFO or DEBUG writes everything as it comes."""

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def flush_to(self, stream) -> None:
        for record in self.records:
            if record.name.split(".")[0] == "apache_beam" or _BEAM_SOURCE in (record.pathname or ""):
                continue  # Beam's own records, its workers', its root-logger warnings of a missing
                # optional module (--log-level INFO or DEBUG shows them)
            try:
                stream.write(self.format(record) + "\n")
            except Exception:  # noqa: BLE001  (a log line must never fail the run)
                pass
        self.records.clear()


def _one_line(text: str) -> str:
    """A message as one line, whatever it quotes (a path may hold a newline; a library's message
    terminal colours: errors.plain)."""
    return " ".join(errors.plain(text).splitlines()) if text else text


def _log_level(argv: list[str]) -> str:
    for i, a in enumerate(argv):
        if a in ("--log-level", "--log_level") and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(("--log-level=", "--log_level=")):
            return a.split("=", 1)[1]
    return "WARNING"


def _no_foreign_errors(record: logging.LogRecord) -> bool:
    return record.levelno < logging.ERROR or record.name.split(".")[0] in ("rescore", "pipelines", "transforms", "schemas")


def main(argv: list[str] | None = None, *, from_process: bool = False, prefetch: "Prefetch | None" = None) -> int:
    """The command `argv` in this process; returns its exit status. `from_process`: the
    summary's wall time counts the process's start-up too. With no argv: the console script
    (see the module doc), which does not return."""
    if argv is None:
        _console()
    started = time.monotonic()
    # One clock for the progress lines and the summary's wall time: from the process's start
    # (wording.process_seconds) for the console script, from this call for a Python caller.
    import rescore

    wording.start_run_clock(rescore._STARTED if from_process else started)
    try:
        return _main_logged(list(argv), started, from_process, prefetch)
    finally:
        wording.start_run_clock(None, stop=True)  # a later run() without main() keeps its own clock


def _main_logged(argv: list[str], started: float, from_process: bool, prefetch: "Prefetch | None") -> int:
    """main() past its clock: the log records held or streamed, then the command."""
    level = _log_level(argv)
    if argv[:1] in (["sample"], ["report"]) or level in ("DEBUG", "INFO"):
        logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.WARNING)
        if level == "INFO":  # Beam's ERROR log of a failed step repeats the error line, with a traceback
            for handler in logging.getLogger().handlers:
                handler.addFilter(_no_foreign_errors)
        return _main(argv, None, started, from_process, prefetch)
    held = _HeldLogs()
    root = logging.getLogger()
    # A handler that writes records to stderr as they come is set aside while the logs are held:
    # a library's import may have made one (a module-level logging.warning() with no handler
    # installed calls logging.basicConfig: Beam's import does where a module of the [gcp] extra
    # is missing), and it would write Beam's ERROR log of a failed step, a traceback, under the
    # one error line. With or without the extra, stderr is the same.
    streaming = [h for h in root.handlers if _writes_to_stderr(h)]
    for handler in streaming:
        root.removeHandler(handler)
    root.addHandler(held)
    logging.captureWarnings(True)
    try:
        code = _main(argv, held, started, from_process, prefetch)
    finally:
        root.removeHandler(held)
        for handler in streaming:
            root.addHandler(handler)
        logging.captureWarnings(False)
    return code


def _writes_to_stderr(handler: logging.Handler) -> bool:
    """A plain stream handler on this process's stderr (not a file's, not a test's capture)."""
    if not isinstance(handler, logging.StreamHandler) or isinstance(handler, logging.FileHandler):
        return False
    stream = getattr(handler, "stream", None)
    if stream is sys.stderr or stream is sys.__stderr__:
        return True
    try:
        return stream.fileno() == 2
    except (AttributeError, OSError, ValueError):
        return False


def _main(argv: list[str], held: _HeldLogs | None, started: float, from_process: bool, prefetch: "Prefetch | None" = None) -> int:
    """The command; with `held`, log records are written only after a success."""
    if argv[:1] == ["sample"]:
        from rescore.pipelines import sample

        return sample.main(argv[1:])
    if argv[:1] == ["report"]:
        from rescore.pipelines import report

        return report.main(argv[1:])
    if not argv:
        from rescore.pipelines.config import usage

        print(usage(), file=sys.stderr)
        return EXIT_CONFIG
    if argv[:1] == ["show"]:
        from rescore.pipelines import show

        return show.main(argv[1:])
    if argv[:1] == ["task-stats"]:
        from rescore.pipelines import task_stats

        return task_stats.main(argv[1:])
    if argv[:1] == ["export"]:
        from rescore.pipelines import export

        return export.main(argv[1:])
    if argv[:1] in (["strategies"], ["configs"]):
        from rescore.pipelines import listings

        try:
            return getattr(listings, argv[0])(argv[1:])
        except BrokenPipeError:  # `rescore strategies | head`
            sys.stdout = open(os.devnull, "w")
            return EXIT_OK
    quiet = "--quiet" in argv
    try:
        doc = run(argv, prefetch=prefetch)
    except USER_ERRORS as e:
        print(f"rescore: error: {_one_line(str(e))}", file=sys.stderr)
        return EXIT_CONFIG
    except errors.RUN_FAILURES as e:
        print(f"rescore: error: {_one_line(str(e))}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        return EXIT_FAILED
    except Exception as e:  # a pipeline failure: one line here, the traceback at DEBUG
        log.debug("pipeline failed", exc_info=True)
        print(f"rescore: error: pipeline failed: {errors.last_line(e)}", file=sys.stderr)
        return EXIT_FAILED
    if held is not None:
        held.flush_to(sys.stderr)
    if doc.get("dry_run"):
        if not quiet:
            print(f"rescore: dry run: the job graph for {doc['strategy']} was built and not submitted", file=sys.stderr)
        return EXIT_OK
    if doc.get("submitted"):
        if not quiet:
            print(f"rescore: submitted job {doc.get('job_id') or ''} -> {doc['output']} (not waiting)", file=sys.stderr)
        return EXIT_OK
    if doc.get("buffer") and not quiet:
        b = doc["buffer"]
        print(f"rescore: wrote {b['rows']:,} experiences to buffer {b['table']!r} in {b['url']}", file=sys.stderr)
    if doc.get("nothing_new"):
        if not quiet:
            print(f"rescore: {doc['message']}", file=sys.stderr)
        return EXIT_OK
    if not quiet:
        if "totals" in doc:
            print(_summary(doc, wording.run_seconds()), file=sys.stderr)
        if doc.get("incremental", {}).get("summary"):
            print(doc["incremental"]["summary"], file=sys.stderr)
    return EXIT_OK


def _interrupt(signum, frame):
    """Ctrl-C or SIGTERM: stop now, not after the running steps (which may take minutes).

    Stopping anywhere is safe (output is staged and _SUCCESS comes last, as with kill -9); the
    output lock goes with the process."""
    try:
        sys.stderr.write(INTERRUPTED + "\n")
        sys.stderr.flush()
    finally:
        os._exit(EXIT_FAILED)


def _main_with_one_line_stderr(argv: list[str], prefetch: "Prefetch | None" = None) -> int:
    """main() with file descriptor 2 sent to a temporary file while it runs, and sys.stderr kept
    on the real stderr: what other processes and libraries write there directly (Beam's worker
    processes log their tracebacks to the stderr they inherit) is shown after a success and
    dropped after a failure, whose one `rescore: error:` line says what went wrong. Beam's workers
    (the multi-process runner) write their logs there, tens of lines a run: after a success only
    what is not a worker's log line is shown (--log-level INFO or DEBUG streams it all)."""
    import tempfile

    sys.stderr.flush()
    real = os.dup(2)
    spill = tempfile.TemporaryFile()
    os.dup2(spill.fileno(), 2)
    sys.stderr = os.fdopen(real, "w", buffering=1, encoding="utf-8", errors="backslashreplace")
    code = main(argv, from_process=True, prefetch=prefetch)
    sys.stderr.flush()
    if code == EXIT_OK:
        spill.seek(0)
        extra = _without_worker_logs(spill.read())
        if extra:
            os.write(real, extra)
    return code


_WORKER_LOG = re.compile(
    rb"^(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL|[IWEF]\d{4} )\S*|\S+ (?:DEBUG|INFO|WARNING|ERROR):apache_beam|"
    rb".*apache_beam[./]|.*(?:sdk_worker|worker_pool_main|grpc|absl)\b)"
)


_EXCEPTION_LINE = re.compile(rb"^[\w.]+(?:Error|Exception|Exit|Interrupt|Warning)\b")


def _without_worker_logs(text: bytes) -> bytes:
    """What other processes wrote to stderr, less Beam's worker processes' log lines (Python
    logging's `LEVEL:name:message`, gRPC's and absl's `I0101 ...`, lines naming Beam's modules)
    and the tracebacks under them."""
    kept, skipping = [], False
    for line in text.splitlines(keepends=True):
        if _WORKER_LOG.match(line):
            skipping = True
            continue
        if skipping and (line[:1] in (b" ", b"\t") or line.startswith((b"Traceback", b"During handling"))
                         or _EXCEPTION_LINE.match(line)):
            continue
        skipping = False
        kept.append(line)
    return b"".join(kept)


def run_command_line(prefetch: "Prefetch | None" = None) -> None:
    """The console script's command: main(), then exit without the interpreter's teardown.

    Importing Beam and torch builds about a million Python objects. The entry points import
    them with the garbage collector off (a collection then finds nothing to free) and freeze
    them, so later collections skip them; at exit, tearing them down would take ~1 s on a
    2-core machine, after every output is already renamed into place and flushed.
    """
    gc.freeze()
    gc.enable()
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)  # a scheduler's kill: the same one line as Ctrl-C
    argv = sys.argv[1:]
    if argv[:1] in (["sample"], ["report"]) or _log_level(argv) in ("DEBUG", "INFO"):
        code = main(argv, from_process=True, prefetch=prefetch)
    else:
        code = _main_with_one_line_stderr(argv, prefetch)
    if "apache_beam.runners.portability.job_server" in sys.modules:
        # A portable runner (Flink's, Spark's) started a job server JVM and registered its stop
        # with atexit; os._exit skips atexit, which left one JVM behind per run.
        import atexit

        # Beam logs "Really destroying service at localhost:PORT" (a warning) when it stops the
        # job server it started: expected here, and it would land after the run's summary.
        logging.getLogger("apache_beam.utils.subprocess_server").setLevel(logging.ERROR)
        atexit._run_exitfuncs()
    if "rescore.transforms.verifier" in sys.modules:  # what an in-process verifier started ends with the command
        sys.modules["rescore.transforms.verifier"].end_in_process()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


DECAY_ENV = "RESCORE_ARROW_DECAY_MS"  # options.ARROW_DECAY_ENV (not imported here: the options import numpy)
DEFAULT_DECAY_MS = 3000
"""How long Arrow's jemalloc keeps freed pages for the next allocation before handing them back
to the kernel. pyarrow's default, 0, hands every freed page back at once: the parquet reader's
growing buffers then land on fresh pages the kernel must zero, and a 1,024,000-row run took ~3.0M
page faults (~9 s of system time). 3 s spans the time between one read unit's buffers being
freed and the next unit's decode: ~1.8M faults, ~2.5 s less system time, peak memory +~2 %
(benchmarks/README.md). Only which pages are reused changes, never a value."""


def keep_freed_pages(argv: list[str] | None = None) -> None:
    """Set Arrow's jemalloc decay (RESCORE_ARROW_DECAY_MS, default 3000 ms; 0 under a memory
    budget, where freed pages held for the next read would count against it: ~180 MB of the
    peak at 204,800 rows, benchmarks/README.md) before pyarrow makes its first arena; nothing
    where Arrow's default pool is another allocator. `argv`: the command line (None: the process's)."""
    from rescore.pipelines.options import arrow_decay_ms

    try:  # checked whatever the pool, like every RESCORE_* value (pipelines/options.py)
        decay = arrow_decay_ms(0 if _under_budget(sys.argv[1:] if argv is None else argv) else DEFAULT_DECAY_MS)
    except errors.ConfigError as e:
        sys.stderr.write(f"rescore: error: {e}\n")
        raise SystemExit(2) from None
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL") != "jemalloc":
        return
    import pyarrow as pa  # the job imports it anyway; the decay must be set before any allocation

    try:
        pa.jemalloc_set_decay_ms(decay)
    except (NotImplementedError, pa.ArrowException):  # a pyarrow built without jemalloc
        pass


def _under_budget(argv: list[str]) -> bool:
    """A memory budget applies to this run: --memory-mb (or its environment variable) or a container's
    memory limit (transforms/memory.py)."""
    from rescore.pipelines.early import memory_budget_given
    from rescore.transforms.memory import container_limit  # no Beam, no pyarrow

    return memory_budget_given(argv) or container_limit() is not None


def _console() -> None:
    """The console script: what must happen before the heavy imports, then the command."""
    # Before torch loads OpenMP: idle intra-op threads sleep instead of spinning. Spinning threads
    # took the cores the I/O threads decode and encode on (a 200k-row run: ~3 CPU-s, and scoring
    # 13 s instead of 0.1 s on a loaded machine). The thread count, hence every result, is unchanged.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # Before numpy loads its OpenBLAS: Rescore does no numpy linear algebra, and OpenBLAS's
    # worker threads spin ~0.1 CPU-s after numpy's import, on the core the prefetch decodes on
    # during the imports. Values are unchanged. x86-64 only, where torch's BLAS is MKL: on ARM
    # torch may use OpenBLAS itself, and the model stage's matrix products need its threads.
    if platform.machine().lower() in ("x86_64", "amd64"):
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # Before pyarrow makes its default memory pool: jemalloc hands freed decode buffers back to
    # the next read instead of fresh pages the kernel must zero (a 204,800-row run: ~0.9 CPU-s,
    # ~5 % wall, lower peak memory than pyarrow's default mimalloc). Values are unchanged.
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
    gc.disable()
    keep_freed_pages()
    from rescore.pipelines.early import lean_imports, prefetch_from

    prefetch = prefetch_from(sys.argv[1:])  # the first read units decode while Beam and torch import
    # A plain local run does not load Beam's optional integrations nor pandas (pipelines/early.py).
    with lean_imports(sys.argv[1:]):
        # Beam's import logs what it misses where an extra is not installed (the [gcp] extra: its GCS
        # file system, apitools), once through the root logger, which with no handler installed calls
        # logging.basicConfig: a stderr handler for the rest of the run. Caught here and dropped, so
        # that the command says the same with or without the extra.
        root = logging.getLogger()
        beams_import = logging.NullHandler()
        root.addHandler(beams_import)
        try:
            from rescore.pipelines import job  # noqa: F401  (Beam, imported with the collector off; frozen next)
        finally:
            root.removeHandler(beams_import)
    if prefetch is not None:
        prefetch.imports_done()
    run_command_line(prefetch)

if __name__ == "__main__":  # `python pipelines/cli.py ...` (a scheduler's py_file): the console script
    main()
