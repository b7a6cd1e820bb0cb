"""The strategy families: importing this module registers every strategy.

Each family module declares its strategies beside their math: a frozen dataclass of the
parameters and the class that does the math, registered under the reference's name
(`@register(name, kind=..., summary=...)`, registry.py). Importing them loads no torch
(tensors.py). A new family is one line here; a new strategy in a family is nothing here.
"""

from rescore.transforms.strategies import (  # noqa: F401  (each import registers its family)
    baselines,
    chord,
    distill,
    estimators,
    filters,
    gigpo,
    grpo,
    jsd,
    multi_reward,
    normalize,
    offpolicy_spec,
    reinforce_pp,
    repetition,
    shaping,
    step_wise,
    token_baseline,
    user_filter,
    variance,
    weights,
)
