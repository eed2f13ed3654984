"""Tree sampling: a prompt's responses share prefixes, sampled by forking rows of the KV cache.

Each prompt is prefilled once; its `roots` first segments are sampled from copies of that
row; then, `depth` times, every row is copied `branching` times (its cache rows, logits and
length: copy-on-fork, never a recomputed prefix) and each copy samples the next segment.
A prompt's G = roots * branching^depth leaves are contiguous rows of the output, the same
layout as `generate`'s (so a tree is a group of G responses to the trainer), and each
row's ``depth + 1`` segments are recorded as the tree's nodes (`TreeSample.path`,
`TreeSample.segments`: the layout the tree estimators of
`jaxcredit.estimators.tree_credit` read).

Segments are sampled in fixed response columns: segment k < depth owns `segment_tokens`
columns, the last one the rest of `max_new_tokens`. A `fork="fixed"` segment fills its
columns, and the output keeps them (`jaxcredit.forward.tree_forward` runs each node once at
its columns); a `fork="delimiter"` segment ends after its first delimiter token, a
`fork="entropy"` one before its first token (after one) whose entropy under the policy
reaches a threshold (TreeRL's entropy-guided forking, made online: the children draw the
uncertain token anew). Each output row of those two rules is then closed up (its sampled
tokens moved left over the holes, in order, as `generate` lays out a response), so a
teacher-forced pass reads every token after the one before it; its segments then start at
columns of their own. A row that emits a stop token
is finished: its copies sample nothing more.

Keys: the leaf reached by root m and children c_1, ..., c_d of a prompt p samples segment d
with the key ``fold_in(... fold_in(fold_in(fold_in(key, p), m), c_1) ..., c_d)``, its own,
so a leaf draws exactly what an unshared row would draw with those keys (a row's draws
depend on its key and context only).
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from jaxcredit.estimators.tree_nodes import node_leaves
from jaxcredit.models.transformer import Transformer
from jaxcredit.sampling import contexts as contexts_lib
from jaxcredit.sampling import sampler
from jaxcredit.sampling.actions import Actions

FORK_RULES = ("fixed", "delimiter", "entropy")


class TreeSpec(NamedTuple):
  """The shape of the tree sampled from each prompt.

  Attributes:
    roots: M, first segments sampled from the prompt (independent chains).
    branching: k, children of each forked row.
    depth: D, forks along each path (D + 1 segments).
    segment_tokens: the response columns of each segment but the last, which has the rest
      of the response budget.
    fork: "fixed" (a segment fills its columns), "delimiter" (it ends after `delimiter`) or
      "entropy" (it ends before the first token, after its first, whose entropy reaches
      `entropy_threshold`: the children draw that uncertain token anew).
    delimiter: the token that ends a segment with ``fork="delimiter"``.
    entropy_threshold: the entropy (nats) that ends a segment with ``fork="entropy"``.
  """

  roots: int = 1
  branching: int = 2
  depth: int = 1
  segment_tokens: int = 8
  fork: str = "fixed"
  delimiter: int | None = None
  entropy_threshold: float | None = None

  @property
  def leaves(self) -> int:
    """G = roots * branching^depth, the leaves of one prompt's tree."""
    return self.roots * self.branching**self.depth

  def check(self, max_new_tokens: int, actions: Actions | None = None) -> "TreeSpec":
    """Raises ValueError naming the setting on a tree that cannot be sampled within
    `max_new_tokens` (or, with ``fork="delimiter"``, with `actions` that differ between
    response columns: closed-up rows move tokens to other columns); returns self."""
    if min(self.roots, self.branching, self.segment_tokens) < 1 or self.depth < 0:
      raise ValueError(f"rollout.tree needs roots, branching, segment_tokens >= 1 and "
                       f"depth >= 0, got {self._asdict()}.")
    if self.fork not in FORK_RULES:
      raise ValueError(f"rollout.tree.fork must be one of {', '.join(FORK_RULES)}, got "
                       f"{self.fork!r}.")
    if (self.fork == "delimiter") != (self.delimiter is not None):
      raise ValueError("rollout.tree.delimiter is the token that ends a segment: set it with "
                       f"fork='delimiter' and only then (fork={self.fork!r}, "
                       f"delimiter={self.delimiter!r}).")
    if (self.fork == "entropy") != (self.entropy_threshold is not None) or (
        self.fork == "entropy" and not self.entropy_threshold > 0):
      raise ValueError("rollout.tree.entropy_threshold is the entropy (> 0 nats) that ends a "
                       f"segment: set it with fork='entropy' and only then (fork={self.fork!r}, "
                       f"entropy_threshold={self.entropy_threshold!r}).")
    if self.fork != "fixed" and actions is not None and (
        actions.per_column or actions.hidden is not None):
      raise ValueError(f"rollout.tree.fork = {self.fork!r} closes up each response, which moves "
                       "tokens to other columns: it cannot apply per-column actions (allowed "
                       "tokens or hidden columns); use fork='fixed'.")
    last = max_new_tokens - self.depth * self.segment_tokens
    if last < 1:
      raise ValueError(
          f"rollout.tree forks after {self.depth} segments of {self.segment_tokens} tokens "
          f"({self.depth * self.segment_tokens} columns), beyond the response budget of "
          f"{max_new_tokens} tokens: lower depth or segment_tokens to at most "
          f"{(max_new_tokens - 1) // max(self.depth, 1)} tokens per segment, or raise the "
          "budget.")
    return self

  def budgets(self, max_new_tokens: int) -> tuple[int, ...]:
    """The columns of each segment: `segment_tokens` each, the last the rest."""
    return (self.segment_tokens,) * self.depth + (
        max_new_tokens - self.depth * self.segment_tokens,)

  def slots(self, max_new_tokens: int) -> int:
    """The response tokens one tree holds, each node's once: what it samples when no row
    stops early (sum over levels of the level's rows times its segment's columns)."""
    return sum(self.roots * self.branching**level * width
               for level, width in enumerate(self.budgets(max_new_tokens)))


