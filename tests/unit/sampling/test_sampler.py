"""The KV-cache sampler: behaviour log-probs equal teacher forcing; cache == no cache."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcredit.logprobs import token_entropy, token_logprobs
from jaxcredit.models import preset
from jaxcredit.sampling import (Actions, continue_contexts, extend_contexts, generate,
                                inverse_cdf_sample, left_align, sample_token, start_contexts)
from bench.no_cache import generate_without_cache
from tests.conftest import doc_block
from tests.unit.sampling.conftest import peaked_model

CONFIG = preset("tiny", vocab_size=32)


@pytest.fixture(scope="module")
def model():
  return peaked_model(CONFIG, 8)


def _prompts(seed=0, batch=4, length=7):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, CONFIG.vocab_size, (batch, length))
  lengths = rng.integers(2, length + 1, batch)
  valid = np.arange(length)[None] >= (length - lengths)[:, None]  # left-padded
  return jnp.asarray(np.where(valid, tokens, 0)), jnp.asarray(valid)


@pytest.mark.parametrize(
  "temperature,top_k,top_p", [(1.0, None, None), (0.7, 8, None), (1.3, None, 0.9)]
)
def test_behaviour_logprobs_equal_teacher_forcing(model, temperature, top_k, top_p):
  prompts, valid = _prompts()
  out = generate(
    model,
    prompts,
    valid,
    jax.random.key(1),
    max_new_tokens=9,
    temperature=temperature,
    top_k=top_k,
    top_p=top_p,
    stop_tokens=(5, 7),
  )
  forced = model(out.tokens, positions=out.positions, token_valid=out.token_valid)
  logits = forced.logits[:, :-1]
  want_logp = token_logprobs(logits, out.tokens[:, 1:], temperature=temperature)
  want_entropy = token_entropy(logits / temperature)
  mask = np.asarray(out.mask[:, 1:])
  assert mask.any()
  # Tolerance: float32, cached vs full attention summation order.
  np.testing.assert_allclose(
    np.asarray(out.logprobs[:, 1:])[mask], np.asarray(want_logp)[mask], atol=1e-4
  )
  np.testing.assert_allclose(
    np.asarray(out.entropy[:, 1:])[mask], np.asarray(want_entropy)[mask], atol=1e-4
  )
  np.testing.assert_array_equal(np.asarray(out.logprobs)[~np.asarray(out.mask)], 0.0)


def test_cache_and_recompute_agree_under_greedy(model):
  prompts, valid = _prompts(2)
  kwargs = dict(max_new_tokens=12, temperature=0.0, stop_tokens=(5,))
  cached = generate(model, prompts, valid, jax.random.key(0), **kwargs)
  recomputed = generate_without_cache(model, prompts, valid, jax.random.key(0), **kwargs)
  np.testing.assert_array_equal(cached.tokens, recomputed.tokens)
  np.testing.assert_array_equal(cached.mask, recomputed.mask)
  np.testing.assert_array_equal(cached.truncated, recomputed.truncated)
  # float32, cached vs full attention summation order: up to 1.4e-4 apart on some CPUs
  # (one token of 76 here), with identical greedy tokens.
  np.testing.assert_allclose(cached.logprobs, recomputed.logprobs, atol=2e-4)


def test_contexts_grown_chunk_by_chunk_sample_what_generate_samples_after_the_whole(model):
  """start_contexts(first part) + extend_contexts(second part, one row with none) +
  continue_contexts == generate on the concatenated prompts, same key: the same draws."""
  first, first_valid = _prompts(3, batch=4, length=5)
  second, second_valid = _prompts(4, batch=4, length=6)
  second_valid = second_valid.at[1].set(False)  # a row with nothing new
  second = jnp.where(second_valid, second, 0)
  whole, whole_valid = np.zeros((4, 11), np.int32), np.zeros((4, 11), bool)
  for row in range(4):  # each row's two parts, joined and left-padded
    ids = np.concatenate(
      [
        np.asarray(part)[row][np.asarray(valid)[row]]
        for part, valid in ((first, first_valid), (second, second_valid))
      ]
    )
    whole[row, 11 - len(ids) :], whole_valid[row, 11 - len(ids) :] = ids, True
  kwargs = dict(max_new_tokens=8, temperature=1.0, stop_tokens=(5,))
  want = generate(model, whole, whole_valid, jax.random.key(7), **kwargs)
  contexts = start_contexts(model, first, first_valid, slots=5 + 6 + 8)
  contexts = extend_contexts(model, contexts, second, second_valid)
  got, contexts = continue_contexts(
    model, contexts, jax.random.key(7), done=jnp.zeros(4, bool), **kwargs
  )
  response = slice(whole.shape[1], None)
  np.testing.assert_array_equal(got.tokens, want.tokens[:, response])
  np.testing.assert_array_equal(got.mask, want.mask[:, response])
  np.testing.assert_array_equal(got.truncated, want.truncated)
  np.testing.assert_allclose(got.logprobs, want.logprobs[:, response], atol=1e-4)
  np.testing.assert_allclose(got.entropy, want.entropy[:, response], atol=1e-4)
  np.testing.assert_array_equal(contexts.length, whole_valid.sum(1) + got.mask.sum(1))
  assert int(contexts.slot) == 5 + 6 + int(got.decode_steps)
  with pytest.raises(ValueError, match="8 columns do not fit in the cache's"):
    extend_contexts(model, contexts, *_prompts(5, length=8))


def test_rows_done_before_a_continuation_sample_nothing(model):
  prompts, valid = _prompts(6)
  contexts = start_contexts(model, prompts, valid, slots=7 + 6)
  done = jnp.asarray([True, False, True, False])
  got, after = continue_contexts(
    model, contexts, jax.random.key(0), max_new_tokens=6, done=done, stop_tokens=(5,)
  )
  assert not np.asarray(got.mask)[[0, 2]].any() and np.asarray(got.mask)[[1, 3]].all(axis=1).any()
  np.testing.assert_array_equal(np.asarray(got.truncated)[[0, 2]], False)
  np.testing.assert_array_equal(
    after.length, np.asarray(valid).sum(1) + np.asarray(got.mask).sum(1)
  )


def test_stop_tokens_end_the_response(model):
  prompts, valid = _prompts(3, batch=8)
  out = generate(
    model, prompts, valid, jax.random.key(3), max_new_tokens=16, stop_tokens=(5, 7), pad_id=0
  )
  tokens, mask = np.asarray(out.tokens[:, 7:]), np.asarray(out.mask[:, 7:])
  stopped = 0
  for row_tokens, row_mask, truncated in zip(tokens, mask, np.asarray(out.truncated)):
    hits = np.flatnonzero(np.isin(row_tokens, (5, 7)) & row_mask)
    assert truncated == (
      hits.size == 0
    )  # cut off by the budget exactly when no stop token was sampled
    if hits.size:
      stopped += 1
      end = hits[0]
      assert row_mask[: end + 1].all() and not row_mask[end + 1 :].any()
      assert (row_tokens[end + 1 :] == 0).all()
    else:
      assert row_mask.all()
  assert stopped > 0
  unbounded = generate(model, prompts, valid, jax.random.key(3), max_new_tokens=4, pad_id=0)
  assert not np.asarray(
    unbounded.truncated
  ).any()  # no stop tokens: fixed-length responses, never cut off


@pytest.mark.parametrize("use_actions", [False, True])
def test_stopping_when_every_row_is_done_equals_the_full_length_run(model, use_actions):
  prompts, valid = _prompts(5, batch=6)
  stop_tokens = tuple(range(1, 20))  # most of the vocabulary: every row stops within a few steps
  actions = None
  if use_actions:
    allowed = np.ones((7 + 40, CONFIG.vocab_size), bool)
    allowed[7:9, 1:20] = False  # the first two response tokens cannot stop
    actions = Actions(jnp.asarray(allowed))
  kwargs = dict(max_new_tokens=40, stop_tokens=stop_tokens, pad_id=0, actions=actions)
  early = generate(model, prompts, valid, jax.random.key(5), **kwargs)
  full = generate(model, prompts, valid, jax.random.key(5), stop_when_done=False, **kwargs)
  assert int(full.decode_steps) == 40
  assert (2 if use_actions else 1) <= int(early.decode_steps) < 40
  # The last row to stop did so at the last decode step run.
  response_lengths = np.asarray(early.mask).sum(axis=1)
  assert response_lengths.max() == int(early.decode_steps)
  assert not np.asarray(early.truncated).any()
  for name in early._fields:
    if name != "decode_steps":
      np.testing.assert_array_equal(getattr(early, name), getattr(full, name), err_msg=name)


def test_a_row_without_stop_token_runs_the_whole_budget(model):
  prompts, valid = _prompts(6, batch=4)
  out = generate(model, prompts, valid, jax.random.key(1), max_new_tokens=9)  # no stop tokens
  assert int(out.decode_steps) == 9 and np.asarray(out.mask)[:, 7:].all()


def test_right_padding_matches_left_padding(model):
  prompts, valid = _prompts(4)
  length = prompts.shape[1]
  n_valid = valid.sum(1, keepdims=True)
  source = (jnp.arange(length)[None] + (length - n_valid)) % length
  right, right_valid = (
    jnp.take_along_axis(prompts, source, 1),
    jnp.take_along_axis(valid, source, 1),
  )
  np.testing.assert_array_equal(left_align(right, right_valid)[0], prompts)
  a = generate(model, prompts, valid, jax.random.key(5), max_new_tokens=6)
  b = generate(model, right, right_valid, jax.random.key(5), max_new_tokens=6, padding="right")
  np.testing.assert_array_equal(a.tokens, b.tokens)


def test_deterministic_under_key_and_greedy_limits(model):
  prompts, valid = _prompts(5)
  sample = lambda seed, **kw: (
    generate(model, prompts, valid, jax.random.key(seed), max_new_tokens=8, **kw).tokens
  )
  np.testing.assert_array_equal(sample(0), sample(0))
  assert not np.array_equal(sample(0), sample(1))
  greedy = sample(0, temperature=0.0)
  np.testing.assert_array_equal(sample(1, top_k=1), greedy)
  np.testing.assert_array_equal(sample(2, top_p=1e-6), greedy)


def test_bad_arguments_raise(model):
  prompts, valid = _prompts()
  with pytest.raises(ValueError, match="max_new_tokens must be a positive int"):
    generate(model, prompts, valid, jax.random.key(0), max_new_tokens=0)
  with pytest.raises(ValueError, match="top_p must be in"):
    generate(model, prompts, valid, jax.random.key(0), max_new_tokens=2, top_p=1.5)
  with pytest.raises(ValueError, match="Unknown padding 'middle'"):
    generate(model, prompts, valid, jax.random.key(0), max_new_tokens=2, padding="middle")
  with pytest.raises(ValueError, match=r"prompt_valid\[4, 6\]"):
    generate(model, prompts, valid[:, :6], jax.random.key(0), max_new_tokens=2)


def test_readme_models_example_runs(model):
  block = doc_block("generate(model")
  prompts, valid = _prompts(6, batch=8)
  namespace = {"prompts": prompts, "prompt_valid": valid, "eos_id": 5}
  exec(block.replace('preset("tiny")', 'preset("tiny", vocab_size=32)'), namespace)
  out, logp = namespace["out"], namespace["logp"]
  mask = np.asarray(out.mask[:, 1:])
  np.testing.assert_allclose(
    np.asarray(logp)[mask], np.asarray(out.logprobs[:, 1:])[mask], atol=1e-4
  )


def test_action_mask_and_hidden_steps_match_the_learner(model):
  """Sampled actions stay in the allowed sets, and teacher forcing with the same
  transforms (forward.policy_outputs with Actions) reproduces the behaviour log-probs."""
  from jaxcredit.forward import policy_outputs
  from jaxcredit.rollout import Rollout

  prompts, valid = _prompts(3, batch=6)
  steps_, vocab = 8, CONFIG.vocab_size
  rng = np.random.default_rng(4)
  allowed = rng.random((steps_, vocab)) < 0.3
  allowed[:, 9] = True  # at least one action per step
  hidden = np.arange(steps_) % 3 != 1
  rows = Actions(
    np.concatenate([np.ones((prompts.shape[1], vocab), bool), allowed]),
    np.concatenate([np.zeros(prompts.shape[1], bool), hidden]),
    4,
  )
  out = generate(model, prompts, valid, jax.random.key(5), max_new_tokens=steps_, actions=rows)
  response = np.asarray(out.tokens)[:, prompts.shape[1] :]
  assert allowed[np.arange(steps_)[None], response].all()
  rollout = Rollout(
    tokens=out.tokens,
    mask=out.mask,
    rewards=jnp.zeros(6),
    group_size=1,
    positions=out.positions,
    token_valid=out.token_valid,
  )
  forced = policy_outputs(model, rollout, 1.0, rows)
  mask = np.asarray(out.mask)
  np.testing.assert_allclose(
    np.asarray(forced.logprobs)[mask], np.asarray(out.logprobs)[mask], atol=1e-4
  )
  np.testing.assert_allclose(
    np.asarray(forced.entropy)[mask], np.asarray(out.entropy)[mask], atol=1e-4
  )
  # A hidden token never reaches a later input: changing it leaves every later log-prob unchanged.
  changed = np.asarray(out.tokens).copy()
  column = prompts.shape[1] + 2  # response step 2 is hidden
  changed[:, column] = np.where(changed[:, column] == 9, 10, 9)
  again = policy_outputs(model, rollout.replace(tokens=jnp.asarray(changed)), 1.0, rows)
  np.testing.assert_allclose(
    np.asarray(again.logprobs)[:, column + 1 :],
    np.asarray(forced.logprobs)[:, column + 1 :],
    atol=1e-6,
  )
  recomputed = generate_without_cache(
    model,
    prompts,
    valid,
    jax.random.key(5),
    max_new_tokens=steps_,
    actions=rows,
    temperature=0.0,
  )
  cached = generate(
    model, prompts, valid, jax.random.key(5), max_new_tokens=steps_, actions=rows, temperature=0.0
  )
  np.testing.assert_array_equal(cached.tokens, recomputed.tokens)
  with pytest.raises(ValueError, match="actions.allowed must have shape"):
    generate(
      model, prompts, valid, jax.random.key(5), max_new_tokens=steps_, actions=Actions(allowed[:3])
    )


def test_per_row_action_masks_and_hidden_steps_equal_row_by_row_sampling(model):
  prompts, valid = _prompts(6, batch=3)
  rng = np.random.default_rng(7)
  width = prompts.shape[1] + 5
  allowed = rng.random((3, width, CONFIG.vocab_size)) < 0.4
  allowed[..., 11] = True
  hidden = rng.random((3, width)) < 0.5
  hidden[:, : prompts.shape[1]] = False
  for sample in (generate, generate_without_cache):
    together = sample(
      model,
      prompts,
      valid,
      jax.random.key(0),
      max_new_tokens=5,
      temperature=0.0,
      actions=Actions(allowed, hidden, 4),
    )
    for row in range(3):
      alone = sample(
        model,
        prompts[row : row + 1],
        valid[row : row + 1],
        jax.random.key(0),
        max_new_tokens=5,
        temperature=0.0,
        actions=Actions(allowed[row], hidden[row], 4),
      )
      np.testing.assert_array_equal(together.tokens[row], alone.tokens[0])
      # The logits are large (weights x 8): the batch size may change float32 sum orders.
      np.testing.assert_allclose(together.logprobs[row], alone.logprobs[0], rtol=2e-3, atol=1e-5)


def _reference_inverse_cdf(probs, u_block, u_token, block):
  """float64 NumPy: the block by searchsorted on cumulative block masses, then
  the entry within it by searchsorted on the block's own cumulative sums."""
  probs = np.asarray(probs, np.float64)
  out = []
  for row, u1, u2 in zip(probs, u_block, u_token):
    row = np.pad(row, (0, -len(row) % block)).reshape(-1, block)
    masses = np.cumsum(row.sum(1))
    j = min(np.searchsorted(masses, u1 * masses[-1], side="right"), np.flatnonzero(row.sum(1))[-1])
    within = np.cumsum(row[j])
    i = min(np.searchsorted(within, u2 * within[-1], side="right"), np.flatnonzero(row[j])[-1])
    out.append(j * block + i)
  return np.asarray(out)


