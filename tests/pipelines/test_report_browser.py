"""`rescore report` opened in a real browser (headless Chromium): every chart loads and nothing
overflows a 1280 px window, on a small run, a 1,000-batch run and a one-batch run.

Needs Debian's `chromium` package (apt-get install chromium); skipped with the reason where it
is missing. Set RESCORE_SCREENSHOTS=DIR to keep the screenshots (report-<run>.png) for a look.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from rescore.pipelines.sample import make_experience

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium)")

WIDTH = 1280
PROBE = """<script>
window.addEventListener("load", () => {
  const d = document.documentElement;
  const inBox = (e) => e.closest(".scroll") !== null;
  const imgs = [...document.images];
  const result = {
    images: imgs.length,
    broken: imgs.filter((i) => !(i.complete && i.naturalWidth > 0)).map((i) => i.alt),
    scrollWidth: d.scrollWidth,
    clientWidth: d.clientWidth,
    outside: [...document.querySelectorAll("body *")]
      .filter((e) => !inBox(e) && e.getBoundingClientRect().right > d.clientWidth + 1)
      .map((e) => e.tagName + (e.className ? "." + e.className : "")),
    boxes: [...document.querySelectorAll(".scroll")].map((e) => e.getBoundingClientRect().right <= d.clientWidth + 1),
    wide: [...document.querySelectorAll("table.wrap")]
      .filter((t) => t.getBoundingClientRect().width > t.parentElement.clientWidth + 1).map((t) => t.id),
    batches: document.querySelectorAll("table#batches.wrap").length,
  };
  const pre = document.createElement("pre");
  pre.id = "rescore-probe";
  pre.textContent = JSON.stringify(result);
  document.body.appendChild(pre);
});
</script>"""


def _chromium(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
         "--virtual-time-budget=10000", *args],
        capture_output=True, text=True, timeout=120,
    )


def open_in_browser(page_path: str, screenshot: str, height: int = 4000) -> dict:
    """Load the page at WIDTH px: (the probe's findings), and a full screenshot to `screenshot`."""
    with open(page_path, encoding="utf-8") as f:
        page = f.read()
    probe_path = page_path.replace(".html", ".probe.html")
    with open(probe_path, "w", encoding="utf-8") as f:
        f.write(page.replace("</body>", PROBE + "</body>"))
    dom = _chromium(f"--window-size={WIDTH},900", "--dump-dom", f"file://{probe_path}")
    os.remove(probe_path)
    found = re.search(r'<pre id="rescore-probe">([^<]*)</pre>', dom.stdout)
    assert found, f"the page never finished loading in chromium: {dom.stderr[-2000:]}"
    shot = _chromium(f"--window-size={WIDTH},{height}", f"--screenshot={screenshot}", f"file://{page_path}")
    assert os.path.exists(screenshot), shot.stderr[-2000:]
    return json.loads(found.group(1))


def _run(tmp_path, name, *, batches, tasks, runs, strategy, extra=()):
    import pyarrow.parquet as pq

    from rescore.pipelines.cli import run

    src = tmp_path / f"{name}-in"
    src.mkdir()
    table = make_experience(batches=batches, tasks=tasks, runs=runs, seed=3)
    pq.write_table(table, str(src / "part-0.parquet"))
    out = str(tmp_path / f"{name}-out")
    run(["--input", str(src / "*.parquet"), "--output", out, "--runner=FnApiRunner", "--quiet", "--strategy", strategy, *extra])
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, batches, tasks, runs, strategy, extra",
    [
        ("small", 4, 16, 8, "reward_variance,grpo,duplicate_informative", ("--keep-filtered", "--audit-columns")),
        ("thousand", 1000, 2, 3, "grpo", ()),
        ("one-batch", 1, 12, 6, "rloo", ("--audit-columns",)),
    ],
)
def test_report_in_chromium(tmp_path, name, batches, tasks, runs, strategy, extra):
    from rescore.pipelines.report import write_report

    out = _run(tmp_path, name, batches=batches, tasks=tasks, runs=runs, strategy=strategy, extra=extra)
    paths = write_report(out)
    pngs = sorted(n for n in os.listdir(out) if n.startswith("report-") and n.endswith(".png"))
    shot = str(tmp_path / f"report-{name}.png")
    found = open_in_browser(paths["html"], shot)
    assert found["images"] == len(pngs) >= 6, found
    assert found["broken"] == [], found
    assert found["scrollWidth"] <= found["clientWidth"] == WIDTH, found  # no horizontal scroll bar
    assert found["outside"] == [], found  # only the tables' own scroll boxes may be wider inside
    assert all(found["boxes"]), found
    # the per-batch table (a dozen metric columns) fits the page: no sideways scrolling inside its box
    assert found["batches"] == 1 and found["wide"] == [], found
    with open(shot, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(shot) > 50_000  # a rendered page, not a blank one
    keep = os.environ.get("RESCORE_SCREENSHOTS")
    if keep:
        os.makedirs(keep, exist_ok=True)
        shutil.copy(shot, keep)
