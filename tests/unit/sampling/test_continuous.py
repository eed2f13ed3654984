"""Continuous batching: every response equals the static batch's draw with its key, whatever
slot it lands in and whatever that slot held before; the loop runs the responses' total
length over the slots, not the longest one's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcredit.models import preset
from jaxcredit.sampling import Actions, generate
from jaxcredit.sampling.continuous import generate_continuous, generate_partial, response_keys
from jaxcredit.sampling.partial_responses import carry_over
from tests.unit.sampling.conftest import left_padded_prompts, peaked_model

CONFIG = preset("tiny", vocab_size=16)
STOP = (5, 7)


@pytest.fixture(scope="module")
def model():
  return peaked_model(CONFIG, 6)


def _static(model, prompts, valid, key, group_size, **kwargs):
  """`generate` on the prompts repeated group_size times with the per-response keys."""
  rows = prompts.shape[0] * group_size
  return generate(model, jnp.repeat(prompts, group_size, 0), jnp.repeat(valid, group_size, 0),
                  response_keys(key, rows), **kwargs)


def _assert_same(got, want):
  for name in got._fields:
    if name == "decode_steps":
      continue
    a, b = np.asarray(getattr(got, name)), np.asarray(getattr(want, name))
    if a.dtype == np.float32:
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=name)
    else:
      np.testing.assert_array_equal(a, b, err_msg=name)


@pytest.mark.parametrize("slots", [1, 3, 8, 24])
def test_every_response_equals_the_static_batchs_draw_with_its_key(model, slots):
  prompts, valid = left_padded_prompts(np.random.default_rng(0), 6, 5, 8, 16)
  budgets = np.random.default_rng(1).integers(1, 13, 24)
  kwargs = dict(max_new_tokens=12, stop_tokens=STOP, budgets=budgets)
  got = generate_continuous(model, prompts, valid, jax.random.key(2), slots=slots, group_size=4,
                            **kwargs)
  want = _static(model, prompts, valid, jax.random.key(2), 4, **kwargs)
  _assert_same(got, want)
  lengths = np.asarray(got.mask).sum(1)
  assert 0 < np.asarray(want.truncated).sum() < 24 and (lengths < budgets).any()
  # One slot decodes the responses one after another; as many slots as responses run together.
  if slots == 1:
    assert int(got.decode_steps) == lengths.sum()
  if slots == 24:
    assert int(got.decode_steps) == lengths.max()
  assert int(got.decode_steps) >= -(-lengths.sum() // slots)


def test_a_cache_of_several_attention_blocks_draws_the_same_responses():
  """Blocks of 4 slots: a decode step reads the key blocks up to its furthest row's slot,
  each row seeing its own keys only; P + N = 21 columns take a cache of 24 (whole blocks),
  and a resumed response's row is prefilled into one as wide."""
  blocked = peaked_model(CONFIG.replace(attention_block=4), 6)
  prompts, valid = left_padded_prompts(np.random.default_rng(0), 6, 5, 8, 16)
  budgets = np.random.default_rng(1).integers(1, 14, 24)
  kwargs = dict(max_new_tokens=13, stop_tokens=STOP, budgets=budgets)
  got = generate_continuous(blocked, prompts, valid, jax.random.key(2), slots=3, group_size=4,
                            **kwargs)
  _assert_same(got, _static(blocked, prompts, valid, jax.random.key(2), 4, **kwargs))
  settings = dict(max_new_tokens=13, stop_tokens=STOP, group_size=4, slots=3)
  first = generate_partial(blocked, prompts[:2], valid[:2], jax.random.key(2), decode_limit=6,
                           budgets=budgets[:8], **settings)
  unfinished = np.flatnonzero(first.unfinished)
  resumed = generate_partial(blocked, prompts[:0], valid[:0], jax.random.key(3),
                             decode_limit=100, resume=carry_over(first), **settings)
  final = _by_response(first, resumed, unfinished)
  assert unfinished.size and len(final) == 8
  for r in range(8):
    _assert_same(final[r], jax.tree.map(lambda x, r=r: x[r] if np.ndim(x) else x, got))


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.0, None, None), (0.7, 4, None),
                                                     (1.3, None, 0.8)])
