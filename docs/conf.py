"""Sphinx configuration for pymc-subsample."""

import sys
from pathlib import Path

import pymc_subsample

# documented too, though not installed: the study support package (tests/support) and
# the coreference example's package (examples/coreference)
ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "examples")]

project = "pymc-subsample"
author = "pymc-subsample developers"
release = pymc_subsample.__version__
extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "numpydoc",
]
myst_enable_extensions = ["dollarmath", "amsmath"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "examples/*.md", "results/tables/*"]
html_theme = "pydata_sphinx_theme"
html_title = "pymc-subsample"
html_theme_options = {"navigation_with_keys": False, "show_toc_level": 2}
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
autodoc_typehints = "none"
numpydoc_show_class_members = False
numpydoc_validation_checks = set()
nitpicky = False
suppress_warnings = ["myst.header"]
