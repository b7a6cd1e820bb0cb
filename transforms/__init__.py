"""Beam PTransforms of the rescoring pipeline (ReadExperiences, ScoreGroups, WriteScored) and,
in `transforms.strategies`, the pure scoring math they wrap."""


def _quiet_beam_import_noise() -> None:
    """Beam's import logs 'apitools not found' at WARNING when the [gcp] extra is absent;
    it says nothing about a Rescore run, so keep it out of the user's terminal."""
    import logging

    class _Drop(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return "apitools not found" not in str(record.msg)

    logging.getLogger().addFilter(_Drop())


_quiet_beam_import_noise()
