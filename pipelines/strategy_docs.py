"""`python -m rescore.pipelines.strategy_docs [--check] [PAGE]`: the strategy tables of
docs/strategies.md, written from the declarations (transforms/strategies/registry.py).

Every region between a `<!-- generated: WHAT -->` line and its `<!-- end generated: WHAT -->`
line is rewritten from the registry:

    strategies        one row per strategy: name and aliases, kind, parameters with their
                      defaults, the declaration's summary
    presets           each declaration derived from another one's (a framework's preset), with
                      the defaults it changes
    params NAME...    the parameter table of strategy NAME (several names: strategies that share
                      one declaration), one row per parameter: type and bounds, default, and
                      its meaning, the `param(help=...)` of the declaration
    sections          a minimal section (summary and parameter table) for every strategy that no
                      `params` region elsewhere on the page documents: a new strategy is on the
                      page from its first run of this command

The rest of the page is prose and stays as written. `--check` writes nothing and exits 1 where
the page and the declarations disagree (tests/strategies/test_strategy_docs.py runs it), or a
parameter has no help.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable

from rescore.transforms.strategies import registry

PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "strategies.md")
"""docs/strategies.md of the checkout this module runs from."""
ORDER = (registry.ADVANTAGE, registry.FILTER, registry.DUPLICATE, registry.SHAPE)
_REGION = re.compile(r"(<!-- generated: ([\w ]+?) -->\n)(.*?)(<!-- end generated: \2 -->)", re.S)


def value_text(value) -> str:
    """A default as the page writes it: null, true, 1e-6, [a, b]."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return re.sub(r"e([+-])0*(\d)", lambda m: f"e{'-' if m.group(1) == '-' else ''}{m.group(2)}", repr(value))
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(value_text(v) for v in value) + "]"
    return str(value)