def test_sampling_settings_and_right_padding_follow_the_static_sampler(model, temperature, top_k,
                                                                       top_p):
  prompts, valid = left_padded_prompts(np.random.default_rng(3), 3, 6, 8, 16)
  shift = (np.arange(6)[None] + 6 - valid.sum(1, keepdims=True)) % 6  # the valid tokens first
  right = jnp.take_along_axis(prompts, shift, 1), jnp.take_along_axis(valid, shift, 1)
  kwargs = dict(max_new_tokens=10, stop_tokens=STOP, temperature=temperature, top_k=top_k,
                top_p=top_p)
  got = generate_continuous(model, *right, jax.random.key(4), slots=2, group_size=3,
                            padding="right", **kwargs)
  _assert_same(got, _static(model, prompts, valid, jax.random.key(4), 3, **kwargs))


def test_a_slot_keeps_nothing_of_its_previous_response(model):
  """The same response drawn after different occupants of its slot (other prompts, longer or
  shorter) is the same response: the admitted slot's earlier columns are invalid."""
  prompts, valid = left_padded_prompts(np.random.default_rng(5), 4, 6, 8, 16)
  keys = response_keys(jax.random.key(6), 8)
  kwargs = dict(max_new_tokens=16, stop_tokens=STOP, group_size=2)
  one_slot = generate_continuous(model, prompts, valid, keys, slots=1, **kwargs)
  # The last prompt alone, with its responses' keys: nothing ran in the slot before.
  alone = generate_continuous(model, prompts[3:], valid[3:], keys[6:], slots=1, **kwargs)
  _assert_same(jax.tree.map(lambda x: x[6:] if np.ndim(x) else x, one_slot), alone)
  # Reversed prompt order: every response follows different occupants.
  order = np.arange(4)[::-1]
  reordered = generate_continuous(model, prompts[order], valid[order],
                                  keys.reshape(4, 2)[order].reshape(8), slots=3, **kwargs)
  rows = (order[:, None] * 2 + np.arange(2)).reshape(8)
  _assert_same(jax.tree.map(lambda x: x[rows] if np.ndim(x) else x, one_slot), reordered)


def test_typed_actions_and_hidden_columns_hold_in_every_slot(model):
  prompts, valid = left_padded_prompts(np.random.default_rng(7), 3, 4, 8, 16)
  rng = np.random.default_rng(8)
  allowed = np.concatenate([np.ones((4, 16), bool), rng.random((9, 16)) < 0.4])
  allowed[4:, 5] = True  # a stop token is always allowed
  hidden = np.concatenate([np.zeros(4, bool), np.arange(9) % 3 == 1])
  actions = Actions(allowed, hidden, 3)
  kwargs = dict(max_new_tokens=9, stop_tokens=STOP, actions=actions)
  got = generate_continuous(model, prompts, valid, jax.random.key(9), slots=4, group_size=4,
                            **kwargs)
  _assert_same(got, _static(model, prompts, valid, jax.random.key(9), 4, **kwargs))
  response, mask = np.asarray(got.tokens)[:, 4:], np.asarray(got.mask)[:, 4:]
  assert allowed[4 + np.arange(9)[None], response][mask].all()


