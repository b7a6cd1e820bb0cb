"""The `rescore` console script (see pipelines.rescore.cli for why it starts this way)."""

import gc


def main() -> None:
    gc.disable()
    from pipelines import rescore

    rescore.cli()
