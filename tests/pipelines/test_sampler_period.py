"""An in-process run lowers Beam's state-sampler period (pipelines/rescore.shorten_sampler_period):
every bundle's end joins the sampler thread, which sleeps up to the period between samples."""

import pytest
from apache_beam.runners.worker import statesampler
from apache_beam.utils.counters import CounterFactory
from data import random_rows, write_parquet

from rescore.pipelines import job as job


@pytest.fixture
def beams_default():
    """Beam's own default for the test, restored after it."""
    init = statesampler.StateSampler.__init__
    saved = init.__defaults__
    init.__defaults__ = (statesampler.DEFAULT_SAMPLING_PERIOD_MS,)
    yield init
    init.__defaults__ = saved


@pytest.mark.slow
def test_an_in_process_run_samples_every_20_ms_at_most(tmp_path, rescore, beams_default):
    assert statesampler.StateSampler("x", CounterFactory()).sampling_period_ms == 200  # Beam's default
    glob = write_parquet(random_rows(seed=5), str(tmp_path / "in"), files=1)
    doc, _ = rescore(glob, "--strategy", "grpo")
    assert doc["totals"]["rows_written"] > 0
    assert beams_default.__defaults__ == (job.SAMPLER_PERIOD_MS,) == (20,)
    assert statesampler.StateSampler("x", CounterFactory()).sampling_period_ms == 20


def test_another_beam_signature_is_left_alone(beams_default):
    beams_default.__defaults__ = (500,)  # not the default this was written for
    job.shorten_sampler_period()
    assert beams_default.__defaults__ == (500,)
    beams_default.__defaults__ = (statesampler.DEFAULT_SAMPLING_PERIOD_MS,)
    job.shorten_sampler_period()
    assert beams_default.__defaults__ == (20,)
