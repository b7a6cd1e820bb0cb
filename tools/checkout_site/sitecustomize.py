"""Development aid, not shipped: run a checkout's code without installing THAT checkout.

A virtual environment holds one editable install of Rescore, which maps `rescore.pipelines`,
`rescore.transforms`, ... to the folders of the checkout it was installed from (pyproject.toml's
package-dir). To run a second checkout with the same environment (a git worktree, or
benchmarks/identical.py's before/after trees), put this folder on PYTHONPATH:

    PYTHONPATH=/path/to/checkout/tools/checkout_site python -m rescore ...

Python imports this file at start-up (`site` runs `sitecustomize`), and it puts, ahead of every
other finder, one that maps the `rescore` package and the subpackages pyproject.toml declares to
the folders of the checkout that holds this file (or of $RESCORE_CHECKOUT where that is set). Child
processes inherit PYTHONPATH, so Beam's worker processes import the same code. The product itself
never does this: rescore/__init__.py leaves its __path__ alone.
"""

import importlib.util
import os
import sys

ROOT = os.path.abspath(os.environ.get("RESCORE_CHECKOUT") or os.path.join(os.path.dirname(__file__), "..", ".."))
FOLDERS = {"rescore": "rescore", "rescore.pipelines": "pipelines", "rescore.transforms": "transforms",
           "rescore.schemas": "schemas", "rescore.examples": "examples", "rescore.run_configs": "run_configs"}


class CheckoutFinder:
    """`rescore` and its mapped subpackages from ROOT; everything below them then follows their
    __path__ as usual."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        folder = FOLDERS.get(name)
        if folder is None:
            return None
        where = os.path.join(ROOT, folder)
        init = os.path.join(where, "__init__.py")
        if not os.path.isfile(init):
            return None
        return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[where])


sys.meta_path.insert(0, CheckoutFinder)
