"""key_turns at hundreds of turns: hidden actions keep the exact turn oracle tractable. The
oracle is checked against the enumeration of every history (where that is feasible), against
a closed form (a uniform policy) at 256 turns, and against episodes the multi-turn sampler
draws; the sampler and the learner feed the policy the same view of hidden actions."""

import jax
import numpy as np
import pytest

from jaxcredit import forward
from jaxcredit.sampling import Actions
from jaxcredit.tasks import key_turns
from jaxcredit.tasks.key_token import FILL
from tests.unit.tasks.test_key_turns import _key_leaning_model, _model

PROMPT = np.asarray([1, 2])


def _actions(config) -> Actions:
  return config.actions(prompt_length=2)


def _episodes(model, config, rows, seed):
  return key_turns.sample_episodes(model, config, rows, seed)[0]


def test_decisive_turns_are_placed_early_late_or_spread():
  assert key_turns.decisive_turns(256, 3, "early") == (0, 1, 2)
  assert key_turns.decisive_turns(256, 3, "late") == (253, 254, 255)
  assert key_turns.decisive_turns(256, 3, "spread") == (0, 128, 255)
  assert key_turns.decisive_turns(5, 1, "spread") == (0,)
  with pytest.raises(ValueError, match="Unknown placement 'middle'"):
    key_turns.decisive_turns(8, 2, "middle")
  with pytest.raises(ValueError, match=r"count must be in \[1, 8\]"):
    key_turns.decisive_turns(8, 9, "early")


@pytest.mark.parametrize("options,match", [
    ({"n_turns": key_turns.MAX_TURNS + 1, "decisive": (0,)}, "n_turns must be in"),
    ({"observation_length": 1}, "observation_length must be >= 2"),
])
def test_bad_long_configs_are_named(options, match):
  with pytest.raises(ValueError, match=match):
    key_turns.KeyTurnsConfig(**options)


def test_the_layout_with_long_observations_and_turns():
  config = key_turns.KeyTurnsConfig(n_turns=3, decisive=(1,), observation_length=4,
                                    turn_length=2, hidden_actions=True)
  example = key_turns.make_example(np.random.default_rng(0), config)
  keys = example["keys"]  # the demonstration repeats each turn's key
  np.testing.assert_array_equal(example["completion"], [
      FILL, FILL, FILL, 2, keys[0], keys[0],  # turn 0: observation [FILL, FILL, FILL, SEP]
      keys[1], FILL, FILL, 2, keys[1], keys[1],  # turn 1 (decisive): the key shown first
      FILL, FILL, FILL, 2, keys[2], keys[2]])
  assert config.turn_start(1) == 10 and config.episode_length == 18
  np.testing.assert_array_equal(np.flatnonzero(config.action_columns()), [4, 5, 10, 11, 16, 17])
  # Every action is hidden but the decisive turn's first.
  np.testing.assert_array_equal(np.flatnonzero(config.hidden_columns()), [4, 5, 11, 16, 17])
  actions = config.actions(prompt_length=2)  # the rows' columns: the prompt is seen
  np.testing.assert_array_equal(np.flatnonzero(actions.hidden), [6, 7, 13, 18, 19])
  assert actions.hidden_token == FILL
  assert key_turns.KeyTurnsConfig().actions(prompt_length=2) == Actions()
  np.testing.assert_array_equal(
      key_turns.demonstration_actions(example["completion"], config), config.action_columns())


def test_hidden_actions_values_equal_the_enumeration_of_every_history():
  """Where every history can still be enumerated (4 one-token turns), the values the hidden
  oracle reads from one pass per key assignment equal the tree's, which sums over every
  action of every turn with the policy fed the same view."""
  config = key_turns.KeyTurnsConfig(hidden_actions=True, observation_length=3)
  model = _key_leaning_model()
  rollout = _episodes(model, config, 64, seed=4)
  values, credit = key_turns.oracle.turn_credit(model, config, rollout.tokens,
                                                rollout.token_valid)
  tree = key_turns.oracle.value_tree(model, config, PROMPT)
  tokens = np.asarray(rollout.tokens)
  starts = [2 + config.turn_start(k) for k in range(config.n_turns)] + [tokens.shape[1]]
  for row in range(len(tokens)):
    for k in range(max(config.decisive) + 2):
      expected = tree[k].get(tuple(tokens[row, :starts[k]].tolist()), 0.0)
      np.testing.assert_allclose(values[row, k], expected, rtol=1e-5, atol=1e-12)  # float32
  tree_success = np.mean(list(tree[0].values()))
  np.testing.assert_allclose(key_turns.oracle.success(model, config, PROMPT), tree_success,
                             rtol=1e-6)
  assert 0.01 < tree_success < 0.99
  np.testing.assert_allclose(credit.sum(axis=1), values[:, -1] - values[:, 0], atol=1e-12)


