"""The strategy tables of docs/strategies.md are the declarations' (pipelines/strategy_docs.py):
the page as committed equals what the generator writes, every strategy's parameters are on it
with their meaning, and a declaration that changes changes the page."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import pytest

from rescore.pipelines import strategy_docs
from rescore.transforms.strategies import registry
from rescore.transforms.strategies.registry import StrategyParams, param, register, unregister


def _page() -> str:
    with open(strategy_docs.PAGE, encoding="utf-8") as f:
        return f.read()


def test_the_page_is_what_the_declarations_generate():
    page = _page()
    regions = re.findall(r"<!-- generated: ([\w ]+?) -->", page)
    assert regions[:1] == ["strategies"] and "presets" in regions and "sections" in regions
    assert len(regions) == 3 + sum(1 for r in regions if r.startswith("params "))
    assert strategy_docs.render(page) == page, "run: python -m rescore.pipelines.strategy_docs"


def test_the_tables_carry_the_declared_names_defaults_and_summaries():
    page = _page()
    assert ("| `grpo` | advantage | `epsilon` (1e-6), `std_cal_level` (group), `std_threshold` (null), `rank_penalty` (null) | "
            "(r - mean(G)) / (std + epsilon), group or batch std, optional threshold and rank penalty |") in page
    assert "| `dapo_dynamic_sampling` (`dynamic_sampling`) | filter | `metric_key` (accuracy), `correct_threshold` (0.0) |" in page
    assert "| `trl_sequence_mask` | `rollout_correction` | `vllm_importance_sampling_mode=sequence_mask` |" in page
    assert "op add\\|sub\\|mul\\|div" in page  # a | in a summary does not split the row
    rows = [line for line in page.splitlines() if line.startswith("| `")]
    shown = {name.strip("`") for line in rows for name in line.split(" | ")[0].strip("| ").replace("(", "").replace(")", "").replace(",", "").split()}
    assert shown >= set(registry.names())


def test_a_changed_declaration_makes_the_check_fail(tmp_path, capsys):
    page = tmp_path / "strategies.md"
    page.write_text(_page().replace("| `rec` | advantage | `epsilon` (1e-6)", "| `rec` | advantage | `epsilon` (1e-5)"), encoding="utf-8")
    assert strategy_docs.main(["--check", str(page)]) == 1
    assert capsys.readouterr().err.startswith(f"strategy_docs: {page} disagrees with the declarations")
    assert strategy_docs.main([str(page)]) == 0 and strategy_docs.main(["--check", str(page)]) == 0
    assert page.read_text(encoding="utf-8") == _page()


def test_every_strategy_has_a_section_with_its_parameters_and_their_meaning():
    page = _page()
    assert strategy_docs.undocumented(page) == []
    grpo = page[page.index("<!-- generated: params grpo -->"):page.index("<!-- end generated: params grpo -->")]
    assert "| `epsilon` | float, >= 0 | 1e-6 | added to the std |" in grpo
    assert "| `std_cal_level` | group / batch | `group` | `group`: std(G); `batch`: the std of **all** rewards" in grpo
    assert "<!-- generated: params reinforceplusplus reinforce_plus_plus -->\nParameters of `reinforceplusplus` and `reinforce_plus_plus`" in page
    assert "<!-- generated: params reinforce -->\n`reinforce`: no parameters.\n<!-- end" in page
    for name in registry.names():  # every parameter of every strategy carries a meaning
        for key, _, _, meaning in registry.spec(name).parameters():
            assert meaning.strip(), f"{name}.{key}"


def test_a_stale_parameter_table_makes_the_check_fail(tmp_path, capsys):
    page = tmp_path / "strategies.md"
    page.write_text(_page().replace("| `rank_penalty` | float | 0.25 |", "| `rank_penalty` | float | 0.5 |"), encoding="utf-8")
    assert strategy_docs.main(["--check", str(page)]) == 1
    assert capsys.readouterr().err.startswith(f"strategy_docs: {page} disagrees with the declarations")
    assert strategy_docs.main([str(page)]) == 0 and page.read_text(encoding="utf-8") == _page()


@dataclass(frozen=True)
class _ToyParams(StrategyParams):
    width: float = param(1.0, positive=True, help="a | in the help\nand a newline\u2028and a line separator")
    mode: str = param("a|b", help="its default has a | too")


@pytest.fixture
def toy_filter():
    register("toy_docs_filter", kind=registry.FILTER, implementation="variance:RewardVariance", summary="a toy |\nfilter")(_ToyParams)
    yield "toy_docs_filter"
    unregister("toy_docs_filter")


def test_a_strategy_without_a_section_gets_a_minimal_one_and_bars_stay_in_their_cells(toy_filter, tmp_path, capsys):
    page = tmp_path / "strategies.md"
    page.write_text(_page(), encoding="utf-8")
    assert strategy_docs.main(["--check", str(page)]) == 1  # the new strategy is not on the page yet
    capsys.readouterr()
    assert strategy_docs.main([str(page)]) == 0 and strategy_docs.main(["--check", str(page)]) == 0
    text = page.read_text(encoding="utf-8")
    region = text[text.index("<!-- generated: sections -->"):text.index("<!-- end generated: sections -->")]
    section = region[region.index("## `toy_docs_filter`"):].split("\n## ")[0]
    assert section.splitlines() == [
        "## `toy_docs_filter`",
        "",
        "filter: a toy | filter.",
        "",
        "Parameters of `toy_docs_filter` (`--set KEY=VALUE`):",
        "",
        "| parameter | type | default | meaning |",
        "|---|---|---|---|",
        "| `width` | float, > 0 | 1.0 | a \\| in the help and a newline and a line separator |",
        "| `mode` | str | `a\\|b` | its default has a \\| too |",
    ]
    for row in section.splitlines()[-2:]:
        assert len(re.split(r"(?<!\\)\|", row)) == 6  # four cells: no | splits a row
    assert strategy_docs.undocumented(text) == []


def test_a_parameter_without_help_is_refused_where_it_registers():
    with pytest.raises(TypeError, match=r"^a parameter's help is a string \(what it means\), not None$"):
        param(1.0, help=None)

    @dataclass(frozen=True)
    class Bare(StrategyParams):
        weight: float = 1.0

    with pytest.raises(TypeError, match=r"^strategy 'bare_toy': parameter 'weight' has no help; declare it as weight: TYPE = param\(DEFAULT, help="):
        register("bare_toy", kind=registry.FILTER, implementation="variance:RewardVariance", summary="")(Bare)
    assert "bare_toy" not in registry.names()


def test_the_check_fails_on_a_parameter_that_lost_its_help(toy_filter, tmp_path, capsys, monkeypatch):
    page = tmp_path / "strategies.md"
    page.write_text(_page().replace("<!-- generated: sections -->", "<!-- generated: params toy_docs_filter -->\n<!-- end generated: params toy_docs_filter -->\n\n<!-- generated: sections -->"), encoding="utf-8")
    assert strategy_docs.main([str(page)]) == 0
    @dataclass(frozen=True)
    class Bare(StrategyParams):  # what a declaration that bypassed register() would hold
        width: float = 1.0

    monkeypatch.setitem(registry._REGISTRY, "toy_docs_filter", dataclasses.replace(registry.spec("toy_docs_filter"), params=Bare))
    assert strategy_docs.main(["--check", str(page)]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"strategy_docs: {page}: toy_docs_filter: parameter 'width' has no help (param(..., help=...))"