@pytest.mark.parametrize("vocab,block", [(50, 8), (300, 128), (7, 128)])
def test_inverse_cdf_sample_matches_a_float64_reference(vocab, block):
  rng = np.random.default_rng(vocab)
  probs = rng.random((64, vocab)) * (rng.random((64, vocab)) < 0.6)  # zeros
  probs[::2, block : 2 * block] = 0.0  # a whole block without mass (where V has a second block)
  probs[:, 0] += 1e-3  # every row has mass
  u = rng.random((2, 64))
  u[:, :4] = [[0.0, 1.0 - 2**-24, 0.5, 1.0 - 2**-24], [0.0, 1.0 - 2**-24, 1.0 - 2**-24, 0.0]]
  probs32, u32 = jnp.asarray(probs, jnp.float32), jnp.asarray(u, jnp.float32)
  got = jax.jit(inverse_cdf_sample, static_argnames="block")(probs32, u32[0], u32[1], block=block)
  np.testing.assert_array_equal(got, _reference_inverse_cdf(probs, u[0], u[1], block))
  assert (probs[np.arange(64), np.asarray(got)] > 0).all()  # never a zero-probability entry


def test_inverse_cdf_sample_never_draws_zero_probability_at_the_edges():
  probs = jnp.zeros((3, 300)).at[0, 7].set(1.0).at[1, 299].set(1e-30).at[1, 0].set(1.0)
  probs = probs.at[2, 128:256].set(1.0)  # only the middle block
  for u in (0.0, 0.999, 1.0 - 2**-24, 1.0):  # 1.0 is outside [0, 1) but must still be safe
    got = inverse_cdf_sample(probs, jnp.full(3, u), jnp.full(3, u))
    assert (np.asarray(probs)[np.arange(3), np.asarray(got)] > 0).all(), u