def _cell(text: str) -> str:
    """`text` as one Markdown table cell: a `|` does not split the row, a newline does not end it."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _base(spec: registry.StrategySpec, specs: Iterable[registry.StrategySpec]) -> registry.StrategySpec | None:
    """The strategy whose declaration `spec`'s derives from (a preset's), or None."""
    for other in specs:
        if other.params is not spec.params and issubclass(spec.params, other.params) and other.params is not registry.StrategyParams:
            return other
    return None


def _specs() -> list[registry.StrategySpec]:
    return [registry.spec(n) for n in registry.names()]


def strategies_table() -> str:
    """One row per strategy (aliases, the same declaration, math and summary, share a row), by
    kind, then name."""
    specs = _specs()
    rows: dict[tuple, list[str]] = {}
    for s in specs:
        if _base(s, specs) is None:
            rows.setdefault((ORDER.index(s.kind), s.params, s.factory, s.summary), []).append(s.name)
    lines = ["| name | kind | parameters (default) | one line |", "|---|---|---|---|"]
    for (_, params, _, summary), names in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[1][0])):
        s = registry.spec(names[0])
        shown = f"`{names[0]}`" + (" (" + ", ".join(f"`{n}`" for n in names[1:]) + ")" if names[1:] else "")
        parameters = ", ".join(f"`{k}` ({value_text(v)})" for k, v in s.defaults.items()) or "—"
        lines.append(f"| {shown} | {s.kind} | {_cell(parameters)} | {_cell(summary)} |")
    return "\n".join(lines) + "\n"


def presets_table() -> str:
    """Each preset: the strategy it presets, the defaults it changes, its summary."""
    specs = _specs()
    lines = ["| preset | of | sets | one line |", "|---|---|---|---|"]
    for s in specs:
        base = _base(s, specs)
        if base is not None:
            changed = {k: v for k, v in s.defaults.items() if base.defaults.get(k) != v}
            sets = ", ".join(f"`{k}={value_text(v)}`" for k, v in changed.items()) or "—"
            lines.append(f"| `{s.name}` | `{base.name}` | {_cell(sets)} | {_cell(s.summary)} |")
    return "\n".join(lines) + "\n"


def _primaries() -> dict[str, list[str]]:
    """Each documented strategy's name -> the names sharing its row of the strategies table
    (aliases: one declaration, math and summary); presets are left out (the presets table)."""
    specs = _specs()
    rows: dict[tuple, list[str]] = {}
    for s in specs:
        if _base(s, specs) is None:
            rows.setdefault((s.params, s.factory, s.summary), []).append(s.name)
    return {names[0]: names for names in rows.values()}


def _default_text(value) -> str:
    text = value_text(value)
    return f"`{text}`" if isinstance(value, str) else text


def params_table(names: list[str]) -> str:
    """The parameter table of the strategies `names` (one declaration), from its fields' types,
    bounds, defaults and help."""
    specs = [registry.spec(n) for n in names]
    if any(s.params is not specs[0].params for s in specs[1:]):
        raise ValueError(f"params {' '.join(names)}: these strategies do not share one declaration; give each its own region")
    shown = " and ".join(f"`{n}`" for n in names)
    rows = specs[0].parameters()
    if not rows:
        return f"{shown}: no parameters.\n"
    lines = [f"Parameters of {shown} (`--set KEY=VALUE`):", "", "| parameter | type | default | meaning |", "|---|---|---|---|"]
    for key, kind, default, meaning in rows:
        if not meaning.strip():
            raise ValueError(f"{names[0]}: parameter {key!r} has no help (param(..., help=...))")
        lines.append(f"| `{key}` | {_cell(kind.replace('|', ' / '))} | {_cell(_default_text(default))} | {_cell(meaning)} |")
    return "\n".join(lines) + "\n"


def _documented(page: str) -> set[str]:
    """The strategies a `params` region of `page` documents, with their aliases."""
    named = {n for m in _REGION.finditer(page) if m.group(2).startswith("params ") for n in m.group(2).split()[1:]}
    return {n for names in _primaries().values() if named & set(names) for n in names}


def sections(page: str) -> str:
    """A minimal section for every strategy no `params` region of `page` documents."""
    documented = _documented(page)
    out = []
    for name, names in sorted(_primaries().items()):
        if name not in documented:
            s = registry.spec(name)
            aliases = f" (alias {', '.join(f'`{n}`' for n in names[1:])})" if names[1:] else ""
            out.append(f"## `{name}`\n\n{s.kind}{aliases}: {' '.join(s.summary.split())}.\n\n{params_table([name])}")
    return "\n".join(out)


TABLES = {"strategies": strategies_table, "presets": presets_table}


def render(page: str) -> str:
    """`page` with every generated region rewritten from the declarations."""

    def region(m: re.Match) -> str:
        what = m.group(2).split()
        if what[0] == "params" and what[1:]:
            return m.group(1) + params_table(what[1:]) + m.group(4)
        if what == ["sections"]:
            return m.group(1) + sections(page) + m.group(4)
        if what[0] not in TABLES or what[1:]:
            raise ValueError(f"unknown generated region {m.group(2)!r} (known: {', '.join(TABLES)}, params NAME..., sections)")
        return m.group(1) + TABLES[what[0]]() + m.group(4)

    return _REGION.sub(region, page)


def undocumented(page: str) -> list[str]:
    """Strategies the rendered `page` documents nowhere (no `params` region, no generated
    section): empty for a page with a `sections` region."""
    covered = _documented(page) | {n for names in _primaries().values() for n in names if f"## `{names[0]}`" in page}
    return sorted(n for n in _primaries() if n not in covered)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    paths = [a for a in args if a != "--check"]
    if len(paths) > 1 or any(a.startswith("-") for a in paths):
        print("usage: python -m rescore.pipelines.strategy_docs [--check] [PAGE]", file=sys.stderr)
        return 2
    path = paths[0] if paths else PAGE
    try:
        with open(path, encoding="utf-8") as f:
            page = f.read()
    except OSError as e:
        print(f"strategy_docs: cannot read {path}: {e.strerror}", file=sys.stderr)
        return 2
    try:
        new = render(page)
    except (ValueError, registry.ConfigError) as e:
        print(f"strategy_docs: {path}: {e}", file=sys.stderr)
        return 1
    if new == page:
        return 0
    if check:
        print(f"strategy_docs: {path} disagrees with the declarations; run python -m rescore.pipelines.strategy_docs", file=sys.stderr)
        return 1
    with open(path, "w", encoding="utf-8") as f:
        f.write(new)
    print(f"strategy_docs: rewrote the generated tables of {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