class TreeSample(NamedTuple):
  """What `sample_tree` returns.

  Attributes:
    output: the leaves as a `SampleOutput` ``[B, P + N]``, B = prompts * G, each prompt's G
      leaves contiguous.
    path: ``[B, D + 1]`` int32 node ids of each row's segments (a node's id is its first
      row * (D + 1) + its level; the parent of path[:, k] is path[:, k - 1]).
    segments: ``[B, P + N]`` int32 the segment of each sampled token, -1 elsewhere.
    generated_tokens: ``[]`` int the tokens the tree sampled (a shared segment counted once).
    prefill_tokens: ``[]`` int the prompt tokens prefilled (each prompt once).
  """

  output: sampler.SampleOutput
  path: Array
  segments: Array
  generated_tokens: Array
  prefill_tokens: Array


def token_shares(path: Array, segments: Array, mask: Array) -> Array:
  """Each token's share of its segment's one sampling: 1 / |L(n_k)| for a token of segment k,
  shared by the |L(n_k)| rows below its node, 0 off the sampled tokens. Summed over the
  rows, a shared token counts once.

  Args:
    path: ``[B, S]`` int node ids of each row's segments (`TreeSample.path`).
    segments: ``[B, T]`` int segment of each token, -1 elsewhere.
    mask: ``[B, T]`` the sampled tokens.

  Returns:
    ``[B, T]`` float32 shares.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit.sampling import tree
    >>> path = jnp.array([[0, 1], [0, 3]])                  # a shared first segment
    >>> segments = jnp.array([[0, 0, 1], [0, 0, 1]])
    >>> tree.token_shares(path, segments, jnp.ones((2, 3), bool)).tolist()
    [[0.5, 0.5, 1.0], [0.5, 0.5, 1.0]]
  """
  leaves = node_leaves(path)
  valid = jnp.asarray(mask, bool) & (segments >= 0)
  shared = jnp.take_along_axis(leaves, jnp.clip(segments, 0, path.shape[1] - 1), axis=1)
  return jnp.where(valid, 1.0 / jnp.where(valid, shared, 1.0), 0.0)


