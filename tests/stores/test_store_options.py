"""The settings delta-rs gets for a table on a bucket are the ones the user gives Beam
(transforms/files/store_options.py), in every spelling; S3 settings that make a commit unsafe
are refused. No server needed."""

import json

import pytest

from rescore.errors import ConfigError
from rescore.transforms.files.store_options import check_settings, delta_options

S3_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_CONDITIONAL_PUT",
          "AWS_S3_ALLOW_UNSAFE_RENAME", "STORAGE_EMULATOR_HOST")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in S3_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("spelling", [["--s3_endpoint_url", "http://127.0.0.1:9000"], ["--s3_endpoint_url=http://127.0.0.1:9000"]])
def test_beam_s3_flags_in_either_spelling(spelling):
    args = [*spelling, "--s3_access_key_id=K", "--s3_secret_access_key", "S", "--s3_region_name=eu-west-1"]
    assert delta_options("s3://b/t", args) == {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": "K",
        "AWS_SECRET_ACCESS_KEY": "S", "AWS_REGION": "eu-west-1",
    }


def test_environment_and_defaults(monkeypatch):
    assert delta_options("out/table") is None and delta_options("gs://b/t") is None
    assert delta_options("s3://b/t") == {"AWS_REGION": "us-east-1"}  # object_store needs a region, as boto3 assumes
    monkeypatch.setenv("AWS_ENDPOINT_URL", "https://s3.example.com")
    monkeypatch.setenv("AWS_REGION", "ap-south-1")
    assert delta_options("s3://b/t") == {"AWS_ENDPOINT_URL": "https://s3.example.com"}  # https: no AWS_ALLOW_HTTP
    assert delta_options("s3://b/t", ["--s3_disable_ssl"])["AWS_ALLOW_HTTP"] == "true"
    assert delta_options("s3://b/t", ["--s3_endpoint_url=http://h:1"])["AWS_ENDPOINT_URL"] == "http://h:1"  # the flag wins
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:4443")
    key = json.loads(delta_options("gs://b/t")["google_service_account_key"])
    assert key["gcs_base_url"] == "http://127.0.0.1:4443" and key["disable_oauth"] is True


@pytest.mark.parametrize("where", ["env", "option"])
@pytest.mark.parametrize("name, value", [("AWS_CONDITIONAL_PUT", "disabled"), ("AWS_S3_ALLOW_UNSAFE_RENAME", "true")])
def test_settings_that_make_a_commit_unsafe_are_refused(monkeypatch, where, name, value):
    opts = {"AWS_REGION": "us-east-1"}
    if where == "env":
        monkeypatch.setenv(name, value)
    else:
        opts[name.lower()] = value
    with pytest.raises(ConfigError, match=r"^--output s3://b/t: ") as e:
        check_settings("s3://b/t", opts)
    assert "\n" not in str(e.value)
    check_settings("gs://b/t", opts)  # GCS commits are always conditional
    check_settings("out/t", opts)


def test_safe_settings_pass(monkeypatch):
    monkeypatch.setenv("AWS_S3_ALLOW_UNSAFE_RENAME", "false")
    check_settings("s3://b/t", {"aws_conditional_put": "etag"})


def test_a_table_path_in_a_bucket_that_delta_rs_would_cut_or_decode_is_refused():
    """delta-rs takes a bucket path as a URL: '#' and '?' would cut it (the table written
    elsewhere), a percent escape would be decoded on reading. Spaces and Unicode pass."""
    from rescore.transforms.files.delta_table import check_table_path

    for path, said in (("s3://b/day #2", "'#', which delta-rs reads as the start of a URL's fragment"),
                       ("gs://b/t?x=1", "'?', which delta-rs reads as the start of a URL's query"),
                       ("gs://b/t%41", "a percent escape ('%41'), which delta-rs decodes when it reads the table")):
        with pytest.raises(ConfigError) as e:
            check_table_path(path, ConfigError)
        assert str(e.value) == (f"{path}: a Delta table's path in a bucket cannot hold {said}"
                                + (" (it would write the table at the path cut there)" if "URL" in said else "")
                                + "; pick a path without '#', '?' or '%' followed by two hex digits")
    check_table_path("s3://b/tables/день 1 é", ConfigError)
    check_table_path("gs://b/100% done", ConfigError)
