"""key_turns: the environment's rule, its multi-turn rollouts, and the exact turn-level
oracle against a closed form (uniform policy) and against sampled episodes."""

import jax
import numpy as np
import pytest
from flax import nnx

from jaxcredit.models import Transformer, preset
from jaxcredit.rollout_sources import MultiTurn
from jaxcredit.tasks import key_turns
from jaxcredit.tasks.key_token import FILL, SEP

CONFIG = key_turns.KeyTurnsConfig()  # 4 turns, decisive 1 and 3, 3 keys
MODEL = preset("tiny", vocab_size=key_turns.VOCAB_SIZE, n_layers=1)


def _play(config, example, actions):
  env = key_turns.KeyTurnsEnv(config)
  state, observation = env.reset(np.random.default_rng(0), example)
  shown, rewards = [observation], []
  for turn_actions in actions:
    state, observation, reward, done = env.step(state, np.asarray(turn_actions))
    shown.append(observation)
    rewards.append(reward)
  return shown, rewards, done


def test_the_demonstration_is_rewarded_and_a_wrong_key_is_not():
  example = key_turns.make_example(np.random.default_rng(3), CONFIG)
  keys = example["keys"]
  shown, rewards, done = _play(CONFIG, example, [[k] for k in keys])
  assert done and rewards == [0, 0, 0, 1]
  assert [list(o) for o in shown] == [[FILL, SEP], [keys[1], SEP], [FILL, SEP], [keys[3], SEP], []]
  np.testing.assert_array_equal(np.concatenate(shown[:4] + [np.zeros(0)]).size, 8)
  wrong = [keys[0], keys[1], keys[2], keys[3] + 1]
  assert _play(CONFIG, example, [[a] for a in wrong])[1] == [0, 0, 0, 0]
  # Non-decisive turns do not matter.
  anything = [7, keys[1], 20, keys[3]]
  assert _play(CONFIG, example, [[a] for a in anything])[1][-1] == 1
  per_turn = key_turns.KeyTurnsConfig(per_turn_rewards=True)
  assert _play(per_turn, example, [[a] for a in wrong])[1] == [0, 0.5, 0, 0]
  demo = example["completion"]
  assert len(demo) == CONFIG.episode_length and list(demo[2::3]) == list(keys)


@pytest.mark.parametrize("options,match", [
    ({"decisive": (4,)}, "decisive must be distinct turns in"),
    ({"decisive": ()}, "decisive must be distinct turns in"),
    ({"n_keys": 9}, "n_keys must be in"),
    ({"turn_length": 0}, "turn_length must be"),
])
def test_bad_configs_are_named(options, match):
  with pytest.raises(ValueError, match=match):
    key_turns.KeyTurnsConfig(**options)


def _model(scale):
  model = Transformer(MODEL, rngs=nnx.Rngs(1))
  state = nnx.state(model, nnx.Param)
  nnx.update(model, jax.tree.map(lambda x: x * scale, state))
  return model


def _key_leaning_model():
  """A random model whose embeddings share one direction, more so for the keys: the
  next token is most often a key (J near 1/9), with context-dependent odds."""
  model = _model(1.0)
  embedding = np.asarray(model.embed_tokens.embedding[...])
  rng = np.random.default_rng(0)
  direction = rng.normal(size=embedding.shape[1])
  direction /= np.linalg.norm(direction)
  lean = np.full((len(embedding), 1), 0.5)
  lean[CONFIG.keys] = 1.0
  model.embed_tokens.embedding[...] = jax.numpy.asarray(0.05 * embedding + lean * direction,
                                                     embedding.dtype)
  return model


def _episodes(model, rows, seed, config=CONFIG):
  return key_turns.sample_episodes(model, config, rows, seed)


# Two turns after the last decisive one: the oracle stops enumerating where the reward is
# decided, and later turn starts take the value there.
TRAILING = key_turns.KeyTurnsConfig(n_turns=6, decisive=(1, 3))


@pytest.mark.parametrize("config", [CONFIG, TRAILING], ids=["4_turns", "2_trailing_turns"])
def test_uniform_policy_values_are_the_closed_form(config):
  """Zero weights make every logit 0: pi = 1/V, so an on-tree history at turn k is worth
  (1/V)^(decisive turns from k on), and J = (1/V)^|decisive|."""
  model = _model(0.0)
  rollout, _ = _episodes(model, 8, seed=0, config=config)
  values, credit = key_turns.oracle.turn_credit(model, config, rollout.tokens, rollout.token_valid)
  v = 1 / key_turns.VOCAB_SIZE
  for row, row_values in enumerate(values):
    tokens = np.asarray(rollout.tokens[row])[np.asarray(rollout.token_valid[row])]
    actions = tokens[2 + 2::3]
    for k in range(config.n_turns + 1):
      right_so_far = all(actions[j] == tokens[2 + 3 * j] for j in config.decisive if j < k)
      remaining = sum(j >= k for j in config.decisive)
      np.testing.assert_allclose(row_values[k], v**remaining if right_so_far else 0.0, rtol=1e-5)
    np.testing.assert_allclose(row_values[-1], rollout.rewards[row])
  np.testing.assert_allclose(credit.sum(axis=1), values[:, -1] - values[:, 0], atol=1e-12)
  np.testing.assert_array_equal(credit[~np.asarray(rollout.mask)], 0.0)
  np.testing.assert_allclose(key_turns.oracle.success(model, config, np.asarray([1, 2])), v**2,
                             rtol=1e-5)