def generated_tokens(path: Array, segments: Array, mask: Array) -> Array:
  """The tokens a tree's rows hold, each shared segment counted once: what sampling the tree
  generated. A token of segment k is shared by the |L(n_k)| rows below its node::

    sum_{b, t: mask, segments >= 0} 1 / |L(path[b, segments[b, t]])|   (`token_shares`)

  Args:
    path: ``[B, S]`` int node ids of each row's segments (`TreeSample.path`).
    segments: ``[B, T]`` int segment of each token, -1 elsewhere.
    mask: ``[B, T]`` the sampled tokens.

  Returns:
    ``[]`` int32, the count.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxcredit.sampling import tree
    >>> path = jnp.array([[0, 1], [0, 3]])                  # a shared first segment
    >>> segments = jnp.array([[0, 0, 1], [0, 0, 1]])
    >>> tree.generated_tokens(path, segments, jnp.ones((2, 3), bool)).item()
    4
  """
  return jnp.round(jnp.sum(token_shares(path, segments, mask))).astype(jnp.int32)


def render(tokens, path, segments, *, group_size: int, group: int = 0, decode=None,
           rewards=None) -> str:
  """One sampled tree as indented text: each node's segment under its parent's.

  Args:
    tokens: ``[B, L]`` the rows (`TreeSample.output.tokens`).
    path: ``[B, S]`` node ids of each row's segments (`TreeSample.path`).
    segments: ``[B, L]`` the segment of each sampled token, -1 elsewhere.
    group_size: G, the leaves of one prompt's tree.
    group: which prompt's tree.
    decode: ``decode(token_ids) -> str`` for a segment's tokens (None: the ids).
    rewards: ``[B]`` the leaves' rewards, shown after each leaf (None: not shown).

  Returns:
    the picture, one line per node ("(nothing: finished)" for a segment after a stop token).

  Examples:
    >>> import numpy as np
    >>> from jaxcredit.sampling import tree
    >>> tokens = np.array([[7, 1, 2, 3], [7, 1, 2, 4], [7, 1, 5, 6], [7, 1, 5, 5]])
    >>> segments = np.array([[-1, 0, 1, 2]] * 4)
    >>> path = np.array([[0, 1, 2], [0, 1, 5], [0, 7, 8], [0, 7, 11]])
    >>> print(tree.render(tokens, path, segments, group_size=4, rewards=[1, 0, 0, 1]))
    1
    ├── 2
    │   ├── 3  -> 1
    │   └── 4  -> 0
    └── 5
        ├── 6  -> 0
        └── 5  -> 1
  """
  tokens, path, segments = (np.asarray(x) for x in (tokens, path, segments))
  decode = decode or (lambda ids: " ".join(str(int(i)) for i in ids))
  rows = range(group * group_size, (group + 1) * group_size)
  lines = []

  def visit(members, level, prefix, last, top):
    first = members[0]
    text = decode(tokens[first][segments[first] == level]) or "(nothing: finished)"
    leaf = level + 1 == path.shape[1] or path[first, level + 1] < 0
    note = f"  -> {float(rewards[first]):g}" if leaf and rewards is not None else ""
    lines.append(text + note if top else f"{prefix}{'└── ' if last else '├── '}{text}{note}")
    if leaf:
      return
    children = list(dict.fromkeys(int(path[r, level + 1]) for r in members))
    inner = "" if top else prefix + ("    " if last else "│   ")
    for i, child in enumerate(children):
      visit([r for r in members if path[r, level + 1] == child], level + 1, inner,
            i == len(children) - 1, False)

  roots = list(dict.fromkeys(int(path[r, 0]) for r in rows))
  for root in roots:
    visit([r for r in rows if path[r, 0] == root], 0, "", True, True)
  return "\n".join(lines)


