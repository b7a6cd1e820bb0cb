"""`rescore strategies [NAME]` and `rescore configs`: what there is to choose from, read from the
declarations (each family module of transforms/strategies/, registry.py) and the shipped run configs.

    rescore strategies            every strategy by kind, with its one-line summary
    rescore strategies grpo       its parameters, types and defaults (what --set takes)
    rescore configs               the run configs that ship with Rescore (--config NAME)
"""

from __future__ import annotations

import sys
import textwrap

from rescore.errors import ConfigError


def strategies(argv: list[str]) -> int:
    from rescore.transforms.strategies import catalog  # noqa: F401  (registers every strategy)
    from rescore.transforms.strategies import registry

    if argv[:1] in (["-h"], ["--help"]) or len(argv) > 1:
        print(("" if argv[:1] in (["-h"], ["--help"]) else "rescore: error: ") + "usage: rescore strategies [NAME]   (every strategy, or one strategy's parameters and defaults)",
              file=sys.stdout if argv[:1] in (["-h"], ["--help"]) else sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    if argv:
        try:
            spec = registry.spec(argv[0])
        except ConfigError as e:
            print(f"rescore: error: {e}", file=sys.stderr)
            return 2
        print(f"{spec.name} ({spec.kind}): {spec.summary}")
        described = spec.describe()
        if described:
            print("parameters (--set KEY=VALUE, or --set " + spec.name + ".KEY=VALUE in a chain):")
            for line, (_, _, _, meaning) in zip(described.splitlines(), spec.parameters()):
                print(f"  {line}")
                print(textwrap.fill(meaning, 100, initial_indent="      ", subsequent_indent="      "))
        else:
            print("parameters: none")
        return 0
    width = max(len(n) for n in registry.names())
    for kind in (*registry.KINDS, registry.SHAPE):
        print(f"{kind}:")
        for name in registry.names():
            spec = registry.spec(name)
            if spec.kind == kind:
                print(f"  {name:<{width}}  {spec.summary}")
    print("chain them as filter,advantage,duplicate (--strategy reward_variance,grpo,duplicate_informative),\n"
          "after any reward shaping (--strategy dapo_overlong_penalty,reward_shaping,grpo);\n"
          "`rescore strategies NAME` lists a strategy's parameters; --algorithm NAME picks Trinity-RFT's (docs/strategies.md)")
    return 0


def configs(argv: list[str]) -> int:
    from rescore.pipelines.config_files import shipped_configs

    if argv:
        print(("" if argv[:1] in (["-h"], ["--help"]) else "rescore: error: ") + "usage: rescore configs   (the run configs that ship with Rescore; use one with --config NAME)",
              file=sys.stdout if argv[:1] in (["-h"], ["--help"]) else sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    found = shipped_configs()
    width = max((len(n) for n in found), default=0)
    for name, path in found.items():
        with open(path, encoding="utf-8") as f:
            first = next((line.lstrip("# ").rstrip() for line in f if line.startswith("#")), "")
        print(f"{name:<{width}}  {first}")
        print(f"{'':<{width}}  {path}")
    print("use one with --config NAME (flags override its keys), or copy it and edit")
    return 0
