"""The strategy tables of docs/strategies.md are the declarations' (pipelines/strategy_docs.py):
the page as committed equals what the generator writes, and a declaration that changes changes
the page."""

from __future__ import annotations

from rescore.pipelines import strategy_docs
from rescore.transforms.strategies import registry


def _page() -> str:
    with open(strategy_docs.PAGE, encoding="utf-8") as f:
        return f.read()


def test_the_page_is_what_the_declarations_generate():
    page = _page()
    assert page.count("<!-- generated: ") == 2
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
