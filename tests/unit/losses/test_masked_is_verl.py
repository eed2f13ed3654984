"""`masked_is` against verl's own rejection-mask code, through the two convention mappings
its docstring states (verl bounds 1/w; verl's token-mean divides by the kept tokens).

verl is installed without its dependencies (`.ci/run`), so its package cannot be imported;
the functions this test needs are read from verl's source files and run as written, with
torch (the test extra installs it).
"""

import ast
import importlib.metadata
import math
import types
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcredit import losses

torch = pytest.importorskip("torch")


def _functions(path, names: set[str], namespace: dict) -> dict:
  """The top-level definitions and assignments `names` of a source file, executed in
  `namespace`."""
  def defines(node) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
      return {node.name}
    targets = {ast.Assign: lambda n: n.targets, ast.AnnAssign: lambda n: [n.target]}
    return {getattr(t, "id", None) for t in targets.get(type(node), lambda n: [])(node)}

  keep = [node for node in ast.parse(path.read_text()).body if defines(node) & names]
  exec(compile(ast.Module(body=keep, type_ignores=[]), str(path), "exec"), namespace)
  return namespace


@pytest.fixture(scope="module")
def rejection_mask():
  try:
    files = {str(f): f for f in importlib.metadata.files("verl") or []}
  except importlib.metadata.PackageNotFoundError:
    pytest.skip("verl is not installed (.ci/run installs it with --no-deps)")
  locate = lambda suffix: next(f for name, f in files.items() if name.endswith(suffix)).locate()
  torch_functional = _functions(locate("verl/utils/torch_functional.py"),
                                {"masked_sum", "masked_mean"}, {"torch": torch})
  namespace = {"torch": torch, "math": math, "Optional": Optional, "Any": Any,
               "verl_F": types.SimpleNamespace(**torch_functional)}
  helper = _functions(locate("verl/trainer/ppo/rollout_corr_helper.py"), {
      "SAFETY_BOUND", "SUPPORTED_ROLLOUT_RS_OPTIONS", "TOKEN_LEVEL_ROLLOUT_RS_OPTIONS",
      "_parse_rollout_is_threshold", "_parse_rollout_rs_thresholds",
      "compute_rollout_rejection_mask", "compute_rs_metrics"}, namespace)
  return helper["compute_rollout_rejection_mask"]


@pytest.mark.parametrize("level,option", [("token", "token_k1"), ("sequence", "seq_mean_k1")])
def test_masked_is_keeps_what_verl_keeps_and_verls_mean_divides_by_the_kept(rejection_mask,
                                                                            level, option):
  rng = np.random.default_rng(0)
  shape, a, b = (6, 12), 0.6, 1.5  # verl's threshold "a_b" on 1/w
  mask = rng.random(shape) < 0.8
  behaviour = rng.normal(-1.0, 0.6, shape).astype(np.float32)
  logp = rng.normal(-1.0, 0.6, shape).astype(np.float32)
  advantages = rng.normal(size=shape).astype(np.float32)
  log_w = logp - behaviour  # old = current: the ratio is 1, so no PPO clipping

  verl_mask, _ = rejection_mask(torch.tensor(log_w), torch.tensor(mask, dtype=torch.float32),
                                rollout_rs=option, rollout_rs_threshold=f"{a}_{b}")
  verl_mask = verl_mask.numpy().astype(bool)

  loss_fn = lambda l: losses.masked_is_loss(l, jnp.asarray(logp), jnp.asarray(behaviour),
                                            jnp.asarray(advantages), jnp.asarray(mask),
                                            low=1 / b, high=1 / a, level=level)[0]
  loss, grad = jax.value_and_grad(loss_fn)(jnp.asarray(logp))
  kept = np.asarray(grad) != 0
  np.testing.assert_array_equal(kept, verl_mask & mask)
  assert 0 < kept.sum() < mask.sum(), "the test must drop some valid tokens and keep others"

  # verl's token-mean over its mask, with the same (detached) weights: this loss times
  # valid / kept.
  weight = np.exp(np.where(mask, log_w, 0.0))
  if level == "sequence":
    weight = np.exp(np.where(mask, log_w, 0).sum(1, keepdims=True)
                    / np.maximum(mask.sum(1, keepdims=True), 1)) * np.ones(shape)
  verl_loss = np.sum(verl_mask * weight * -advantages) / verl_mask.sum()
  np.testing.assert_allclose(float(loss) * mask.sum() / kept.sum(), verl_loss, rtol=1e-5)
