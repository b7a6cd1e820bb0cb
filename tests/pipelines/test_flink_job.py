"""pipelines/flink_job.py without a cluster: the launcher's handling of Beam's message thread,
checked on a real process's stderr (pytest installs a thread-exception hook of its own)."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import sys, threading, time
    from rescore.pipelines import flink_job

    def raise_later(delay, name):
        def body():
            time.sleep(delay)
            raise RuntimeError(name + " lost its stream")
        t = threading.Thread(target=body, name=name, daemon=True)
        t.start()
        return t

    name = flink_job.MESSAGE_THREAD if sys.argv[1] == "reader" else sys.argv[1]
    before = threading.excepthook
    with flink_job.quiet_message_thread():
        t = raise_later(0.3, name)  # still running when the block ends, as after a lost job server
    t.join()
    print(threading.excepthook is before)
""")


def _run(name: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, name], capture_output=True, text=True, timeout=60)


def test_the_message_threads_traceback_is_dropped_even_when_it_ends_after_the_run_raised():
    """CI saw Beam's reader thread die after wait_until_finish had raised and the hook was gone:
    its traceback landed under the run's one error line. The hook now outlives the thread."""
    done = _run("reader")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.strip() == "True"  # the thread ended: the previous hook is back


def test_any_other_threads_traceback_is_still_printed():
    done = _run("someone-else")
    assert "Traceback" in done.stderr and "RuntimeError: someone-else lost its stream" in done.stderr
