"""The API reference covers the package: every module it lists imports, and every public
function and class of those modules (their `__all__`, or their public names) has a docstring,
as optax's documentation coverage check demands; the README's example runs."""

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


def test_every_public_function_and_class_has_a_docstring():
  undocumented = []
  for name in _documented_modules():
    for symbol, obj in _public(importlib.import_module(name)).items():
      if (inspect.isfunction(obj) or inspect.isclass(obj)) and not inspect.getdoc(obj):
        undocumented.append(f"{name}.{symbol}")
  assert not undocumented, f"public symbols without a docstring: {undocumented}"


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
                "jaxcredit.estimators.registered.register"):
    assert entry in examples, sorted(examples)