def test_uniform_policy_values_are_the_closed_form_at_256_turns():
  """pi = 1/V everywhere: an on-tree turn start k is worth (1/V)^(decisive turns from k on),
  0 after a wrong decisive turn, the reward at the end; credit only on decisive turns."""
  decisive = key_turns.decisive_turns(256, 3, "spread")
  config = key_turns.KeyTurnsConfig(n_turns=256, decisive=decisive, turn_length=2,
                                    hidden_actions=True)
  model = _model(0.0)
  rollout = _episodes(model, config, 6, seed=0)
  values, credit = key_turns.oracle.turn_credit(model, config, rollout.tokens,
                                                rollout.token_valid)
  v = 1 / key_turns.VOCAB_SIZE
  tokens, decisive = np.asarray(rollout.tokens)[:, 2:], np.asarray(decisive)
  right = tokens[:, [config.turn_start(d) for d in decisive]] == tokens[:, decisive * 4]  # [B, D]
  turns = np.arange(config.n_turns + 1)[:, None]
  so_far = ~np.any((decisive < turns)[None] & ~right[:, None], axis=-1)  # [B, K + 1]
  expected = np.where(so_far, v ** (decisive >= turns).sum(-1), 0.0)
  np.testing.assert_allclose(values, expected, rtol=1e-5)
  np.testing.assert_array_equal(values[:, -1], rollout.rewards)
  columns = np.flatnonzero(np.any(credit != 0, axis=0)) - 2
  assert set(columns) <= {config.turn_start(d) for d in decisive}
  np.testing.assert_allclose(key_turns.oracle.success(model, config, PROMPT), v**3, rtol=1e-5)


def test_sampled_long_episodes_match_the_exact_values_and_the_learners_view():
  """64 turns of two tokens after three-token observations, decisive turns spread: the mean
  of V(h_k) over sampled episodes estimates J at every turn start (V is a martingale), the
  mean reward too; the learner's log-probs with the task's hidden columns equal the
  sampler's, and differ when the learner sees the hidden actions."""
  config = key_turns.KeyTurnsConfig(n_turns=64, decisive=key_turns.decisive_turns(64, 2, "spread"),
                                    turn_length=2, observation_length=3, hidden_actions=True)
  model = _key_leaning_model()
  rollout = _episodes(model, config, 192, seed=1)
  values, _ = key_turns.oracle.turn_credit(model, config, rollout.tokens, rollout.token_valid)
  j = key_turns.oracle.success(model, config, PROMPT)
  assert 0.02 < j < 0.98, j
  np.testing.assert_array_equal(values[:, -1], np.asarray(rollout.rewards))
  for k in range(0, config.n_turns + 1, 7):
    stderr = values[:, k].std() / np.sqrt(len(values)) + 1e-12
    assert abs(values[:, k].mean() - j) < 4.5 * stderr + 1e-9, (k, values[:, k].mean(), j)
  mask = np.asarray(rollout.mask)
  rows = jax.tree.map(lambda x: x[:16] if getattr(x, "ndim", 0) else x, rollout)
  seen = forward.policy_outputs(model, rows, 1.0, _actions(config))
  np.testing.assert_allclose(np.asarray(seen.logprobs)[mask[:16]],
                             np.asarray(rollout.behaviour_logprobs)[:16][mask[:16]], atol=2e-5)
  unhidden = forward.policy_outputs(model, rows, 1.0)
  assert np.abs(np.asarray(unhidden.logprobs - seen.logprobs)).max() > 1e-2


def test_the_oracle_refuses_what_it_cannot_compute():
  model = _model(0.0)
  with pytest.raises(ValueError, match="Set hidden_actions"):
    key_turns.oracle.success(model, key_turns.KeyTurnsConfig(turn_length=2), PROMPT)
  with pytest.raises(ValueError, match="set hidden_actions or use Monte Carlo"):
    key_turns.oracle.success(model, key_turns.KeyTurnsConfig(n_turns=64, decisive=(63,)), PROMPT)
  many = key_turns.KeyTurnsConfig(n_turns=64, decisive=tuple(range(0, 64, 4)), n_keys=3,
                                  hidden_actions=True)
  with pytest.raises(ValueError, match=r"3\^16 assignments"):
    key_turns.oracle.success(model, many, PROMPT)
  with pytest.raises(ValueError, match="per_turn_rewards"):
    key_turns.oracle.success(model, key_turns.KeyTurnsConfig(hidden_actions=True,
                                                             per_turn_rewards=True), PROMPT)
