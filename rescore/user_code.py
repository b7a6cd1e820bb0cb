"""Code a user names on the command line as 'package.module:function' (--reward-fn,
--group-filter): the one loader, with one-line errors. Imports nothing of Rescore's but its
errors (no Beam, Arrow or torch), so a verifier's worker process stays light."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from rescore.errors import ConfigError, first_line


def load_function(spec: str, flag: str, error: type[ConfigError] = ConfigError) -> Callable[..., Any]:
    """'package.module:function' -> the function; `error` (one line naming `flag`) where `spec`
    is not of that form, the module does not import (with the first line of why) or has no
    such function."""
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise error(f"{flag} expects module:function, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001  (whatever the user's module raises on import)
        raise error(f"{flag} {spec}: cannot import {module_name} ({type(e).__name__}: {first_line(e, blank='')})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise error(f"{flag} {spec}: {module_name} has no function {name!r}")
    return fn