@pytest.mark.parametrize("config", [CONFIG, TRAILING], ids=["4_turns", "2_trailing_turns"])
def test_exact_values_match_sampled_episodes(config):
  """V is a martingale along sampled episodes: at every turn start the mean of V(h_k)
  over sampled rows estimates J, and at the end it is the mean reward."""
  model = _key_leaning_model()
  rollout, _ = _episodes(model, 512, seed=1, config=config)
  values, credit = key_turns.oracle.turn_credit(model, config, rollout.tokens, rollout.token_valid)
  j = key_turns.oracle.success(model, config, np.asarray([1, 2]))
  assert 0.01 < j < 0.99, j
  np.testing.assert_array_equal(values[:, -1], np.asarray(rollout.rewards))
  after = np.asarray(rollout.turn_ids) > max(config.decisive)  # turns that cannot matter
  np.testing.assert_array_equal(credit[after], 0.0)
  for k in range(config.n_turns + 1):
    stderr = values[:, k].std() / np.sqrt(len(values)) + 1e-12
    assert abs(values[:, k].mean() - j) < 4.5 * stderr + 1e-9, (k, values[:, k].mean(), j, stderr)


def test_the_oracle_refuses_what_it_cannot_enumerate():
  model = _model(0.0)
  with pytest.raises(ValueError, match="turn_length = 1"):
    key_turns.oracle.value_tree(model, key_turns.KeyTurnsConfig(turn_length=2), np.asarray([1, 2]))
  with pytest.raises(ValueError, match="too many"):
    key_turns.oracle.value_tree(model, key_turns.KeyTurnsConfig(n_turns=8, decisive=(7,)),
                                np.asarray([1, 2]))


def test_turn_estimators_on_sampled_episodes():
  """Anchors follow the environment's state; GiGPO, MT-GRPO and turn GAE on real
  multi-turn rows equal their float64 references."""
  from jaxcredit import estimators
  from tests import reference

  model = _key_leaning_model()
  example = key_turns.make_example(np.random.default_rng(7), CONFIG)
  batch = {"prompts": np.tile(example["prompt"], (8, 1)), "prompt_valid": np.ones((8, 2), bool),
           "examples": [example] * 8}
  config = key_turns.KeyTurnsConfig(per_turn_rewards=True)
  source = MultiTurn(key_turns.KeyTurnsEnv(config), max_turns=4, max_turn_tokens=1,
                     max_episode_tokens=config.episode_length, group_size=8)
  rollout = source(model, batch, jax.random.key(5))
  mask, turn_ids = np.asarray(rollout.mask), np.asarray(rollout.turn_ids)
  anchors = np.asarray(rollout.extras["turn_anchors"])
  tokens = np.asarray(rollout.tokens)
  for k in range(4):  # same turn and same decisive turns right so far <=> same anchor
    rows = [np.flatnonzero(mask[b] & (turn_ids[b] == k))[0] for b in range(8)]
    right = [sum(tokens[b, 2 + 3 * j + 2] == example["keys"][j] for j in config.decisive if j < k)
             for b in range(8)]
    for b in range(8):
      for c in range(8):
        assert (anchors[b, rows[b]] == anchors[c, rows[c]]) == (right[b] == right[c])
  turn_rewards = np.asarray(rollout.extras["turn_rewards"])
  values = np.where(mask, np.random.default_rng(0).normal(size=mask.shape), 0.0).astype(np.float32)
  rollout = rollout.replace(values=jax.numpy.asarray(values))
  rewards = np.asarray(rollout.rewards)
  np.testing.assert_allclose(estimators.get("gigpo")(rollout, gamma=0.9).advantages,
                             reference.gigpo(turn_rewards, rewards, anchors, turn_ids, mask, 8, 1.0,
                                             0.9), atol=1e-5)
  np.testing.assert_allclose(estimators.get("mt_grpo")(rollout).advantages,
                             reference.mt_grpo(turn_rewards, rewards, turn_ids, mask, 8, 1.0),
                             atol=1e-5)
  np.testing.assert_allclose(estimators.get("turn_gae")(rollout, lam=0.9).advantages,
                             reference.turn_gae(turn_rewards, values, turn_ids, mask, 1.0, 0.9)[0],
                             atol=1e-5)


