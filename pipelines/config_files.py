"""--config YAML files: a path, or the name of a config that ships with Rescore; read, its keys
and value types checked (pipelines/options.py: check_config), its pipeline_options turned into
Beam flags."""

from __future__ import annotations

import json
import os
from typing import Any

import yaml

from rescore.errors import ConfigError, first_line
from rescore.pipelines.options import check_config


def shipped_configs() -> dict[str, str]:
    """{name: path} of the run configs that ship with Rescore (the repository's run_configs/,
    installed as package data): `--config NAME` or `--config run_configs/NAME.yaml` finds them
    from any directory; `rescore configs` lists them."""
    from rescore import run_configs

    directory = os.path.dirname(os.path.abspath(run_configs.__file__))
    return {n[: -len(".yaml")]: os.path.join(directory, n) for n in sorted(os.listdir(directory)) if n.endswith(".yaml")}


def _config_path(path: str) -> str:
    """`path` where it exists; else the shipped config it names (`local`, `local.yaml`,
    `run_configs/local.yaml`)."""
    if os.path.exists(path):
        return path
    head, name = os.path.split(path)
    if head in ("", "run_configs", "./run_configs"):
        shipped = shipped_configs().get(name[: -len(".yaml")] if name.endswith(".yaml") else name)
        if shipped:
            return shipped
    return path


def load_yaml(path: str) -> dict[str, Any]:
    given, path = path, _config_path(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except OSError as e:
        shipped = ", ".join(shipped_configs())
        raise ConfigError(
            f"cannot read config {given}: {e.strerror}" + (f" (shipped configs: {shipped}; `rescore configs` lists them)" if shipped else "")
        ) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config {path} is not valid YAML: {first_line(e)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config {path} must be a mapping of keys to values")
    check_config(path, data)
    return data


def pipeline_option_flags(options: dict[str, Any]) -> list[str]:
    """YAML pipeline_options -> Beam command-line flags."""
    from rescore.pipelines.flink_options import FLINK_OPTIONS
    flags = []
    for key, value in options.items():
        name = f"--{key}"
        if value is True:
            flags.append(name)
        elif value is False and key in FLINK_OPTIONS:  # a Java option whose default may be true
            flags.append(f"{name}=false")
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            flags += [f"{name}={v}" for v in value]
        elif isinstance(value, dict):
            flags.append(f"{name}={json.dumps(value)}")
        else:
            flags.append(f"{name}={value}")
    return flags
