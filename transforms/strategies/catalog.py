"""The strategy families: importing this module registers every strategy.

Each family module declares its strategies beside their math: a frozen dataclass of the
parameters and the class that does the math, registered under the reference's name
(`@register(name, kind=..., summary=...)`, registry.py). Importing them loads no torch
(tensors.py). families.py says which family declares which strategy (a run imports only the
families it uses); a new family, or a new strategy in a family, is one line there.
"""

from rescore.transforms.strategies.families import load_all

load_all()