def _source():
  return key_turns.episode_source(CONFIG)


def test_the_per_turn_baseline_is_unbiased_and_reads_only_the_history():
  """b_k (the mean reward of continuations branched from turn k's start) estimates the
  exact V(h_k); the advantage G_k - b_k has mean 0 at every turn; and b_k does not
  change when the turn's own action and what follows it change."""
  from jaxcredit import estimators

  model = _key_leaning_model()
  rollout, examples = _episodes(model, 128, seed=2)
  baselines, generated = _source().returns_to_go(model, rollout, examples, samples=4,
                                                 key=jax.random.key(9))
  values, _ = key_turns.oracle.turn_credit(model, CONFIG, rollout.tokens, rollout.token_valid)
  mask, turn_ids = np.asarray(rollout.mask), np.asarray(rollout.turn_ids)
  starts = np.asarray(estimators.turn_starts(turn_ids, mask))
  assert starts.sum() == 128 * CONFIG.n_turns and generated > 0
  at_starts = baselines[starts].reshape(128, CONFIG.n_turns)
  np.testing.assert_array_equal(baselines[~starts], 0.0)
  rollout = rollout.replace(extras={**rollout.extras,
                                    "turn_baselines": jax.numpy.asarray(baselines)})
  advantages = np.asarray(estimators.get("turn_baseline")(rollout).advantages)
  first = np.asarray(advantages)[starts].reshape(128, CONFIG.n_turns)
  for k in range(CONFIG.n_turns):
    error = at_starts[:, k] - values[:, k]
    stderr = lambda x: x.std() / np.sqrt(len(x)) + 1e-9
    assert abs(error.mean()) < 4.5 * stderr(error), (k, error.mean(), error.std())
    assert abs(first[:, k].mean()) < 4.5 * stderr(first[:, k]), (k, first[:, k].mean())
  # Change row 0 from turn 2 on (its action and the later ones): b_0..b_2 stay as they were.
  tokens = np.asarray(rollout.tokens).copy()
  later = np.flatnonzero(mask[0] & (turn_ids[0] >= 2))
  tokens[0, later] = (tokens[0, later] + 1 - 5) % 3 + 5  # another key
  changed, _ = _source().returns_to_go(model, rollout.replace(tokens=jax.numpy.asarray(tokens)),
                                       examples, samples=4, key=jax.random.key(9))
  row_starts = np.flatnonzero(starts[0])
  np.testing.assert_array_equal(changed[0, row_starts[:3]], baselines[0, row_starts[:3]])
  np.testing.assert_array_equal(changed[1:], baselines[1:])


def test_turn_vine_estimates_the_exact_turn_credit_and_sharpens_with_continuations():
  """turn_vine's A_k = r_k + V(h_(k+1)) - V(h_k) on Monte-Carlo turn-start values: TD(0) over
  turns (the float64 reference), unbiased for the exact turn credit at every turn, and closer
  to it with more continuations (the lab's Monte-Carlo turn oracle)."""
  from jaxcredit import estimators
  from tests import reference

  model = _key_leaning_model()
  rollout, examples = _episodes(model, 64, seed=3)
  _, exact = key_turns.oracle.turn_credit(model, CONFIG, rollout.tokens, rollout.token_valid)
  mask, turn_ids = np.asarray(rollout.mask), np.asarray(rollout.turn_ids)
  starts = np.asarray(estimators.turn_starts(turn_ids, mask))
  exact = exact[starts].reshape(64, CONFIG.n_turns)
  errors = {}
  for samples in (2, 16):
    values, _ = _source().returns_to_go(model, rollout, examples, samples=samples,
                                        key=jax.random.key(samples))
    with_values = rollout.replace(extras={**rollout.extras,
                                          "turn_baselines": jax.numpy.asarray(values)})
    advantages = np.asarray(estimators.get("turn_vine")(with_values).advantages)
    turn_rewards = np.asarray(rollout.extras["turn_rewards"])
    np.testing.assert_allclose(
        advantages, reference.turn_gae(turn_rewards, values, turn_ids, mask, 1.0, 0.0)[0],
        atol=1e-6)
    errors[samples] = advantages[starts].reshape(64, CONFIG.n_turns) - exact
  for k in range(CONFIG.n_turns):
    error = errors[16][:, k]
    assert abs(error.mean()) < 4.5 * (error.std() / 8 + 1e-9), (k, error.mean(), error.std())
  # Two independent means of n continuations: the error's variance falls as 1 / n.
  assert np.mean(errors[16] ** 2) < 0.5 * np.mean(errors[2] ** 2)