def fork(contexts: contexts_lib.Contexts, parents: Array) -> contexts_lib.Contexts:
  """Copy-on-fork of rows held in a KV cache.

  Args:
    contexts: the rows' `Contexts`.
    parents: ``[R']`` int, the row each new row copies.

  Returns:
    `Contexts` of R' rows: copies of the parents' cache rows, logits and lengths.
  """
  return contexts_lib.Contexts(cache=contexts.cache.rows(parents), logits=contexts.logits[parents],
                          length=contexts.length[parents], slot=contexts.slot)


def _child_keys(keys: Array, count: int) -> Array:
  """[R * count] keys: each of `keys` [R] folded with 0, ..., count - 1 (row-major)."""
  children = jnp.arange(count)
  return jax.vmap(lambda k: jax.vmap(lambda c: jax.random.fold_in(k, c))(children))(
      keys).reshape(-1)


def node_ids(tree: TreeSpec, rows: int) -> np.ndarray:
  """The node ids of whole trees' rows (`TreeSample.path`).

  Args:
    tree: the `TreeSpec` (its roots, branching and depth).
    rows: B, whole trees' leaves in `sample_tree`'s row order.

  Returns:
    int32 ``[rows, D + 1]``: a level-d node spans blocks of branching^(D - d) rows, its id
    is its first row * (D + 1) + d.
  """
  levels = tree.depth + 1
  row = np.arange(rows)[:, None]
  block = tree.branching ** (tree.depth - np.arange(levels))[None]
  return ((row - row % block) * levels + np.arange(levels)[None]).astype(np.int32)


def sample_tree(model: Transformer, prompts: Array, prompt_valid: Array, key: Array, *,
                tree: TreeSpec, max_new_tokens: int, temperature: float = 1.0,
                stop_tokens: tuple[int, ...] = (), pad_id: int = 0, padding: str = "left",
                actions: Actions | None = None) -> TreeSample:
  """Samples a tree of `tree.leaves` responses per prompt, sharing prefixes (module
  docstring), in one compiled program: the prefill, each level's decode loop and the forks.

  Args:
    model: the policy.
    prompts: ``[n, P]`` int prompt ids.
    prompt_valid: ``[n, P]`` bool.
    key: a PRNG key.
    tree: the `TreeSpec`.
    max_new_tokens: N, the response columns.
    temperature: the sampling temperature; 0 is greedy.
    stop_tokens: ids that end a response.
    pad_id: the id written where nothing was sampled.
    padding: "left" or "right", the side of the prompts' pads.
    actions: allowed tokens and hidden columns of the ``[P + N]`` output columns (as
      `generate`'s, one table for every row).

  Returns:
    the `TreeSample`.

  Raises:
    ValueError: on a tree that does not fit the budget (`TreeSpec.check`), or `generate`'s
      invalid arguments.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from flax import nnx
    >>> from jaxcredit.models import Transformer, preset
    >>> from jaxcredit.sampling import TreeSpec, sample_tree
    >>> model = Transformer(preset("tiny", vocab_size=16), rngs=nnx.Rngs(0))
    >>> spec = TreeSpec(roots=1, branching=2, depth=2, segment_tokens=2)
    >>> out = sample_tree(model, jnp.ones((1, 3), jnp.int32), jnp.ones((1, 3), bool),
    ...                   jax.random.key(0), tree=spec, max_new_tokens=6)
    >>> out.output.tokens.shape, out.path.tolist()
    ((4, 9), [[0, 1, 2], [0, 1, 5], [0, 7, 8], [0, 7, 11]])
    >>> out.generated_tokens.item(), 4 * 6  # shared segments sampled once
    (14, 24)
  """
  tree.check(max_new_tokens, actions)
  graphdef, state, prompts, prompt_valid, allowed, hidden, settings = sampler._prepare(
      model, prompts, prompt_valid, max_new_tokens, temperature, None, None, stop_tokens,
      pad_id, padding, actions, True)
  return _sample_tree(graphdef, state, prompts, prompt_valid, key, allowed, hidden, settings,
                      tree)


