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
