"""Credit from a tree of responses: responses that share a prefix, sampled by forking rows.

The tree is recorded as `tree_nodes` describes (`path` [B, S] and `segments` [B, T], which
`jaxcredit.sampling.sample_tree` writes to rollout.extras); V(n) is the mean reward of the
leaves below node n. The estimators below are exact functions of the tree and
the rewards:

  spo_tree_advantages    V(n_k) - V(n_{k-1}) on segment k (SPO-tree, arXiv 2505.23564).
  treerl_advantages      [(V(n_k) - V(root)) + (V(n_k) - V(n_{k-1}))] / sqrt(|L(n_k)|)
                         (TreeRL, arXiv 2506.11902).
  tempo_advantages       GRPO's advantage, plus V(n_k) - V(n_{k-1}) on the first token of
                         segment k, where the tree branches (TEMPO, arXiv 2509.18314).
  treepo_advantages      the reward relative to each subgroup sharing an ancestor, weighted
                         by its size, whitened over the batch (TreePO, arXiv 2508.17445).
  tree_grpo_advantages   intra-tree plus inter-tree group-normalised rewards (Tree-GRPO,
                         arXiv 2509.21240).

All are shift-invariant in each group's rewards (each is a difference of means or a
normalised reward), so they are computed on rewards centred at each group's first reward
and scaled to [-4, 4] (equal rewards give exactly 0; no float32 overflow for any finite
rewards), and the unnormalised ones scaled back.
"""

import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks
from jaxcredit._masking import as_bool, safe_divide, safe_sqrt
from jaxcredit.estimators import token_credit
from jaxcredit.estimators.tree_nodes import (_centred_rewards, _check_tree, _on_tokens,
                                             _parents, node_stats)


def spo_tree_advantages(rewards: Array, path: Array, segments: Array, mask: Array, *,
                        group_size: int) -> Array:
  """Segment advantages from the tree's values (SPO-tree)::

    A_t = V(n_k) - V(n_{k-1})   for every token t of segment k (V(n_{-1}) = V(root))

  the value after the segment minus the value before it; on the leaf's last segment
  V(n_k) = r.

  Args:
    rewards: ``[B]`` outcome rewards, groups of `group_size` rows (one prompt's leaves).
    path: ``[B, S]`` int node ids of each row's segments (`tree_nodes`).
    segments: ``[B, T]`` int segment index of each token, -1 outside the response.
    mask: ``[B, T]`` policy actions.
    group_size: G.

  Returns:
    ``[B, T]`` float32 advantages, 0 at masked positions.

  Raises:
    ValueError: on mismatched shapes.

  References:
    Guo et al., 2025, "Segment Policy Optimization: Effective Segment-Level Credit
    Assignment in RL for Large Language Models", arXiv 2505.23564.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> path = jnp.array([[0, 1], [0, 3]])             # one fork after the first segment
    >>> segments = jnp.array([[0, 0, 1], [0, 0, 1]])
    >>> estimators.spo_tree_advantages(jnp.array([1., 0.]), path, segments,
    ...                                jnp.ones((2, 3), bool), group_size=2)
    Array([[ 0. ,  0. ,  0.5],
           [ 0. ,  0. , -0.5]], dtype=float32)
  """
  _check_tree(rewards, path, segments, mask, group_size)
  stats = node_stats(rewards, path, group_size=group_size)
  return _on_tokens((stats.values - _parents(stats)) * stats.scale[:, None], segments, mask)


def treerl_advantages(rewards: Array, path: Array, segments: Array, mask: Array, *,
                      group_size: int) -> Array:
  """TreeRL's process reward of each segment, a global plus a local advantage reweighted by
  the number of leaves below it::

    A_t = [(V(n_k) - V(root)) + (V(n_k) - V(n_{k-1}))] / sqrt(|L(n_k)|)

  for every token t of segment k (V(n_{-1}) = V(root)).

  Args:
    rewards: ``[B]`` outcome rewards, groups of `group_size` rows (one prompt's leaves).
    path: ``[B, S]`` int node ids of each row's segments (`tree_nodes`).
    segments: ``[B, T]`` int segment index of each token, -1 outside the response.
    mask: ``[B, T]`` policy actions.
    group_size: G.

  Returns:
    ``[B, T]`` float32 advantages, 0 at masked positions.

  Raises:
    ValueError: on mismatched shapes.

  References:
    Hou et al., 2025, "TreeRL: LLM Reinforcement Learning with On-Policy Tree Search",
    arXiv 2506.11902.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> path = jnp.array([[0, 1], [0, 3]])
    >>> segments = jnp.array([[0, 0, 1], [0, 0, 1]])
    >>> estimators.treerl_advantages(jnp.array([1., 0.]), path, segments,
    ...                              jnp.ones((2, 3), bool), group_size=2)
    Array([[ 0.,  0.,  1.],
           [ 0.,  0., -1.]], dtype=float32)
  """
  _check_tree(rewards, path, segments, mask, group_size)
  stats = node_stats(rewards, path, group_size=group_size)
  credit = 2.0 * stats.values - stats.root_value[:, None] - _parents(stats)
  reweighted = safe_divide(credit, safe_sqrt(stats.leaves))
  return _on_tokens(reweighted * stats.scale[:, None], segments, mask)