def test_bad_settings_are_refused_naming_the_limit(model):
  prompts, valid = jnp.ones((2, 3), jnp.int32), jnp.ones((2, 3), bool)
  run = lambda **kw: generate_continuous(model, prompts, valid, jax.random.key(0),
                                         **{"slots": 2, "max_new_tokens": 4, "group_size": 2,
                                            **kw})
  with pytest.raises(ValueError, match=r"slots must be an int in \[1, prompts x group_size = 4\]"):
    run(slots=5)
  with pytest.raises(ValueError, match="slots must be"):
    run(slots=0)
  with pytest.raises(ValueError, match="group_size must be a positive int"):
    run(group_size=0)
  with pytest.raises(ValueError, match=r"budgets must lie in \[1, max_new_tokens = 4\]"):
    run(budgets=np.asarray([1, 2, 5, 1]))
  with pytest.raises(ValueError, match=r"budgets must have shape \[4\]"):
    run(budgets=np.asarray([1, 2]))
  with pytest.raises(ValueError, match=r"key must be one key or \[R = 4\] keys"):
    generate_continuous(model, prompts, valid, jax.random.split(jax.random.key(0), 3), slots=2,
                        max_new_tokens=4, group_size=2)
  with pytest.raises(ValueError, match="not per response"):
    run(actions=Actions(np.ones((4, 7, CONFIG.vocab_size), bool)))
  with pytest.raises(ValueError, match="max_new_tokens must be a positive int"):
    run(max_new_tokens=0)
  short = peaked_model(preset("tiny", vocab_size=16, max_position=6), 1)
  with pytest.raises(ValueError, match="A row of 7 tokens is longer than model.max_position = 6"):
    generate_continuous(short, prompts, valid, jax.random.key(0), slots=2, max_new_tokens=4)


def test_static_budgets_cut_rows_off_as_truncated(model):
  prompts, valid = left_padded_prompts(np.random.default_rng(10), 4, 5, 8, 16)
  full = generate(model, prompts, valid, jax.random.key(11), max_new_tokens=10)
  cut = generate(model, prompts, valid, jax.random.key(11), max_new_tokens=10,
                 budgets=np.asarray([1, 4, 10, 7]))
  np.testing.assert_array_equal(np.asarray(cut.mask)[:, 5:].sum(1), [1, 4, 10, 7])
  kept = np.asarray(cut.mask)
  np.testing.assert_array_equal(np.asarray(cut.tokens)[kept], np.asarray(full.tokens)[kept])
  assert int(cut.decode_steps) == 10
  stopped = generate(model, prompts, valid, jax.random.key(11), max_new_tokens=10,
                     stop_tokens=STOP, budgets=np.asarray([2, 2, 3, 2]))
  assert int(stopped.decode_steps) <= 3
  lengths = np.asarray(stopped.mask).sum(1)
  ends = np.asarray(stopped.tokens)[np.arange(4), 4 + lengths]
  np.testing.assert_array_equal(np.asarray(stopped.truncated), ~np.isin(ends, STOP))


def _by_response(first, resumed, rows):
  """Each response's final row: `first`'s finished rows, then `resumed`'s rows (its first
  len(rows) rows continue first's unfinished `rows`)."""
  final = {r: jax.tree.map(lambda x, r=r: x[r] if np.ndim(x) else x, first.output)
           for r in range(first.unfinished.shape[0]) if not first.unfinished[r]}
  for i, r in enumerate(rows):
    final[int(r)] = jax.tree.map(lambda x, i=i: x[i] if np.ndim(x) else x, resumed.output)
  return final


