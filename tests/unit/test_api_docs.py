"""The API reference covers the package: every module it lists imports, and every public
function and class of those modules (their `__all__`, or their public names) has a docstring,
as optax's documentation coverage check demands, every public function a Google-style `Args:`
and `Returns:` section, and every estimator and loss a run example; the README's example
runs."""

import dataclasses
import doctest
import importlib
import inspect
import pkgutil
import re

import numpy as np

from tests.conftest import ROOT, doc_block


def _reference_modules() -> list[str]:
  """The modules docs/api/index.md lists in its autosummary."""
  text = (ROOT / "docs" / "api" / "index.md").read_text()
  return re.findall(r"^\s+(jaxcredit(?:\.\w+)*)\s*$", text, re.M)


def _documented_modules() -> list[str]:
  """The listed modules and, as the reference's recursive autosummary does, their public
  submodules."""
  names = []
  for name in _reference_modules():
    names.append(name)
    module = importlib.import_module(name)
    if hasattr(module, "__path__"):
      names += [info.name for info in pkgutil.walk_packages(module.__path__, f"{name}.")
                if not any(part.startswith("_") for part in info.name.split("."))]
  return names


def _public(module) -> dict:
  names = getattr(module, "__all__", None)
  if names is None:
    names = [n for n, obj in vars(module).items() if not n.startswith("_")
             and getattr(obj, "__module__", None) == module.__name__]
  return {name: getattr(module, name) for name in names}


def test_every_public_module_is_in_the_api_reference():
  listed = set(_reference_modules())
  package = importlib.import_module("jaxcredit")
  top = {f"jaxcredit.{name}" for name in package.__all__
         if inspect.ismodule(getattr(package, name))}
  assert top <= listed, top - listed
  assert {"jaxcredit.rollout", "jaxcredit.train", "jaxcredit.lab", "jaxcredit.tasks"} <= listed


def _own_docstring(obj) -> str:
  """The docstring written for `obj`: not one inherited, nor the signature that dataclasses
  and NamedTuple generate for a class without one."""
  doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
  if not doc or (inspect.isclass(obj) and doc.startswith(f"{obj.__name__}(")):
    return ""
  return inspect.cleandoc(doc)


def test_every_public_function_and_class_has_a_docstring():
  undocumented = []
  for name in _documented_modules():
    for symbol, obj in _public(importlib.import_module(name)).items():
      if (inspect.isfunction(obj) or inspect.isclass(obj)) and not _own_docstring(obj):
        undocumented.append(f"{name}.{symbol}")
  assert not undocumented, f"public symbols without a docstring: {undocumented}"


def _takes_arguments(cls) -> bool:
  """Whether the class's own constructor (a dataclass's, a NamedTuple's, or an `__init__`
  written in jaxcredit) takes arguments."""
  own = (dataclasses.is_dataclass(cls) or hasattr(cls, "_fields")
         or getattr(cls.__init__, "__module__", "").startswith("jaxcredit"))
  return own and any(p != "self" for p in inspect.signature(cls).parameters)


def test_every_public_class_documents_its_fields_or_arguments():
  missing = []
  for name in _documented_modules():
    for symbol, obj in _public(importlib.import_module(name)).items():
      if inspect.isclass(obj) and not issubclass(obj, Exception) and _takes_arguments(obj):
        if not any(section in _own_docstring(obj) for section in ("Args:", "Attributes:")):
          missing.append(f"{name}.{symbol}")
  assert not missing, f"classes without Args or Attributes: {missing}"


def _public_functions():
  """{qualified name: function} of every public function the API reference documents."""
  functions = {}
  for name in _documented_modules():
    for obj in _public(importlib.import_module(name)).values():
      if inspect.isfunction(obj):
        functions[f"{obj.__module__}.{obj.__qualname__}"] = obj
  return functions


def test_every_public_function_documents_its_arguments_and_result():
  """Google style, as napoleon renders it: `Args:` when the function takes any, `Returns:`
  (or `Yields:`) unless it is annotated to return None."""
  missing = []
  for name, fn in _public_functions().items():
    doc, signature = inspect.getdoc(fn) or "", inspect.signature(fn)
    if any(p not in ("self", "cls") for p in signature.parameters) and "Args:" not in doc:
      missing.append(f"{name} (Args)")
    returns = signature.return_annotation not in (None, "None")
    if returns and "Returns:" not in doc and "Yields:" not in doc:
      missing.append(f"{name} (Returns)")
  assert not missing, f"docstrings without their sections: {missing}"


def test_every_estimator_and_loss_has_an_example():
  from jaxcredit import estimators, losses

  missing = [f"{package.__name__}.{name}" for package in (estimators, losses)
             for name in package.__all__ if inspect.isfunction(getattr(package, name))
             and "Examples:" not in (inspect.getdoc(getattr(package, name)) or "")]
  assert not missing, f"estimators and losses without an example: {missing}"


def test_the_readme_example_runs_and_prints_what_it_says():
  namespace = {}
  exec(doc_block('jc.estimators.get("grpo")(rollout)'), namespace)
  advantages = np.asarray(namespace["grpo"].advantages)
  np.testing.assert_allclose(advantages[:, 0], [0.71, -0.71, -0.71, 0.71], atol=5e-3)
  assert np.all(advantages == advantages[:, :1])  # the response's advantage on every token


def test_the_docstring_examples_run():
  """Every `>>>` example of the modules the API reference documents (as `--doctest-modules`
  would run them); the core entry points have one."""
  finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
  examples = {}
  for name in _documented_modules():
    for test in finder.find(importlib.import_module(name)):
      if test.examples:
        examples[test.name] = len(test.examples)
        runner.run(test)
  assert runner.failures == 0, f"{runner.failures} failed of {runner.tries} doctest examples"
  for entry in ("jaxcredit.estimators.group.grpo_advantages", "jaxcredit.estimators.returns.gae",
                "jaxcredit.logprobs.token_logprobs", "jaxcredit.losses.policy.ppo_clip_loss",
                "jaxcredit.sampling.sampler.generate", "jaxcredit.registry.Registry.get",
                "jaxcredit.estimators.registered.register", "jaxcredit.train.learner.make_step"):
    assert entry in examples, sorted(examples)
