"""The `rescore` console script (see rescore.pipelines.rescore.cli for why it starts this way)."""

import gc


def main() -> None:
    gc.disable()
    from rescore.pipelines import rescore

    rescore.cli()