@pytest.mark.parametrize(
  "temperature,top_k,top_p", [(1.0, None, None), (0.7, 5, None), (1.3, None, 0.8)]
)
def test_sample_token_draws_the_truncated_softmax(temperature, top_k, top_p):
  """Frequencies of 200k draws against the float64 target distribution (z-scores < 5)."""
  rng = np.random.default_rng(1)
  logits = rng.normal(size=300) * 2
  logits[rng.random(300) < 0.3] = -np.inf  # banned tokens
  z = logits / temperature
  p = np.exp(z - z[np.isfinite(z)].max())
  order = np.argsort(-p)
  if top_k is not None:
    p[order[top_k:]] = 0
  if top_p is not None:
    mass = np.cumsum(p[order]) / p.sum()
    p[order[np.searchsorted(mass, top_p) + 1 :]] = 0
  p /= p.sum()
  draws, batch = 200_000, 1000
  sample = jax.jit(
    jax.vmap(
      lambda k: sample_token(
        jnp.broadcast_to(jnp.asarray(logits, jnp.float32), (batch, 300)),
        k,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
      )
    )
  )
  tokens = np.asarray(sample(jax.random.split(jax.random.key(0), draws // batch))).ravel()
  counts = np.bincount(tokens, minlength=300)
  assert counts[p == 0].sum() == 0
  z_scores = (counts - draws * p) / np.sqrt(draws * p * (1 - p) + 1e-12)
  assert np.abs(z_scores[p > 0]).max() < 5, np.abs(z_scores).max()
