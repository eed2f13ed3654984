"""The API reference covers the package: every module it lists imports, and every public
function and class of those modules (their `__all__`, or their public names) has a docstring,
as optax's documentation coverage check demands, every public function a Google-style `Args:`
and `Returns:` section, and every estimator and loss a run example; the README's example
runs."""

import dataclasses
import doctest
import importlib
import inspect
import sys

import numpy as np
import pytest

from tests.conftest import ROOT, doc_block

sys.path.insert(0, str(ROOT / "docs" / "_ext"))
import api_coverage  # noqa: E402  (the docs build's extension, not a package module)


def test_every_public_module_is_in_the_api_reference():
  listed = set(api_coverage.reference_modules())
  package = importlib.import_module("jaxcredit")
  top = {f"jaxcredit.{name}" for name in package.__all__
         if inspect.ismodule(getattr(package, name))}
  assert top <= listed, top - listed
  assert {"jaxcredit.rollout", "jaxcredit.train", "jaxcredit.lab", "jaxcredit.tasks"} <= listed


def test_every_public_symbol_is_documented_with_its_sections():
  """The build's coverage check (docs/_ext/api_coverage.py) finds nothing missing: a written
  docstring on every public function and class, `Args:` on every function that takes any,
  `Returns:` (or `Yields:`) unless it returns None, and `Args:` or `Attributes:` on every
  class whose own constructor takes arguments."""
  objects = api_coverage.public_objects()
  assert len(objects) > 400 and "jaxcredit.estimators.group.grpo_advantages" in objects
  assert api_coverage.problems() == []


def test_the_coverage_check_finds_what_a_docstring_lacks():
  def documented(rollout, *, scale: float) -> float:
    """Scales.

    Args:
      rollout: a rollout.
      scale: the scale.

    Returns:
      the scale.
    """

  def without_sections(rollout) -> float:
    """Scales."""

  @dataclasses.dataclass
  class Fields:
    size: int

  @dataclasses.dataclass
  class Described:
    """Sizes.

    Attributes:
      size: the size.
    """

    size: int

  class Borrowed(dict):
    """A mapping whose constructor is dict's (documented there)."""

  assert api_coverage.missing("documented", documented) == []
  assert api_coverage.missing("without", without_sections) == ["Args", "Returns"]
  assert api_coverage.missing("Fields", Fields) == ["docstring"]  # the dataclass's signature
  Fields.__doc__ = "Sizes."
  assert api_coverage.missing("Fields", Fields) == ["Args or Attributes"]
  assert api_coverage.missing("Described", Described) == []
  assert api_coverage.missing("Borrowed", Borrowed) == []


def test_the_docs_build_stops_on_what_the_coverage_check_finds(monkeypatch):
  sphinx_errors = pytest.importorskip("sphinx.errors")
  monkeypatch.setattr(api_coverage, "problems", lambda: ["jaxcredit.x.f: no Args"])
  with pytest.raises(sphinx_errors.ExtensionError, match="jaxcredit.x.f: no Args"):
    api_coverage._check(None)


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
  for name in api_coverage.documented_modules():
    for test in finder.find(importlib.import_module(name)):
      if test.examples:
        examples[test.name] = len(test.examples)
        runner.run(test)
  assert runner.failures == 0, f"{runner.failures} failed of {runner.tries} doctest examples"
  for entry in ("jaxcredit.estimators.group.grpo_advantages", "jaxcredit.estimators.returns.gae",
                "jaxcredit.logprobs.dense.token_logprobs", "jaxcredit.losses.policy.ppo_clip_loss",
                "jaxcredit.sampling.sampler.generate", "jaxcredit.registry.Registry.get",
                "jaxcredit.estimators.registered.register", "jaxcredit.train.learner.make_step"):
    assert entry in examples, sorted(examples)
