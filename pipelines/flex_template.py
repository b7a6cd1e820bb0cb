"""Dataflow Flex Template entry point (FLEX_TEMPLATE_PYTHON_PY_FILE in the Dockerfile).

The launcher passes the template parameters (flex_template/metadata.json) and Dataflow's own
options as --name=value flags; this submits the job and returns without waiting, as a
launcher must.
"""

import os
import sys

from rescore.pipelines.cli import main

if __name__ == "__main__":
    sys.exit(main([*sys.argv[1:], "--no-wait"]))
