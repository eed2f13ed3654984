"""Tree sampling: each leaf draws what an unshared row draws with its keys, the prompt is
prefilled once, and the recorded tree is the one the tokens share."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcredit import estimators
from jaxcredit.forward import policy_outputs
from jaxcredit.models import preset
from jaxcredit.rollout import Rollout
from jaxcredit.sampling import (Actions, TreeSpec, continue_contexts, sample_tree,
                                start_contexts)
from jaxcredit.sampling import contexts as contexts_lib
from jaxcredit.sampling import tree as tree_lib
from tests.unit.sampling.conftest import left_padded_prompts, peaked_model

CONFIG = preset("tiny", vocab_size=16)
STOP, DELIMITER = 5, 7


@pytest.fixture(scope="module")
def model():
  return peaked_model(CONFIG, 6)


def _prompts(batch=2, length=4, seed=0):
  return left_padded_prompts(np.random.default_rng(seed), batch, length, 6, 16)


def _leaf_keys(key, spec: TreeSpec, prompts: int) -> list[list]:
  """Per level, the [B] keys of every leaf: fold_in(key, p), then m, c_1, ..., c_d."""
  levels = []
  for level in range(spec.depth + 1):
    keys = []
    for p in range(prompts):
      for leaf in range(spec.leaves):
        digits, rest = [], leaf
        for _ in range(spec.depth):
          digits.append(rest % spec.branching)
          rest //= spec.branching
        path = [rest] + digits[::-1]  # m, c_1, ..., c_D
        k = jax.random.fold_in(key, p)
        for index in path[:level + 1]:
          k = jax.random.fold_in(k, index)
        keys.append(k)
    levels.append(jnp.stack(keys))
  return levels


@pytest.mark.parametrize("spec", [
    TreeSpec(roots=2, branching=2, depth=2, segment_tokens=3),
    TreeSpec(roots=1, branching=3, depth=1, segment_tokens=4, fork="delimiter",
             delimiter=DELIMITER),
])
def test_every_leaf_draws_what_an_unshared_row_draws_with_its_keys(model, spec):
  prompts, valid = _prompts()
  key, budget = jax.random.key(7), 10
  tree = sample_tree(model, prompts, valid, key, tree=spec, max_new_tokens=budget,
                     stop_tokens=(STOP,))
  out = tree.output
  # Unshared: every leaf prefills its own prompt and samples each segment with its keys.
  rows = jnp.repeat(prompts, spec.leaves, axis=0), jnp.repeat(valid, spec.leaves, axis=0)
  contexts = start_contexts(model, *rows, slots=prompts.shape[1] + budget)
  done, pieces = jnp.zeros(rows[0].shape[0], bool), []
  for level, (keys, width) in enumerate(zip(_leaf_keys(key, spec, 2), spec.budgets(budget))):
    stops = (STOP, DELIMITER) if spec.fork == "delimiter" and level < spec.depth else (STOP,)
    piece, contexts = continue_contexts(model, contexts, keys, max_new_tokens=width, done=done,
                                        stop_tokens=stops)
    done = done | jnp.any(piece.mask & (piece.tokens == STOP), axis=1)
    pieces.append(piece)
  # Each row's sampled tokens, in order (a delimiter tree's rows are closed up).
  drawn = lambda field, rows, mask: [np.asarray(rows)[b][np.asarray(mask)[b]]
                                     for b in range(len(mask))]
  unshared_mask = np.concatenate([p.mask for p in pieces], axis=1)
  for field in ("tokens", "logprobs", "entropy"):
    got = drawn(field, getattr(out, field), out.mask)
    want = drawn(field, np.concatenate([getattr(p, field) for p in pieces], axis=1),
                 unshared_mask)
    for g, w in zip(got, want):
      np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)  # float32, other batch sizes
  np.testing.assert_array_equal(out.truncated, ~done)
  if spec.fork == "delimiter":  # segments that ended early (holes closed up) were sampled
    rises = lambda m: np.any(np.diff(m.astype(int), axis=1) > 0, axis=1)  # a hole, then tokens
    closed = np.asarray(out.mask)[:, prompts.shape[1]:]
    assert rises(unshared_mask).any() and not rises(closed).any()
  # The tree's rows share each node's tokens; siblings' leaves differ.
  path, segments = np.asarray(tree.path), np.asarray(tree.segments)
  tokens, mask = np.asarray(out.tokens), np.asarray(out.mask)
  for level in range(spec.depth + 1):
    columns = (segments <= level) & (segments >= 0)
    for a in range(len(path)):
      for b in np.flatnonzero(path[:, level] == path[a, level]):
        np.testing.assert_array_equal(np.where(columns[a], tokens[a], -1),
                                      np.where(columns[b], tokens[b], -1))
  assert len({tuple(row) for row in np.where(mask, tokens, -1)}) > len(tokens) // 2
  # Teacher forcing the leaves gives the sampler's log-probs (holes included).
  rollout = Rollout(tokens=out.tokens, mask=out.mask, rewards=jnp.zeros(len(tokens)),
                    positions=out.positions, token_valid=out.token_valid)
  forced = policy_outputs(model, rollout, 1.0, Actions())
  np.testing.assert_allclose(np.asarray(forced.logprobs)[mask], np.asarray(out.logprobs)[mask],
                             rtol=1e-4, atol=1e-4)


def test_entropy_forks_end_a_segment_before_its_first_uncertain_token(model):
  prompts, valid = _prompts(batch=3, seed=4)
  threshold = 0.8
  spec = TreeSpec(roots=1, branching=2, depth=2, segment_tokens=4, fork="entropy",
                  entropy_threshold=threshold)
  tree = sample_tree(model, prompts, valid, jax.random.key(5), tree=spec, max_new_tokens=12)
  out = tree.output
  entropy, segments = np.asarray(out.entropy), np.asarray(tree.segments)
  mask = np.asarray(out.mask)
  short = 0
  for b in range(len(mask)):
    for k in range(spec.depth):
      columns = np.flatnonzero(segments[b] == k)
      assert 1 <= len(columns) <= spec.segment_tokens
      # Every token of a forking segment after its first is below the threshold...
      assert (entropy[b, columns[1:]] < threshold).all()
      if len(columns) < spec.segment_tokens:  # ...and one that ended early stopped before
        short += 1  # a token at or above it, which the child drew anew
        assert entropy[b, columns[-1] + 1] >= threshold and segments[b, columns[-1] + 1] == k + 1
  assert short > 0, "no segment ended at an uncertain token"
  # Closed-up rows: teacher forcing reads the sampler's log-probs.
  rollout = Rollout(tokens=out.tokens, mask=out.mask, rewards=jnp.zeros(len(mask)),
                    positions=out.positions, token_valid=out.token_valid)
  forced = policy_outputs(model, rollout, 1.0, Actions())
  np.testing.assert_allclose(np.asarray(forced.logprobs)[mask], np.asarray(out.logprobs)[mask],
                             rtol=1e-4, atol=1e-4)


def test_the_prompt_is_prefilled_once_and_shared_segments_are_sampled_once(model, monkeypatch):
  prefilled = []  # the prefills' rows, recorded as the sampler's program is traced
  start = contexts_lib._start
  monkeypatch.setattr(contexts_lib, "_start", lambda g, s, tokens, valid, slots: (
      prefilled.append(tokens.shape), start(g, s, tokens, valid, slots))[1])
  tree_lib._sample_tree.clear_cache()
  prompts, valid = _prompts(batch=3)
  spec = TreeSpec(roots=1, branching=4, depth=2, segment_tokens=2)
  tree = sample_tree(model, prompts, valid, jax.random.key(0), tree=spec, max_new_tokens=6)
  assert prefilled == [prompts.shape]  # every prompt once, before any fork
  assert int(tree.prefill_tokens) == int(np.sum(valid))
  # No stop tokens: 2 + 4 x 2 + 16 x 2 tokens per prompt, against 16 x 6 unshared.
  assert int(tree.generated_tokens) == 3 * (2 + 8 + 32)
  assert int(tree_lib.generated_tokens(tree.path, tree.segments, tree.output.mask)) == int(
      tree.generated_tokens)
  assert tree.output.tokens.shape == (3 * 16, 4 + 6)


def test_a_finished_row_forks_into_finished_copies(model):
  prompts, valid = _prompts(batch=4, seed=2)
  spec = TreeSpec(roots=2, branching=2, depth=2, segment_tokens=3)
  tree = sample_tree(model, prompts, valid, jax.random.key(3), tree=spec, max_new_tokens=9,
                     stop_tokens=(STOP,))
  tokens, mask = np.asarray(tree.output.tokens), np.asarray(tree.output.mask)
  ended = [(b, np.flatnonzero(mask[b] & (tokens[b] == STOP))) for b in range(len(tokens))]
  stopped = [(b, where[0]) for b, where in ended if len(where)]
  assert stopped, "no row emitted the stop token"
  for b, column in stopped:
    assert not mask[b, column + 1:].any()
  np.testing.assert_array_equal(tree.output.truncated, [len(w) == 0 for _, w in ended])


def test_typed_actions_hold_in_every_segment(model):
  prompts, valid = _prompts()
  budget, vocab = 8, CONFIG.vocab_size
  allowed = np.random.default_rng(1).random((budget, vocab)) < 0.4
  allowed[:, 7] = True
  actions = Actions(np.concatenate([np.ones((prompts.shape[1], vocab), bool), allowed]))
  spec = TreeSpec(roots=1, branching=2, depth=3, segment_tokens=2)
  tree = sample_tree(model, prompts, valid, jax.random.key(2), tree=spec, max_new_tokens=budget,
                     actions=actions)
  response = np.asarray(tree.output.tokens)[:, prompts.shape[1]:]
  assert allowed[np.arange(budget)[None], response].all()


def test_the_tree_estimators_read_the_sampled_tree(model):
  prompts, valid = _prompts()
  spec = TreeSpec(roots=2, branching=2, depth=1, segment_tokens=3)
  tree = sample_tree(model, prompts, valid, jax.random.key(4), tree=spec, max_new_tokens=6)
  rewards = jnp.asarray(np.random.default_rng(0).integers(0, 2, 8), jnp.float32)
  rollout = Rollout(tokens=tree.output.tokens, mask=tree.output.mask, rewards=rewards,
                    group_size=spec.leaves,
                    extras={"tree_path": tree.path, "tree_segments": tree.segments})
  spo = estimators.get("spo_tree")(rollout).advantages
  first = prompts.shape[1]
  # The roots' segments carry V(root's chain) - V(prompt); the leaves' the rest.
  rows = np.asarray(rewards).reshape(2, 2, 2)
  chain = rows.mean(axis=2, keepdims=True) - rows.mean(axis=(1, 2), keepdims=True)
  np.testing.assert_allclose(np.asarray(spo)[:, first], np.broadcast_to(chain, (2, 2, 2))
                             .reshape(-1), atol=1e-6)
  with pytest.raises(ValueError, match=r"tree_grpo needs a tree rollout.*rollout.tree.fork"):
    estimators.get("tree_grpo")(rollout.replace(extras={}))


def test_trees_that_do_not_fit_are_refused(model):
  prompts, valid = _prompts()
  sample = lambda spec, budget=8: sample_tree(model, prompts, valid, jax.random.key(0),
                                              tree=spec, max_new_tokens=budget)
  with pytest.raises(ValueError, match="beyond the response budget of 8 tokens"):
    sample(TreeSpec(depth=2, segment_tokens=4))
  with pytest.raises(ValueError, match="fork must be one of fixed, delimiter, entropy"):
    sample(TreeSpec(fork="entropic"))
  with pytest.raises(ValueError, match="delimiter is the token that ends a segment"):
    sample(TreeSpec(fork="delimiter"))
  with pytest.raises(ValueError, match="entropy_threshold is the entropy"):
    sample(TreeSpec(fork="entropy"))
  with pytest.raises(ValueError, match="entropy_threshold is the entropy"):
    sample(TreeSpec(fork="fixed", entropy_threshold=1.0))
  with pytest.raises(ValueError, match="cannot apply per-column actions"):
    sample_tree(model, prompts, valid, jax.random.key(0), max_new_tokens=8,
                tree=TreeSpec(fork="delimiter", delimiter=DELIMITER),
                actions=Actions(np.ones((prompts.shape[1] + 8, CONFIG.vocab_size), bool)))
  with pytest.raises(ValueError, match="branching"):
    sample(TreeSpec(branching=0))
  assert tree_lib.TreeSpec(roots=2, branching=3, depth=2).leaves == 18
