"""Tree estimators against a float64 walk of each row's path, on random and hand-built trees."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxcredit import estimators
from jaxcredit.testing import strategies
from tests import reference
from tests.conftest import random_mask

ON_SEGMENTS = {  # name -> fn(rewards, path, segments, mask, group_size)
    "spo_tree": lambda r, p, s, m, g: estimators.spo_tree_advantages(r, p, s, m, group_size=g),
    "treerl": lambda r, p, s, m, g: estimators.treerl_advantages(r, p, s, m, group_size=g),
    "tempo": lambda r, p, s, m, g: estimators.tempo_advantages(r, p, s, m, group_size=g),
    "treepo": lambda r, p, s, m, g: estimators.treepo_advantages(r, p, m, group_size=g),
    "tree_grpo": lambda r, p, s, m, g: estimators.tree_grpo_advantages(r, p, m, group_size=g),
}
TREES = [(4, 4, 2), (8, 4, 3), (16, 8, 3), (8, 8, 1), (6, 3, 4), (4, 1, 2)]  # (B, G, depth)


def _tree_inputs(batch, group_size, depth, length=9, seed=0, binary=True):
  rng = np.random.default_rng(seed)
  path, segments = strategies.random_tree(rng, batch, length, group_size, depth)
  rewards = (rng.integers(0, 2, batch) if binary else rng.normal(size=batch)).astype(np.float32)
  return rewards, path, segments, random_mask(rng, (batch, length))


class TreeCreditTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(name=sorted(ON_SEGMENTS), tree=TREES, binary=[True, False])
  def test_matches_the_float64_walk_of_the_tree(self, name, tree, binary):
    rewards, path, segments, mask = _tree_inputs(*tree, seed=len(name), binary=binary)
    group_size = tree[1]
    got = self.variant(lambda *a: ON_SEGMENTS[name](*a, group_size))(
        rewards, path, segments, mask)
    want = reference.tree_credit(name, rewards, path, segments, mask, group_size)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

  @parameterized.parameters(*sorted(ON_SEGMENTS))
  def test_vmap_over_batches_of_trees_equals_each_alone(self, name):
    inputs = [_tree_inputs(8, 4, 3, seed=s) for s in range(3)]
    stacked = [np.stack(parts) for parts in zip(*inputs)]
    got = jax.jit(jax.vmap(lambda *a: ON_SEGMENTS[name](*a, 4)))(*stacked)
    for i, parts in enumerate(inputs):
      np.testing.assert_allclose(got[i], ON_SEGMENTS[name](*parts, 4), atol=1e-6)


# One prompt, G = 4: a shared first segment, a fork into two, each forking into two leaves.
#   root - n0 - n1 (rows 0, 1) - leaves 2, 5
#             \ n3 (rows 2, 3) - leaves 8, 11
HAND_PATH = np.array([[0, 1, 2], [0, 1, 5], [0, 7, 8], [0, 7, 11]])
HAND_SEGMENTS = np.array([[0, 0, 1, 1, 2, 2]] * 4)


def test_hand_built_tree_values_and_credit():
  rewards = np.array([1.0, 1.0, 1.0, 0.0], np.float32)
  mask = np.ones((4, 6), bool)
  stats = estimators.node_stats(rewards, HAND_PATH, group_size=4)
  absolute = (stats.values - stats.root_value[:, None]) * stats.scale[:, None] + 0.75
  np.testing.assert_allclose(absolute, [[0.75, 1, 1], [0.75, 1, 1], [0.75, 0.5, 1],
                                        [0.75, 0.5, 0]], atol=1e-6)
  np.testing.assert_array_equal(stats.leaves, [[4, 2, 1]] * 4)
  # SPO-tree: the shared segment gets V(n0) - V(root) = 0; the fork's two sides +-0.25;
  # the last fork only matters under n3 (+-0.5).
  spo = estimators.spo_tree_advantages(rewards, HAND_PATH, HAND_SEGMENTS, mask, group_size=4)
  np.testing.assert_allclose(spo[:, ::2], [[0, 0.25, 0], [0, 0.25, 0], [0, -0.25, 0.5],
                                           [0, -0.25, -0.5]], atol=1e-6)
  # TreeRL: [(V - V_root) + (V - V_parent)] / sqrt(|L|).
  treerl = estimators.treerl_advantages(rewards, HAND_PATH, HAND_SEGMENTS, mask, group_size=4)
  np.testing.assert_allclose(treerl[3, ::2], [0, -0.5 / np.sqrt(2), -0.75 - 0.5], atol=1e-6)
  # TEMPO: the TD term on the first token of each segment only.
  tempo = estimators.tempo_advantages(rewards, HAND_PATH, HAND_SEGMENTS, mask, group_size=4)
  grpo = estimators.grpo_advantages(rewards, group_size=4)
  np.testing.assert_allclose(tempo[3], grpo[3] + np.array([0, 0, -0.25, 0, -0.5, 0]),
                             atol=1e-6)


def test_degenerate_trees_give_defined_values():
  mask = np.ones((4, 6), bool)
  for name, fn in ON_SEGMENTS.items():
    # Equal leaves: no credit anywhere.
    equal = fn(np.full(4, 0.3, np.float32), HAND_PATH, HAND_SEGMENTS, mask, 4)
    np.testing.assert_array_equal(equal, 0.0, err_msg=name)
    # A single leaf (G = 1): nothing to compare.
    single = fn(np.ones(1, np.float32), HAND_PATH[:1], HAND_SEGMENTS[:1], mask[:1], 1)
    np.testing.assert_array_equal(single, 0.0, err_msg=name)
    # A fork at the last token, rows whose paths end early (-1), all-masked rows, huge
    # rewards: finite, 0 where masked, and equal to the walk.
    path = np.array([[0, 1, -1], [0, 4, -1], [6, 7, 8], [6, 7, 11]])
    segments = np.array([[0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 1], [0, 0, 0, 1, 1, 2],
                         [0, 0, 0, 1, 1, 2]])
    holes = mask.copy()
    holes[1] = False
    for rewards in (np.array([1, 0, 1, 0], np.float32), np.array([1e19, -1e19, 0, 3e18],
                                                                  np.float32)):
      got = np.asarray(fn(rewards, path, segments, holes, 4))
      assert np.all(np.isfinite(got)) and np.all(got[1] == 0), name
      want = reference.tree_credit(name, rewards, path, segments, holes, 4)
      scale = 1.0 if name == "treepo" else np.abs(rewards).max()  # treepo's are whitened
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale, err_msg=name)


def test_without_forks_treepo_is_whitened_dr_grpo_and_spo_tree_telescopes():
  rng = np.random.default_rng(3)
  rewards = rng.normal(size=8).astype(np.float32)
  chains = (np.arange(8)[:, None] * 3 + np.arange(3)).astype(np.int32)  # no shared node
  mask = np.ones((8, 6), bool)
  dr_grpo = estimators.grpo_advantages(rewards, group_size=4, scale_by_std=False)
  treepo = estimators.treepo_advantages(rewards, chains, mask, group_size=4)
  want = estimators.whiten(jnp.broadcast_to(dr_grpo[:, None], (8, 6)), mask)
  np.testing.assert_allclose(treepo, want, atol=1e-5)
  # On any tree, a row's segment advantages sum to r - mean_g.
  path, segments = strategies.random_tree(rng, 8, 6, 4, 3)
  spo = estimators.spo_tree_advantages(rewards, path, segments, mask, group_size=4)
  firsts = np.asarray(spo)[:, [0, 2, 4]].sum(axis=1)
  np.testing.assert_allclose(firsts, rewards - np.repeat(rewards.reshape(2, 4).mean(1), 4),
                             atol=1e-5)


def test_gradients_through_the_rewards_are_finite_on_degenerate_trees():
  mask = np.ones((4, 6), bool)
  for name, fn in ON_SEGMENTS.items():
    for rewards in (jnp.full(4, 0.3), jnp.array([1.0, 0.0, 1.0, 1.0])):
      grad = jax.jit(jax.grad(
          lambda r: jnp.sum(fn(r, HAND_PATH, HAND_SEGMENTS, mask, 4) ** 2)))(rewards)
      assert np.all(np.isfinite(grad)), name


def test_mis_shaped_trees_are_refused():
  rewards, mask = jnp.ones(4), jnp.ones((4, 6), bool)
  with pytest.raises(ValueError, match="path must be"):
    estimators.spo_tree_advantages(rewards, HAND_PATH[:2], HAND_SEGMENTS, mask, group_size=4)
  with pytest.raises(ValueError, match="segments"):
    estimators.treerl_advantages(rewards, HAND_PATH, HAND_SEGMENTS[:, :3], mask, group_size=4)
  with pytest.raises(ValueError, match="group_size"):
    estimators.treepo_advantages(rewards, HAND_PATH, mask, group_size=3)
  with pytest.raises(ValueError, match="mask must be"):
    estimators.tree_grpo_advantages(rewards, HAND_PATH, mask[:2], group_size=4)