def test_a_response_resumed_under_the_same_policy_is_the_uninterrupted_one(model):
  prompts, valid = left_padded_prompts(np.random.default_rng(12), 3, 5, 8, 16)
  kwargs = dict(max_new_tokens=12, stop_tokens=STOP, group_size=4, slots=4)
  whole = generate_continuous(model, prompts, valid, jax.random.key(13), **kwargs)
  first = generate_partial(model, prompts, valid, jax.random.key(13), decode_limit=5, **kwargs)
  unfinished = np.flatnonzero(first.unfinished)
  assert 4 <= unfinished.size < 12  # cut short in their slots, or never admitted
  assert not np.asarray(first.output.truncated)[unfinished].any()
  more, more_valid = left_padded_prompts(np.random.default_rng(14), 1, 5, 8, 16)
  resumed = generate_partial(model, more, more_valid, jax.random.key(15), decode_limit=100,
                             resume=carry_over(first), version=1, **kwargs)
  assert not np.asarray(resumed.unfinished).any()
  final = _by_response(first, resumed, unfinished)
  for r in range(12):
    _assert_same(final[r], jax.tree.map(lambda x, r=r: x[r] if np.ndim(x) else x, whole))
  # The new prompt's responses follow the resumed ones, drawn as a run of their own draws them.
  alone = generate_continuous(model, more, more_valid, jax.random.key(15), **kwargs)
  _assert_same(jax.tree.map(lambda x: x[unfinished.size:] if np.ndim(x) else x, resumed.output),
               alone)
  # Versions: tokens sampled before the cut are version 0, those after it version 1.
  versions, mask = np.asarray(resumed.version)[:unfinished.size], np.asarray(
      resumed.output.mask)[:unfinished.size]
  before = np.asarray(first.output.mask)[unfinished]
  assert (versions[before] == 0).all() and (versions[mask & ~before] == 1).all()
  assert (mask & ~before).any()
  # Padded to a power of two rows: the unfinished rows, then copies of the last with no
  # budget left, which a resuming call frees without decoding.
  exact, padded = carry_over(first), carry_over(first, pad=True)
  width = 1 << (unfinished.size - 1).bit_length()
  index = np.minimum(np.arange(width), unfinished.size - 1)
  assert padded.tokens.shape[0] == width > unfinished.size
  for name, got, want in zip(padded._fields, padded, exact):
    got, want = (jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x
                 for x in (got, want))
    want = np.asarray(want)[index]
    if name == "budgets":
      want[unfinished.size:] = np.asarray(padded.mask)[unfinished.size:].sum(1)
      assert (want[unfinished.size:] < kwargs["max_new_tokens"]).all()
    np.testing.assert_array_equal(got, want, err_msg=name)
  again = generate_partial(model, more, more_valid, jax.random.key(15), decode_limit=100,
                           resume=padded, version=1, **kwargs)
  real = np.r_[np.arange(unfinished.size), np.arange(width, width + 4)]
  _assert_same(jax.tree.map(lambda x: x[real] if np.ndim(x) else x, again.output),
               resumed.output)
  np.testing.assert_array_equal(np.asarray(again.output.mask)[unfinished.size:width],
                                np.asarray(padded.mask)[unfinished.size:])
  assert not np.asarray(again.unfinished).any()
  # A copy holds a slot for the one step that frees it.
  assert (int(again.output.decode_steps)
          <= int(resumed.output.decode_steps) + width - unfinished.size)


def test_resumed_tokens_carry_the_log_probs_of_the_policy_that_drew_them(model):
  """Version 1 is another policy: tokens drawn before the cut have version 0's log-probs,
  those after it version 1's, each equal to teacher forcing under its own policy."""
  newer = peaked_model(CONFIG.replace(d_ff=CONFIG.d_ff), 3)
  prompts, valid = left_padded_prompts(np.random.default_rng(16), 2, 5, 8, 16)
  kwargs = dict(max_new_tokens=10, group_size=2, slots=4)  # no stop tokens: all cut at 4
  first = generate_partial(model, prompts, valid, jax.random.key(17), decode_limit=4, **kwargs)
  assert np.asarray(first.unfinished).all()
  resumed = generate_partial(newer, prompts[:0], valid[:0], jax.random.key(18), decode_limit=50,
                             resume=carry_over(first), version=1, **kwargs)
  out = resumed.output
  version = np.asarray(resumed.version)
  for policy, v in ((model, 0), (newer, 1)):
    logits = policy(out.tokens, positions=out.positions, token_valid=out.token_valid).logits
    logp = np.asarray(jax.nn.log_softmax(logits[:, :-1], -1))
    forced = np.take_along_axis(logp, np.asarray(out.tokens)[:, 1:, None], -1)[..., 0]
    drawn = (version[:, 1:] == v) & np.asarray(out.mask)[:, 1:]
    assert drawn.sum() == 4 * (4 if v == 0 else 6)
    np.testing.assert_allclose(np.asarray(out.logprobs)[:, 1:][drawn], forced[drawn],
                               rtol=1e-4, atol=1e-4)
