"""Preloaded by the readers' forked runs (test_readers_buckets.py): Beam's GCS client connects
anonymously at once, as the emulator needs, not after ~25 s of retries looking for default
credentials that this machine does not have. Imported for its effect only."""

from apache_beam.internal.gcp import auth

auth._Credentials._credentials_init = True
auth._Credentials._credentials = None
