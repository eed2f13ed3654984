"""Sphinx configuration of jaxcredit's documentation.

Build: pip install -e '.[docs]' && sphinx-build -W -b html docs docs/_build/html
"""

import importlib.metadata
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent / "_ext"))

project = "jaxcredit"
author = "jaxcredit authors"
copyright = "2026, jaxcredit authors"

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx.ext.mathjax",
    "sphinx_copybutton",
    "api_coverage",  # fails the build on an undocumented public symbol (docs/_ext)
]

# MathJax is served with the site (from the sphinx-mathjax-offline wheel's copy), so formulas
# render offline; SVG output needs no web fonts.
_MATHJAX = importlib.metadata.distribution("sphinx-mathjax-offline").locate_file(
    "sphinx-mathjax-offline/static")
html_static_path = [str(_MATHJAX)]
mathjax_path = "mathjax/tex-svg.js"

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "README.md", "examples", "viewer", "**.ipynb_checkpoints"]

html_theme = "sphinx_book_theme"
html_title = "jaxcredit"
html_theme_options = {"show_toc_level": 2, "collapse_navbar": True}

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
napoleon_use_ivar = True  # Attributes: as fields of the class, not duplicate object entries

suppress_warnings = ["myst.header"]

# `name` in a docstring is code.
default_role = "code"


def _plain_math(app, what, name, obj, options, lines):
  """Docstrings write formulas in plain text, where |x| is an absolute value or a set's size
  and Q_- a subscript: bars and a subscript's underscore are escaped for reStructuredText
  (which reads |x| as a substitution and Q_ as a link), except in literal blocks (after a line
  ending in "::"), which render as written."""
  del app, what, name, obj, options
  literal_indent = None
  for i, line in enumerate(lines):
    indent = len(line) - len(line.lstrip())
    if literal_indent is not None and line.strip() and indent <= literal_indent:
      literal_indent = None
    if literal_indent is None:
      lines[i] = re.sub(r"(\w)_(?=[^\w`]|$)", r"\1\\_", line.replace("|", r"\|"))
      if line.rstrip().endswith("::"):
        literal_indent = indent


def _skip_borrowed(app, what, name, obj, skip, options):
  """Skips a class attribute whose default is a function from elsewhere (e.g. a field
  defaulting to `np.asarray`): the class's Attributes section documents it."""
  del app, what, name, options
  module = getattr(obj, "__module__", None) or ""
  if callable(obj) and not isinstance(obj, type) and not module.startswith("jaxcredit"):
    return True
  return skip


def setup(app):
  app.connect("autodoc-process-docstring", _plain_math)
  app.connect("autodoc-skip-member", _skip_borrowed)
