"""`python -m rescore ...`: the same as the `rescore` console script."""

from rescore.pipelines.cli import main

main()