@functools.partial(jax.jit, static_argnums=(0, 7, 8))
def _sample_tree(graphdef, state, prompts, prompt_valid, key, allowed, hidden,
                 settings: sampler._Sampling, tree: TreeSpec) -> TreeSample:
  """`sample_tree` on a split model, with `sampler._prepare`'s response tables: one program
  (the prefill, each level's decode loop and forks)."""
  max_new_tokens = settings.max_new_tokens
  count, prompt_len = prompts.shape
  contexts = contexts_lib._start(graphdef, state, prompts, prompt_valid,
                                 prompt_len + max_new_tokens)
  prefilled = jnp.sum(prompt_valid)
  parents = jnp.repeat(jnp.arange(count), tree.roots)
  contexts = fork(contexts, parents)
  keys = _child_keys(jax.vmap(lambda p: jax.random.fold_in(key, p))(jnp.arange(count)),
                     tree.roots)
  done = jnp.zeros(count * tree.roots, bool)
  stops = jnp.asarray(settings.stop_tokens or (-1,))
  pieces, generated, decode_steps, start = [], 0, 0, 0
  for level, width in enumerate(tree.budgets(max_new_tokens)):
    forks = level < tree.depth  # the last segment runs to the end of the budget
    delimiter = (tree.delimiter,) if forks and tree.fork == "delimiter" else ()
    step = settings._replace(max_new_tokens=width, stop_tokens=settings.stop_tokens + delimiter,
                             pause_entropy=tree.entropy_threshold if forks else None)
    table = slice(start, start + width)
    continuation, contexts = contexts_lib._continue_rows(
        graphdef, state, contexts, done, keys, allowed[table], hidden[table], step)
    done = done | jnp.any(continuation.mask & jnp.isin(continuation.tokens, stops), axis=1)
    pieces.append({"tokens": continuation.tokens, "mask": continuation.mask,
                   "logprobs": continuation.logprobs, "entropy": continuation.entropy,
                   "segments": jnp.where(continuation.mask, level, -1).astype(jnp.int32)})
    generated += jnp.sum(continuation.mask)
    decode_steps += continuation.decode_steps
    start += width
    if level < tree.depth:
      parents = jnp.repeat(jnp.arange(done.shape[0]), tree.branching)
      contexts, done = fork(contexts, parents), done[parents]
      keys = _child_keys(keys, tree.branching)
      pieces = [{name: x[parents] for name, x in piece.items()} for piece in pieces]
  prompts, prompt_valid = (jnp.repeat(x, tree.leaves, axis=0) for x in (prompts, prompt_valid))
  response = {name: jnp.concatenate([p[name] for p in pieces], axis=1) for name in pieces[0]}
  if tree.fork != "fixed":  # a segment that ended early left holes: close them
    order = jnp.argsort(~response["mask"], axis=1, stable=True)
    response = {name: jnp.take_along_axis(x, order, axis=1) for name, x in response.items()}
  glue = lambda field, before: jnp.concatenate([before, response[field]], axis=1)
  mask = glue("mask", jnp.zeros(prompts.shape, bool))
  token_valid = glue("mask", prompt_valid)
  output = sampler.SampleOutput(
      tokens=glue("tokens", prompts), mask=mask,
      logprobs=glue("logprobs", jnp.zeros(prompts.shape)),
      entropy=glue("entropy", jnp.zeros(prompts.shape)), token_valid=token_valid,
      positions=sampler.prompt_positions(token_valid),
      truncated=~done if settings.stop_tokens else jnp.zeros_like(done),
      decode_steps=decode_steps)
  return TreeSample(output=output, path=jnp.asarray(node_ids(tree, done.shape[0])),
                    segments=glue("segments", jnp.full(prompts.shape, -1, jnp.int32)),
                    generated_tokens=generated, prefill_tokens=prefilled)
