"""A tree of responses as arrays, and the statistics of its nodes.

A group's G rows are the leaves of the trees sampled from one prompt. Each row's response
is cut into segments (k = 0, 1, ..., its depth); the k-th segment of a row is a node of the
tree, shared by every row whose first k + 1 segments are the same tokens. Two arrays record
the tree (`jaxcredit.sampling.sample_tree` writes them to rollout.extras):

  path      [B, S] int  the node id of each row's k-th segment, -1 past its last one; the
                        parent of node path[b, k] is path[b, k - 1], and of path[b, 0] the
                        prompt (the root). Ids are in [0, B S) and a node's rows are in one
                        group.
  segments  [B, T] int  the segment index k of each response token, -1 elsewhere.

A node's value is the mean reward of the leaves below it, V(n) = mean_{l in L(n)} r_l, an
unbiased Monte-Carlo estimate of the value of its prefix; V(root) is the group's mean
reward, V of a leaf its reward.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from jaxcredit import _checks
from jaxcredit._masking import as_bool, safe_divide, safe_sqrt, scale_down


class NodeStats(NamedTuple):
  """Statistics of the nodes on each row's path, and of its group (the root).

  Attributes:
    values: ``[B, S]`` float32 V(n) = mean reward of the leaves below the row's k-th node (0
      past the row's path).
    leaves: ``[B, S]`` float32 |L(n)|, the number of those leaves (0 past the path).
    stds: ``[B, S]`` float32 the std (ddof = 1; 0 for one leaf) of their rewards.
    root_value: ``[B]`` float32 V(root), the mean reward of the row's group.
    root_std: ``[B]`` float32 the std (ddof = 1) of the group's rewards.
    scale: ``[B]`` float32 the reward unit of the statistics above: rewards are
      ``scale * x`` with the statistics computed on x (centred, so values and stds are in
      x units too; values are relative to the group's first reward).
  """

  values: Array
  leaves: Array
  stds: Array
  root_value: Array
  root_std: Array
  scale: Array


def _check_tree(rewards, path, segments, mask, group_size) -> None:
  _checks.check_rank(rewards, 1, "rewards")
  _checks.check_rank(path, 2, "path")
  _checks.check_group_size(rewards.shape[0], group_size)
  if path.shape[0] != rewards.shape[0]:
    raise ValueError(f"path must be [B, S] with B = {rewards.shape[0]} (the rewards' rows), "
                     f"got {list(path.shape)}.")
  if segments is not None:
    _checks.check_same_shape(segments=segments, mask=mask)
    if segments.shape[0] != rewards.shape[0]:
      raise ValueError(f"segments and mask must be [B, T] with B = {rewards.shape[0]}, got "
                       f"{list(segments.shape)}.")


def _centred_rewards(rewards: Array, group_size: int) -> tuple[Array, Array]:
  """(x [B], scale [B]) with rewards - (group's first reward) = scale x, |x| <= 2."""
  half = rewards.astype(jnp.float32).reshape(-1, group_size) * 0.5
  x, scale = scale_down(half - half[:, :1], axis=1)
  scale = jnp.broadcast_to(scale, x.shape)
  return (2.0 * x).reshape(-1), scale.reshape(-1)


def node_stats(rewards: Array, path: Array, *, group_size: int) -> NodeStats:
  """The value, leaf count and reward std of every node on each row's path, and of the
  root::

    V(n) = (1 / |L(n)|) sum_{l in L(n)} r_l,   std(n)^2 = sum_{l in L(n)} (r_l - V(n))^2
                                                          / (|L(n)| - 1)

  over the leaves L(n) below node n (the rows whose path holds n). Values and stds are in
  the units of `NodeStats.scale` (rewards centred at each group's first one and scaled to
  [-2, 2]).

  Args:
    rewards: ``[B]`` the leaves' rewards, groups of `group_size` contiguous rows.
    path: ``[B, S]`` int node ids, -1 past a row's last segment (module docstring).
    group_size: G, leaves per prompt.

  Returns:
    the `NodeStats`.

  Raises:
    ValueError: on mismatched shapes or a batch `group_size` does not divide.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit.estimators import tree_nodes
    >>> path = jnp.array([[0, 1], [0, 3], [4, 5], [4, 7]])  # two trees of two leaves
    >>> stats = tree_nodes.node_stats(jnp.array([1., 0., 0., 0.]), path, group_size=4)
    >>> (stats.values - stats.root_value[:, None]) * stats.scale[:, None]  # V(n) - V(root)
    Array([[ 0.25,  0.75],
           [ 0.25, -0.25],
           [-0.25, -0.25],
           [-0.25, -0.25]], dtype=float32)
    >>> stats.leaves
    Array([[2., 1.],
           [2., 1.],
           [2., 1.],
           [2., 1.]], dtype=float32)
  """
  _check_tree(rewards, path, None, None, group_size)
  x, scale = _centred_rewards(rewards, group_size)
  on_path = path >= 0
  node_sum = lambda v: _node_sum(v, path)
  leaves = node_leaves(path)
  values = safe_divide(node_sum(jnp.broadcast_to(x[:, None], path.shape)), leaves)
  squares = node_sum((x[:, None] - values) ** 2)
  stds = safe_sqrt(safe_divide(squares, leaves - 1.0))
  grouped = x.reshape(-1, group_size)
  root = jnp.mean(grouped, axis=1, keepdims=True)
  root_std = safe_sqrt(jnp.sum((grouped - root) ** 2, axis=1, keepdims=True)
                       / max(group_size - 1, 1))
  spread = lambda v: jnp.broadcast_to(v, grouped.shape).reshape(-1)
  return NodeStats(values=jnp.where(on_path, values, 0.0), leaves=leaves,
                   stds=jnp.where(on_path, stds, 0.0), root_value=spread(root),
                   root_std=spread(root_std), scale=scale)


def _node_sum(per_row: Array, path: Array) -> Array:
  """[B, S]: at each path entry, the sum of `per_row` [B, S] over the entries of the same
  node (0 past a row's path)."""
  batch, depth = path.shape
  on_path = path >= 0
  ids = jnp.where(on_path, path, batch * depth).reshape(-1)  # off-path entries: a spare id
  sums = jax.ops.segment_sum(jnp.where(on_path, per_row, 0.0).reshape(-1), ids,
                             num_segments=batch * depth + 1)
  return jnp.where(on_path, sums[ids].reshape(batch, depth), 0.0)


def node_leaves(path: Array) -> Array:
  """|L(n)|, the leaves (rows) below each node on each row's path.

  Args:
    path: ``[B, S]`` int node ids, -1 past a row's last segment (module docstring).

  Returns:
    ``[B, S]`` float32 leaf counts, 0 past a row's path.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit.estimators import tree_nodes
    >>> tree_nodes.node_leaves(jnp.array([[0, 1], [0, 3], [4, -1]]))
    Array([[2., 1.],
           [2., 1.],
           [1., 0.]], dtype=float32)
  """
  _checks.check_rank(path, 2, "path")
  return _node_sum(jnp.ones(path.shape, jnp.float32), path)


def _parents(stats: NodeStats) -> Array:
  """[B, S] V of each path node's parent: the root for k = 0."""
  return jnp.concatenate([stats.root_value[:, None], stats.values[:, :-1]], axis=1)


def _on_tokens(per_segment: Array, segments: Array, mask: Array) -> Array:
  """[B, S] per-segment values on the [B, T] response tokens of each segment, 0 at masked
  positions and tokens outside every segment."""
  valid = as_bool(mask) & (segments >= 0)
  index = jnp.clip(segments, 0, per_segment.shape[1] - 1)
  return jnp.where(valid, jnp.take_along_axis(per_segment, index, axis=1), 0.0)
