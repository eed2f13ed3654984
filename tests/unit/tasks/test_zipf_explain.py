"""zipf_explain (the language-like probe) and its Rao-Blackwellised Monte-Carlo oracle,
against a per-row parse and against exhaustive enumeration under a real Transformer."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxcredit import forward
from jaxcredit.models import Transformer, preset
from jaxcredit.tasks import zipf_explain as zx

MARK, KEY0, WORD0 = zx.MARK, zx.KEY0, zx.WORD0


def _parse_reward(response, target, config) -> float:
  """R by reading the response left to right (the module docstring's rule)."""
  answers, expecting = [], False
  for token in response:
    is_key = KEY0 <= token < KEY0 + config.n_keys
    if expecting:
      if not is_key:
        return 0.0
      answers.append(token - KEY0)
      expecting = False
    elif token == MARK:
      expecting = True
    elif is_key:
      return 0.0
  if expecting or len(answers) != config.n_answers:
    return 0.0
  return float(all(a == c for a, c in zip(answers, target)))


def test_the_reward_reads_marks_and_answers_as_a_left_to_right_parse():
  config = zx.ZipfExplainConfig(length=10, n_answers=2, n_keys=3, n_words=4, branching=3)
  rng = np.random.default_rng(0)
  alphabet = np.flatnonzero(zx.allowed(config)[0])
  rows, targets = [], []
  for _ in range(3000):  # random strings: mostly malformed, some right
    target = rng.integers(0, config.n_keys, 2)
    response = rng.choice(alphabet, config.length)
    if rng.random() < 0.5:  # a well-formed response, answers right or not
      response = rng.choice(config.words, config.length)
      for column in sorted(rng.choice(np.arange(0, config.length - 1, 2), 2, replace=False)):
        response[column] = MARK
        response[column + 1] = KEY0 + (target[len(rows) % 2] if rng.random() < 0.8 else 0)
    rows.append(response)
    targets.append(target)
  rows, targets = np.asarray(rows), np.asarray(targets)
  prompts = zx.prompts(targets, config)
  expected = np.asarray([_parse_reward(r, c, config) for r, c in zip(rows, targets)])
  assert 0.05 < expected.mean() < 0.5
  np.testing.assert_array_equal(zx.reward(rows, prompts, config), expected)
  traced = jax.jit(lambda r, c: zx.outcome(r, c, config))(jnp.asarray(rows), jnp.asarray(targets))
  np.testing.assert_array_equal(traced, expected)
  np.testing.assert_array_equal(zx.prompts(jnp.asarray(targets), config), prompts)
  # A MARK in the last column leaves no room for its answer.
  last = np.asarray([WORD0, MARK, KEY0 + 1, WORD0, WORD0, WORD0, WORD0, WORD0, WORD0, MARK])
  assert zx.reward(last, zx.prompts(np.asarray([[1, 0]]), config), config)[0] == 0.0
  with pytest.raises(ValueError, match=r"Expected responses \[B, 10\] and prompts \[B, 4\]"):
    zx.reward(rows[:, :9], prompts, config)
  with pytest.raises(ValueError, match="length must be >= 2 n_answers = 8"):
    zx.ZipfExplainConfig(length=7, n_answers=4)


def test_demonstrations_follow_the_zipfian_grammar_and_mark_k_answers():
  config = zx.ZipfExplainConfig(length=96, n_answers=3, n_words=16, branching=5)
  start, successors = zx.grammar(config)
  np.testing.assert_allclose(start.sum(), 1.0)
  np.testing.assert_allclose(successors.sum(axis=1), 1.0)
  entropy = -np.sum(successors * np.log(np.where(successors > 0, successors, 1.0)), axis=1)
  assert entropy.min() == 0.0 and entropy.max() > 1.0  # some words determine the next
  rng = np.random.default_rng(1)
  counts = np.zeros_like(successors)
  for accuracy, expected in ((1.0, 1.0), (0.0, 1 / 4 ** 3)):
    examples = [zx.make_example(rng, config, accuracy) for _ in range(400)]
    rewards = np.asarray([zx.reward(e["completion"], e["prompt"], config)[0] for e in examples])
    assert rewards.mean() == pytest.approx(expected, abs=0.03)
    for example in examples:
      completion = example["completion"]
      assert np.sum(completion == MARK) == 3 and completion[-1] != MARK
      words = completion - WORD0
      for a, b in zip(words[:-1], words[1:]):
        if 0 <= a < config.n_words and 0 <= b < config.n_words:
          counts[a, b] += 1
  seen = counts.sum(axis=1) > 200
  assert np.all(counts[successors == 0] == 0)  # only the grammar's bigrams
  np.testing.assert_allclose(counts[seen] / counts[seen].sum(axis=1, keepdims=True),
                             successors[seen], atol=0.06)


def _bigrams_and_marks(completions, config):
  """Bigram counts of the words, and the MARK columns' histogram, of completions [n, T]."""
  words = completions - WORD0
  pairs = (words[:, :-1] >= 0) & (words[:, 1:] >= 0)
  counts = np.zeros((config.n_words, config.n_words))
  np.add.at(counts, (words[:, :-1][pairs], words[:, 1:][pairs]), 1)
  marks = np.bincount(np.nonzero(completions == MARK)[1], minlength=config.length)
  return counts, marks


def test_traced_demonstrations_are_drawn_as_make_example_draws_them():
  """The same grammar, MARK columns and answer accuracy (frequencies of 2,000
  demonstrations each way), under jit."""
  config = zx.ZipfExplainConfig(length=24, n_answers=2, n_keys=3, n_words=6, branching=4)
  rng = np.random.default_rng(2)
  examples = [zx.make_example(rng, config, key_accuracy=0.7) for _ in range(2000)]
  host = np.stack([e["completion"] for e in examples])
  targets = rng.integers(0, config.n_keys, (2000, 2))
  traced = np.asarray(jax.jit(lambda k, c: zx.demonstrations(k, c, config, 0.7))(
      jax.random.key(0), jnp.asarray(targets)))
  for a, b in zip(_bigrams_and_marks(host, config), _bigrams_and_marks(traced, config)):
    np.testing.assert_allclose(a / a.sum(), b / b.sum(), atol=0.01)
  prompts = zx.prompts(targets, config)
  right = (0.7 + 0.3 / 3) ** 2
  assert zx.reward(traced, prompts, config).mean() == pytest.approx(right, abs=0.03)
  assert np.mean([zx.reward(e["completion"], e["prompt"], config)[0] for e in examples]) == (
      pytest.approx(right, abs=0.03))


def _enumerated_values(model, prompts, responses, targets, cuts, config):
  """Exact V^pi(s_c) in float64: every response over the allowed alphabet, scored."""
  alphabet = np.flatnonzero(zx.allowed(config)[0])
  every = np.asarray(list(itertools.product(alphabet, repeat=config.length)))
  values = np.zeros((len(prompts), len(cuts)))
  allowed = zx.allowed_in_rows(config)
  for row, (prompt, response, target) in enumerate(zip(prompts, responses, targets)):
    full = np.concatenate([np.tile(prompt, (len(every), 1)), every], axis=1)
    logits = np.asarray(model(jnp.asarray(full)).logits, np.float64)[:, :-1]
    logits = np.where(allowed[1:], logits, -np.inf)
    logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    token_logp = np.take_along_axis(logp, full[:, 1:, None], -1)[..., 0][:, -config.length:]
    rewards = np.asarray([_parse_reward(r, target, config) for r in every])
    for i, c in enumerate(cuts):
      match = np.all(every[:, :c] == response[:c], axis=1)
      values[row, i] = np.sum(np.exp(token_logp[match, c:].sum(axis=1)) * rewards[match])
  return values


def _taught(config, steps: int = 150):
  """A tiny Transformer after a short SFT on demonstrations whose answers are right half
  the time: it writes MARKs and keys where they go, and is unsure of the answers."""
  model = Transformer(preset("tiny", vocab_size=zx.VOCAB_SIZE), rngs=nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)
  step = forward.sft_step()
  rng = np.random.default_rng(0)
  for _ in range(steps):
    examples = [zx.make_example(rng, config, key_accuracy=0.5) for _ in range(32)]
    tokens = np.stack([np.concatenate([e["prompt"], e["completion"]]) for e in examples])
    loss_mask = np.zeros(tokens.shape, bool)
    loss_mask[:, config.prompt_length:] = True
    step(model, optimizer, jnp.asarray(tokens), jnp.asarray(loss_mask),
         jnp.ones(tokens.shape, bool))
  return model


def test_rao_blackwellised_values_match_exhaustive_enumeration_with_less_variance():
  """pi: a Transformer after a short SFT, on a 5-token task: 5^5 responses per prompt
  enumerated. Both estimators are within 4.5 standard errors of the exact value at every
  cut; the Rao-Blackwellised one has the smaller error; at c = T it is R itself."""
  config = zx.ZipfExplainConfig(length=5, n_answers=2, n_keys=2, n_words=2, branching=2)
  model = _taught(config)
  targets = np.asarray([[0, 1], [1, 1], [0, 0]])
  prompts = zx.prompts(targets, config)
  responses = np.asarray([  # right, wrong, and ungrammatical prefixes
      [MARK, KEY0, WORD0, MARK, KEY0 + 1],
      [MARK, KEY0, MARK, KEY0 + 1, WORD0],
      [KEY0, WORD0, MARK, KEY0, WORD0]])
  rows = np.concatenate([prompts, responses], axis=1)
  cuts = np.arange(config.length + 1)
  exact = _enumerated_values(model, prompts, responses, targets, cuts, config)
  assert exact[:, 0].min() > 0.05 and exact[1, 2:].max() == 0.0 and exact[2, 1:].max() == 0.0
  estimate = jax.jit(zx.oracle.rb_values, static_argnums=(5,),
                     static_argnames=("n_paths", "rao_blackwell"))
  errors = {}
  for rb in (True, False):
    values, se = estimate(model, rows, targets, cuts, jax.random.key(rb), config,
                          n_paths=1000, rao_blackwell=rb)
    values, se = np.asarray(values), np.asarray(se)
    assert np.all(np.abs(values - exact) <= 4.5 * se + 1e-6), (rb, values, exact, se)
    errors[rb] = se
  np.testing.assert_allclose(values[:, -1], [1.0, 0.0, 0.0])  # c = T: R of the response
  per_row = np.stack([np.roll(cuts, shift) for shift in range(3)])  # cuts [B, C]
  values, se = estimate(model, rows, targets, per_row, jax.random.key(2), config, n_paths=1000)
  rolled = np.stack([np.roll(exact[row], row) for row in range(3)])
  assert np.all(np.abs(np.asarray(values) - rolled) <= 4.5 * np.asarray(se) + 1e-6)
  live = exact[:, :-1] > 0.01
  assert np.all(errors[True][:, :-1][live] < errors[False][:, :-1][live])
  with pytest.raises(ValueError, match=r"Expected rows \[B, 9\], targets \[B, 2\]"):
    zx.oracle.rb_values(model, rows[:, :8], targets, cuts, jax.random.key(0), config,
                        n_paths=2)


def test_credit_from_cut_values_telescopes_and_prices_marks_and_answers_exactly():
  """Cuts around each MARK and on a grid; credit spread over each segment (a float64
  loop as the reference); a column cut twice reads one estimate; the credit of a row
  sums to R - V-hat(s_0)."""
  config = zx.ZipfExplainConfig(length=12, n_answers=2, n_keys=2, n_words=3, branching=2)
  responses = np.full((3, 12), WORD0)
  responses[0, [3, 8]], responses[0, [4, 9]] = MARK, KEY0  # two answers
  responses[1, [0, 4, 10]], responses[1, [1, 5, 11]] = MARK, KEY0  # a third MARK
  cuts = np.asarray(zx.oracle.cuts_of(jnp.asarray(responses), config, stride=4))
  assert cuts.shape == (3, 2 + 2 + 9) and np.all(np.diff(cuts, axis=1) >= 0)
  assert set(cuts[0]) == {0, 3, 4, 5, 8, 9, 10, 12} and set(cuts[2]) == {0, 4, 8, 12}
  assert set(cuts[1]) == {0, 1, 2, 4, 5, 6, 8, 10, 11, 12}
  rng = np.random.default_rng(3)
  values = rng.random(cuts.shape)
  got_values, credit = (np.asarray(x) for x in zx.oracle.credit_from_cuts(
      jnp.asarray(values), jnp.asarray(cuts), config.length))
  for row in range(3):
    last = {c: values[row, i] for i, c in enumerate(cuts[row])}  # the last estimate wins
    points = sorted(last)
    for t in range(config.length):
      left = max(c for c in points if c <= t)
      right = min(c for c in points if c > t)
      slope = (last[right] - last[left]) / (right - left)
      assert credit[row, t] == pytest.approx(slope, abs=1e-6)
      assert got_values[row, t] == pytest.approx(last[left] + slope * (t - left), abs=1e-6)
    assert credit[row].sum() == pytest.approx(last[12] - last[0], abs=1e-5)
  first = {c: values[0, i] for i, c in enumerate(cuts[0])}
  assert credit[0, 4] == pytest.approx(first[5] - first[4], abs=1e-6)  # the answer's change
