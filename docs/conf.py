"""Sphinx configuration of jaxcredit's documentation.

Build: pip install -e '.[docs]' && sphinx-build -W -b html docs docs/_build/html
"""

import importlib.metadata
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # bench/ and studies/ for the pages generated from them

project = "jaxcredit"
author = "jaxcredit authors"
copyright = "2026, jaxcredit authors"

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx.ext.doctest",
    "sphinx.ext.mathjax",
    "sphinx_copybutton",
]

# MathJax is served with the site (from the sphinx-mathjax-offline wheel's copy), so formulas
# render offline; SVG output needs no web fonts.
_MATHJAX = importlib.metadata.distribution("sphinx-mathjax-offline").locate_file(
    "sphinx-mathjax-offline/static")
html_static_path = [str(_MATHJAX)]
mathjax_path = "mathjax/tex-svg.js"

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "README.md", "examples", "viewer", "**.ipynb_checkpoints"]
templates_path = ["_templates"]

html_theme = "sphinx_book_theme"
html_title = "jaxcredit"
html_theme_options = {
    "show_toc_level": 2,
    "repository_url": "https://github.com/jaxcredit/jaxcredit",
    "use_repository_button": False,
}

myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

# Tutorials are executed at build time, on CPU; an error fails the build.
nb_execution_mode = "force"
nb_execution_timeout = 120
nb_execution_raise_on_error = True

autosummary_generate = True
autosummary_ignore_module_all = False  # a module's __all__ is its public API
autodoc_default_options = {"members": True, "member-order": "bysource"}
autodoc_typehints = "description"
autodoc_typehints_format = "short"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

nitpicky = False
suppress_warnings = ["myst.header"]
