"""The rescore command makes torch's idle OpenMP threads sleep (OMP_WAIT_POLICY=PASSIVE) before
torch is imported, and gives numpy's OpenBLAS one thread (OPENBLAS_NUM_THREADS=1: no numpy linear
algebra runs) before numpy is imported, unless the user chose otherwise."""

import os
import platform
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The job module (Beam, torch) is stood in for by an empty module, and the command that would run
# after it by a report of what the console entry point had done when it got there.
PROBE = """
import os, sys, types
sys.modules["rescore.pipelines.job"] = types.ModuleType("rescore.pipelines.job")
from rescore.pipelines import cli
assert "numpy" not in sys.modules, "numpy imported before the entry point ran"
cli.run_command_line = lambda prefetch=None: sys.exit(print(  # the command never returns
    os.environ.get("OMP_WAIT_POLICY"), os.environ.get("OPENBLAS_NUM_THREADS"), "torch" in sys.modules))
cli.main()
"""


def probe(**env) -> str:
    environ = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OPENBLAS_NUM_THREADS")}
    environ.update(env, PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-c", PROBE], env=environ, capture_output=True, text=True, check=True)
    return done.stdout.strip()


X86 = platform.machine().lower() in ("x86_64", "amd64")  # elsewhere torch may use OpenBLAS itself
BLAS = "1" if X86 else "None"


def test_idle_openmp_threads_sleep_and_torch_is_not_loaded_before():
    assert probe() == f"PASSIVE {BLAS} False"


@pytest.mark.slow
def test_the_users_choice_wins():
    assert probe(OMP_WAIT_POLICY="ACTIVE") == f"ACTIVE {BLAS} False"
    assert probe(OPENBLAS_NUM_THREADS="4") == "PASSIVE 4 False"
