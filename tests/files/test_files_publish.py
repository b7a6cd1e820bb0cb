"""ownership.publish over a finished local output: the new files replace the old ones, and the
old files' descriptors (held so the kernel frees their pages off the publish's path) are all
closed once it returns (no file of the last run stays open, deleted or not)."""

from __future__ import annotations

import json
import os
import threading

from rescore.transforms.files import ownership
from rescore.transforms.files.layout import LEDGER, STAGING


def _open_deleted() -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.endswith(" (deleted)"):
            found.append(target)
    return found


def _stage(out, names, content):
    staging = out / STAGING
    staging.mkdir(exist_ok=True)
    for name in names:
        (staging / name).write_bytes(content)
    return [str(staging / n) for n in names]


def test_publish_replaces_the_last_run_and_closes_what_it_held(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    ownership.prepare(str(out), overwrite=False)
    first = _stage(out, ["scored-00000-of-00002.parquet", "scored-00001-of-00002.parquet"], b"old" * 1000)
    ownership.publish(str(out), first, "{}\n", failed=False)
    assert sorted(os.listdir(out)) == sorted([LEDGER, "_SUCCESS", "metrics.json", *[os.path.basename(p) for p in first]])

    before = _open_deleted()
    # The next run writes one file of the two: the one is replaced, the other deleted.
    second = _stage(out, ["scored-00000-of-00002.parquet"], b"new")
    ownership.publish(str(out), second, '{"run": 2}\n', failed=False)
    for t in threading.enumerate():
        if t.name == "rescore-free-replaced":
            t.join(10)
    assert (out / "scored-00000-of-00002.parquet").read_bytes() == b"new"
    assert not (out / "scored-00001-of-00002.parquet").exists() and not (out / STAGING).exists()
    assert json.loads((out / LEDGER).read_text())["files"] == ["_SUCCESS", "metrics.json", "scored-00000-of-00002.parquet"]
    assert (out / "metrics.json").read_text() == '{"run": 2}\n'
    assert _open_deleted() == before  # the replaced and the deleted file: closed, not leaked


def test_publish_never_blocks_on_a_fifo_or_follows_a_link_in_the_old_run(tmp_path):
    """An old run's file replaced by a FIFO (opening it for reading would wait for a writer
    forever) or by a link to a file elsewhere: the publish neither blocks nor holds the link's
    target; the FIFO and the link are replaced like any old file, the target is left alone."""
    out = tmp_path / "out"
    out.mkdir()
    ownership.prepare(str(out), overwrite=False)
    names = ["scored-00000-of-00002.parquet", "scored-00001-of-00002.parquet"]
    ownership.publish(str(out), _stage(out, names, b"old"), "{}\n", failed=False)
    os.remove(out / names[0])
    os.mkfifo(out / names[0])
    elsewhere = tmp_path / "elsewhere.parquet"
    elsewhere.write_bytes(b"not ours")
    os.remove(out / names[1])
    os.symlink(elsewhere, out / names[1])

    before = _open_deleted()
    done = threading.Event()
    worker = threading.Thread(target=lambda: (ownership.publish(str(out), _stage(out, names, b"new"), "{}\n", failed=False), done.set()), daemon=True)
    worker.start()
    worker.join(20)
    assert done.is_set(), "publish blocked on the FIFO"
    for t in threading.enumerate():
        if t.name == "rescore-free-replaced":
            t.join(10)
    assert [(out / n).read_bytes() for n in names] == [b"new", b"new"]
    assert not any(os.path.islink(out / n) for n in names)
    assert elsewhere.read_bytes() == b"not ours"
    assert _open_deleted() == before
