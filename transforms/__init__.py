"""Beam PTransforms of the rescoring pipeline (ReadExperiences, ScoreGroups, PlanCopies,
WriteScored, Finalize); the row work they call is in `transforms.rows`, the pure scoring math in
`transforms.strategies`."""


def _quiet_beam_import_noise() -> None:
    """Beam's import logs 'apitools not found' at WARNING when the [gcp] extra is absent;
    it says nothing about a Rescore run, so keep it out of the user's terminal."""
    import logging

    class _Drop(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return "apitools not found" not in str(record.msg)

    logging.getLogger().addFilter(_Drop())


_quiet_beam_import_noise()