def _normalised(x: Array, mean: Array, std: Array, eps: float, scale: Array) -> Array:
  """(x - mean) / (std + eps) in reward units (x, mean, std in units of `scale`); 0 where
  the std is 0 (x = mean in exact arithmetic)."""
  return jnp.where(std > 0, safe_divide(x - mean, std + eps / scale), 0.0)


def tempo_advantages(rewards: Array, path: Array, segments: Array, mask: Array, *,
                     group_size: int, eps: float = 1e-6) -> Array:
  """GRPO's advantage with a temporal-difference correction where the tree branches
  (TEMPO)::

    A_t = (r - mean_g) / (std_g + eps) + 1[t first of segment k] (V(n_k) - V(n_{k-1}))

  The correction is 0 at a node with no siblings (it and its parent have the same leaves),
  so it acts only on the first token after a fork.

  Args:
    rewards: ``[B]`` outcome rewards, groups of `group_size` rows (one prompt's leaves).
    path: ``[B, S]`` int node ids of each row's segments (`tree_nodes`).
    segments: ``[B, T]`` int segment index of each token, -1 outside the response.
    mask: ``[B, T]`` policy actions.
    group_size: G.
    eps: added to the group's std (ddof = 1).

  Returns:
    ``[B, T]`` float32 advantages, 0 at masked positions.

  Raises:
    ValueError: on mismatched shapes or a negative eps.

  References:
    TEMPO: Tree-Estimated Mean Prefix Value for Policy Optimization, 2025, arXiv 2509.18314.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> path = jnp.array([[0, 1], [0, 3]])
    >>> segments = jnp.array([[0, 0, 1], [0, 0, 1]])
    >>> estimators.tempo_advantages(jnp.array([1., 0.]), path, segments,
    ...                             jnp.ones((2, 3), bool), group_size=2).round(3)
    Array([[ 0.707,  0.707,  1.207],
           [-0.707, -0.707, -1.207]], dtype=float32)
  """
  _check_tree(rewards, path, segments, mask, group_size)
  _checks.check_in_range(eps, "eps", low=0.0)
  stats = node_stats(rewards, path, group_size=group_size)
  x = _centred_rewards(rewards, group_size)[0]
  grpo = _normalised(x, stats.root_value, stats.root_std, eps, stats.scale)
  step = (stats.values - _parents(stats)) * stats.scale[:, None]
  previous = jnp.concatenate([jnp.full_like(segments[:, :1], -1), segments[:, :-1]], axis=1)
  first = jnp.where(segments != previous, segments, -1)
  return (_on_tokens(jnp.broadcast_to(grpo[:, None], step.shape), segments, mask)
          + _on_tokens(step, first, mask))


