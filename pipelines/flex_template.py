"""Dataflow Flex Template entry point (FLEX_TEMPLATE_PYTHON_PY_FILE in the Dockerfile).

The launcher passes the template parameters (flex_template/metadata.json) and Dataflow's own
options as --name=value flags; this submits the job and returns without waiting, as a
launcher must.
"""

import os
import sys

if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # run as a file: this folder's rescore.py would shadow the package `rescore`

from rescore.pipelines.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main([*sys.argv[1:], "--no-wait"]))
