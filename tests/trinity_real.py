"""The real trinity-rft 0.6.0 code (installed with `pip install --no-deps trinity-rft==0.6.0`)
imported without its heavy dependencies (ray, verl, vllm, transformers): the few modules the
SQL buffer needs are loaded as they are, their package __init__ files (which import the whole
trainer) and the modules they name only for other storage kinds are replaced by stubs.

    trinity = load()            # None (with `why`) where it cannot be imported
    trinity.Experience          # trinity.common.experience.Experience
    trinity.write(url, name, experiences)      # SQLExperienceStorage.write
    trinity.read(url, name, n)                 # SQLExperienceStorage.read (the trainer's path)
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import os
import sys
import types
from types import SimpleNamespace

why = ""


def _stub(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


def _package(name: str, path: str) -> None:
    """Register package `name` at `path` without running its __init__.py."""
    mod = types.ModuleType(name)
    mod.__path__ = [path]
    sys.modules[name] = mod


class _Namespace(SimpleNamespace):
    pass


def load():
    global why
    spec = importlib.util.find_spec("trinity")
    if spec is None or not spec.submodule_search_locations:
        why = "trinity-rft is not installed (pip install --no-deps trinity-rft==0.6.0)"
        return None
    for dep in ("safetensors", "omegaconf", "aiosqlite"):
        if importlib.util.find_spec(dep) is None:
            why = f"trinity-rft's {dep} is not installed (pip install -e '.[test]')"
            return None
    root = list(spec.submodule_search_locations)[0]
    if "ray" not in sys.modules:
        ray = _stub("ray", remote=lambda *a, **k: None, get_runtime_context=lambda: None, is_initialized=lambda: False)
        ray.__path__ = []
    _package("trinity.buffer", os.path.join(root, "buffer"))
    _package("trinity.buffer.storage", os.path.join(root, "buffer", "storage"))
    # sql.py imports these for task buffers only; the experience path never touches them.
    _stub("trinity.common.rewards", REWARD_FUNCTIONS={})
    _stub("trinity.common.workflows", WORKFLOWS={}, Task=object)
    try:
        version = importlib.import_module("trinity").__version__
        experience = importlib.import_module("trinity.common.experience")
        sql = importlib.import_module("trinity.buffer.storage.sql")
    except Exception as e:  # noqa: BLE001
        why = f"trinity-rft does not import here: {type(e).__name__}: {e}"
        return None
    if version != "0.6.0":
        why = f"trinity-rft {version} is installed; these tests pin 0.6.0"
        return None

    def _config(url: str, name: str, batch: int):
        return SimpleNamespace(
            name=name, path=url, schema_type="experience", storage_type="sql", max_read_timeout=5,
            batch_size=batch, replay_buffer=None, max_retry_times=1, max_retry_interval=0.1, index=0,
        )

    def write(url: str, name: str, experiences) -> None:
        async def go():
            storage = sql.SQLExperienceStorage(_config(url, name, len(experiences)))
            await storage.write(experiences)
            await storage.engine.dispose()

        asyncio.run(go())

    def read(url: str, name: str, n: int):
        async def go():
            storage = sql.SQLExperienceStorage(_config(url, name, n))
            out = await storage.read(n)
            await storage.engine.dispose()
            return out

        return asyncio.run(go())

    return _Namespace(Experience=experience.Experience, EID=experience.EID, sql=sql, write=write, read=read)
