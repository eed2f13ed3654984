"""The API reference's coverage check, as optax's documentation build has one: the build fails
when a public function or class of a module the reference documents lacks a written docstring,
a public function its `Args:` or `Returns:` section, or a class with constructor arguments
its `Args:` or `Attributes:` section.

Public: a module's `__all__`, or the names it defines without a leading underscore. The
modules: those docs/api/index.md lists and, as its recursive autosummary, their public
submodules. tests/unit/test_api_docs.py runs the same check.
"""

import dataclasses
import importlib
import inspect
import pathlib
import pkgutil
import re

INDEX = pathlib.Path(__file__).parents[1] / "api" / "index.md"


def reference_modules() -> list[str]:
  """The modules docs/api/index.md lists in its autosummary."""
  return re.findall(r"^\s+(jaxcredit(?:\.\w+)*)\s*$", INDEX.read_text(), re.M)


def documented_modules() -> list[str]:
  """The listed modules and, as the reference's recursive autosummary does, their public
  submodules."""
  names = []
  for name in reference_modules():
    names.append(name)
    module = importlib.import_module(name)
    if hasattr(module, "__path__"):
      names += [info.name for info in pkgutil.walk_packages(module.__path__, f"{name}.")
                if not any(part.startswith("_") for part in info.name.split("."))]
  return names


def public(module) -> dict:
  """{name: object} of a module's public API."""
  names = getattr(module, "__all__", None)
  if names is None:
    names = [n for n, obj in vars(module).items() if not n.startswith("_")
             and getattr(obj, "__module__", None) == module.__name__]
  return {name: getattr(module, name) for name in names}


def public_objects() -> dict:
  """{qualified name: function or class} of every documented module's public API."""
  objects = {}
  for name in documented_modules():
    for obj in public(importlib.import_module(name)).values():
      if inspect.isfunction(obj) or inspect.isclass(obj):
        objects[f"{obj.__module__}.{obj.__qualname__}"] = obj
  return objects


def own_docstring(obj) -> str:
  """The docstring written for `obj`: not one inherited, nor the signature that dataclasses
  and NamedTuple generate for a class without one."""
  doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
  if not doc or (inspect.isclass(obj) and doc.startswith(f"{obj.__name__}(")):
    return ""
  return inspect.cleandoc(doc)


def _takes_arguments(cls) -> bool:
  """Whether the class's own constructor (a dataclass's, a NamedTuple's, or an `__init__`
  written in jaxcredit) takes arguments."""
  own = (dataclasses.is_dataclass(cls) or hasattr(cls, "_fields")
         or getattr(cls.__init__, "__module__", "").startswith("jaxcredit"))
  return own and any(p != "self" for p in inspect.signature(cls).parameters)


def missing(name: str, obj) -> list[str]:
  """What `obj`'s docstring lacks: "docstring", "Args", "Returns", "Args or Attributes"."""
  doc = own_docstring(obj)
  if not doc:
    return ["docstring"]
  if inspect.isclass(obj):
    needs_fields = not issubclass(obj, Exception) and _takes_arguments(obj)
    has_fields = "Args:" in doc or "Attributes:" in doc
    return ["Args or Attributes"] if needs_fields and not has_fields else []
  lacks, signature = [], inspect.signature(obj)
  if any(p not in ("self", "cls") for p in signature.parameters) and "Args:" not in doc:
    lacks.append("Args")
  returns = signature.return_annotation not in (None, "None")
  if returns and "Returns:" not in doc and "Yields:" not in doc:
    lacks.append("Returns")
  return lacks


def problems() -> list[str]:
  """One line per public symbol whose docstring lacks something."""
  return [f"{name}: no {' and no '.join(lacks)}" for name, obj in public_objects().items()
          if (lacks := missing(name, obj))]


def _check(app) -> None:
  from sphinx.errors import ExtensionError

  del app
  found = problems()
  if found:
    raise ExtensionError("undocumented public API:\n  " + "\n  ".join(found))


def setup(app):
  app.connect("builder-inited", _check)
  return {"parallel_read_safe": True, "parallel_write_safe": True}