def treepo_advantages(rewards: Array, path: Array, mask: Array, *, group_size: int,
                      eps: float = 1e-8) -> Array:
  """TreePO's advantage, as its authors' code computes it: the leaf's reward relative to each
  subgroup of leaves that shares one of its ancestors, weighted by the subgroup's size, on
  every token of the response, whitened over the batch's response tokens::

    a = sum_{n in J} |L(n)| (r - V(n)) / sum_{n in J} |L(n)|,    A_t = whiten(a)_t

  where J holds the root (the group) and the nodes of the leaf's path with two or more
  leaves (a subgroup of one leaf compares nothing), and whiten is `whiten` (the mean and
  unbiased variance over the valid tokens). Without forks, a is Dr. GRPO's r - mean_g.

  Args:
    rewards: ``[B]`` outcome rewards, groups of `group_size` rows (one prompt's leaves).
    path: ``[B, S]`` int node ids of each row's segments (`tree_nodes`).
    mask: ``[B, T]`` policy actions.
    group_size: G.
    eps: added to the whitening's variance.

  Returns:
    ``[B, T]`` float32 advantages, 0 at masked positions.

  Raises:
    ValueError: on mismatched shapes or a negative eps.

  References:
    Li et al., 2025, "TreePO: Bridging the Gap of Policy Optimization and Efficacy and
    Inference Efficiency with Heuristic Tree-based Modeling", arXiv 2508.17445 (the
    subgroup-size weighting and the whitening of its released code).

  Examples:
    >>> import jax.numpy as jnp, numpy as np
    >>> from jaxcredit import estimators
    >>> path = jnp.array([[0, 1], [0, 3], [4, 5], [4, 7]])  # two trees of two leaves
    >>> advantages = estimators.treepo_advantages(jnp.array([1., 0., 1., 1.]), path,
    ...                                           jnp.ones((4, 1), bool), group_size=4)
    >>> np.asarray(advantages, np.float64).round(3)  # a = 1/3, -2/3, 1/6, 1/6, whitened
    array([[ 0.739],
           [-1.477],
           [ 0.369],
           [ 0.369]])
  """
  _check_tree(rewards, path, None, None, group_size)
  _checks.check_in_range(eps, "eps", low=0.0)
  if mask.shape[0] != rewards.shape[0]:
    raise ValueError(f"mask must be [B, T] with B = {rewards.shape[0]}, got {list(mask.shape)}.")
  stats = node_stats(rewards, path, group_size=group_size)
  x = _centred_rewards(rewards, group_size)[0]
  weights = jnp.where(stats.leaves >= 2, stats.leaves, 0.0)
  total = group_size * (x - stats.root_value) + jnp.sum(weights * (x[:, None] - stats.values),
                                                        axis=1)
  relative = total / (group_size + jnp.sum(weights, axis=1)) * stats.scale
  valid = as_bool(mask)
  return token_credit.whiten(jnp.where(valid, relative[:, None], 0.0), valid, eps=eps)


def tree_grpo_advantages(rewards: Array, path: Array, mask: Array, *, group_size: int,
                         eps: float = 1e-6) -> Array:
  """Tree-GRPO's advantage: the reward normalised within its tree and within the prompt's
  group of trees, summed, on every token of the response::

    A = (r - mean_tree) / (std_tree + eps) + (r - mean_g) / (std_g + eps)

  A tree is the leaves below one first segment (path[:, 0]), e.g. one of M chains sampled
  from the prompt and then forked.

  Args:
    rewards: ``[B]`` outcome rewards, groups of `group_size` rows (one prompt's leaves).
    path: ``[B, S]`` int node ids of each row's segments (`tree_nodes`).
    mask: ``[B, T]`` policy actions.
    group_size: G.
    eps: added to each std (ddof = 1).

  Returns:
    ``[B, T]`` float32 advantages, 0 at masked positions.

  Raises:
    ValueError: on mismatched shapes or a negative eps.

  References:
    Ji et al., 2025, "Tree Search for LLM Agent Reinforcement Learning", arXiv 2509.21240.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit import estimators
    >>> path = jnp.array([[0, 1], [0, 3], [4, 5], [4, 7]])  # two trees of two leaves
    >>> estimators.tree_grpo_advantages(jnp.array([1., 0., 1., 1.]), path,
    ...                                 jnp.ones((4, 1), bool), group_size=4).round(3)
    Array([[ 1.207],
           [-2.207],
           [ 0.5  ],
           [ 0.5  ]], dtype=float32)
  """
  _check_tree(rewards, path, None, None, group_size)
  _checks.check_in_range(eps, "eps", low=0.0)
  if mask.shape[0] != rewards.shape[0]:
    raise ValueError(f"mask must be [B, T] with B = {rewards.shape[0]}, got {list(mask.shape)}.")
  stats = node_stats(rewards, path, group_size=group_size)
  x = _centred_rewards(rewards, group_size)[0]
  intra = _normalised(x, stats.values[:, 0], stats.stds[:, 0], eps, stats.scale)
  inter = _normalised(x, stats.root_value, stats.root_std, eps, stats.scale)
  return jnp.where(as_bool(mask), (intra + inter)[:, None], 0.0)
