"""Fixtures the readers' tests share (import them into a test module): `store`, over gs and s3,
sets this process's environment for one of the servers of servers.py as a user sets it, GCS
through gcs_xml.py (the requests delta-rs makes that fake-gcs-server lacks)."""

import pytest
from gcs_xml import XmlWrites


@pytest.fixture(scope="module")
def anonymous_gcs():
    """Beam's GCS client connects anonymously at once (an emulator takes no credentials), not
    after ~25 s of retries looking for default credentials."""
    from apache_beam.internal.gcp import auth

    mp = pytest.MonkeyPatch()
    mp.setattr(auth._Credentials, "_credentials_init", True)
    mp.setattr(auth._Credentials, "_credentials", None)
    yield
    mp.undo()


@pytest.fixture(scope="module", params=["gs", "s3"])
def store(request, anonymous_gcs):
    """(scheme, server, the process environment set for it, extra Beam arguments)."""
    mp = pytest.MonkeyPatch()
    if request.param == "gs":
        server = request.getfixturevalue("gcs_server")
        proxy = XmlWrites(server.port).__enter__()
        env = {**server.env, "STORAGE_EMULATOR_HOST": proxy.url}
        beam_args = []
    else:
        server = request.getfixturevalue("s3_server")
        proxy = None
        env = dict(server.env)
        beam_args = list(server.beam_args)
    for k, v in env.items():
        mp.setenv(k, v)
    from apache_beam.io.filesystems import FileSystems

    mp.setattr(FileSystems, "_pipeline_options", None)  # the next reader or run sets its own
    yield request.param, server, env, beam_args
    mp.undo()
    if proxy is not None:
        proxy.__exit__(None, None, None)
