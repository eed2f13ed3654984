"""Multi-turn rollouts: layout, behaviour log-probs against teacher forcing, counted cuts,
hostile environments, and estimators carrying across observation spans."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bench.no_cache import RebuildingMultiTurn
from jaxcredit import estimators, forward
from jaxcredit.models import Transformer, preset
from jaxcredit.rollout_sources import MultiTurn
from jaxcredit.sampling import Actions

CONFIG = preset("tiny", vocab_size=32)
TURN_END = 5


class CountingEnv:
  """Observes each turn's actions back as [20 + len % 5, 20 + first % 5]; rewards
  an even first action; done after `turns` turns. Pure: the state is the turn count."""

  def __init__(self, turns=3, reset_length=2):
    self.turns, self.reset_length = turns, reset_length

  def reset(self, rng, example):
    return 0, rng.integers(10, 20, self.reset_length) + 0 * example["offset"]

  def observe(self, actions):
    return np.asarray([20 + len(actions) % 5, 20 + actions[0] % 5])

  def step(self, state, actions):
    return state + 1, self.observe(actions), float(actions[0] % 2 == 0), state + 1 >= self.turns


@pytest.fixture(scope="module")
def model():
  model = Transformer(CONFIG, rngs=nnx.Rngs(0))
  state = nnx.state(model, nnx.Param)
  rng = np.random.default_rng(0)
  # Peaked distributions, so that turn-end tokens occur within a few tokens.
  nnx.update(model, jax.tree.map(lambda x: x * 6 + 0.02 * rng.normal(size=x.shape).astype(x.dtype),
                                 state))
  return model


def _batch(rows=6, length=4, seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, length + 1, rows)
  valid = np.arange(length)[None] >= (length - lengths)[:, None]
  prompts = np.where(valid, rng.integers(1, CONFIG.vocab_size, (rows, length)), 0)
  return {"prompts": prompts, "prompt_valid": valid,
          "examples": [{"offset": i} for i in range(rows)]}


def _turns(rollout, row):
  """[(actions, observation)] of each turn of a row, read back from the layout."""
  tokens, mask = np.asarray(rollout.tokens[row]), np.asarray(rollout.mask[row])
  turn_ids, valid = np.asarray(rollout.turn_ids[row]), np.asarray(rollout.token_valid[row])
  return [(tokens[mask & (turn_ids == k)], tokens[~mask & valid & (turn_ids == k)])
          for k in range(turn_ids.max() + 1)]


def test_layout_rewards_and_behaviour_logprobs(model):
  env = CountingEnv()
  source = MultiTurn(env, max_turns=3, max_turn_tokens=4, max_episode_tokens=40,
                     turn_end_tokens=(TURN_END,))
  rollout = source(model, _batch(), jax.random.key(0)).check()
  mask, valid = np.asarray(rollout.mask), np.asarray(rollout.token_valid)
  assert not (mask & ~valid).any()
  np.testing.assert_array_equal(np.asarray(rollout.extras["turns"]), 3)
  assert not np.asarray(rollout.truncated).any()
  cut = 0
  for row in range(6):
    turns = _turns(rollout, row)
    assert len(turns) == 3
    rewards = []
    for actions, observation in turns:
      ended = actions[-1] == TURN_END
      assert ended or len(actions) == 4
      assert TURN_END not in actions[:-1]
      cut += not ended
      np.testing.assert_array_equal(observation, env.observe(actions))
      rewards.append(float(actions[0] % 2 == 0))
    assert rollout.rewards[row] == sum(rewards)
    turn_rewards = np.asarray(rollout.extras["turn_rewards"][row])
    last_actions = [np.flatnonzero(mask[row] & (np.asarray(rollout.turn_ids[row]) == k))[-1]
                    for k in range(3)]
    np.testing.assert_array_equal(turn_rewards[last_actions], rewards)
    assert turn_rewards.sum() == sum(rewards)
  assert np.asarray(rollout.extras["cut_turns"]).sum() == cut
  assert 0 < cut < 18, "the test should see turns ended by the token and by the budget"
  # The learner's teacher-forced pass over the assembled rows reproduces the sampler's numbers.
  forced = forward.policy_outputs(model, rollout, 1.0)
  np.testing.assert_allclose(np.asarray(rollout.behaviour_logprobs)[mask],
                             np.asarray(forced.logprobs)[mask], atol=1e-4)
  np.testing.assert_allclose(np.asarray(rollout.entropy)[mask], np.asarray(forced.entropy)[mask],
                             atol=1e-4)
  np.testing.assert_array_equal(np.asarray(rollout.behaviour_logprobs)[~mask], 0.0)


def test_the_cache_kept_across_turns_samples_what_full_prefills_sample(model, monkeypatch):
  """The cache kept across turns (prefill each turn's new observation; rebuild when the slots
  run out, here with no headroom) against a full prefill every turn: the same key, the same
  episodes."""
  from jaxcredit.rollout_sources import turn_sampler

  starts = []
  counted = lambda *args, **kwargs: starts.append(1) or turn_sampler.start_contexts.__wrapped__(
      *args, **kwargs)
  counted.__wrapped__ = turn_sampler.start_contexts
  monkeypatch.setattr(turn_sampler, "start_contexts", counted)
  rollouts = {}
  for reuse, source_type in ((True, MultiTurn), (False, RebuildingMultiTurn)):
    starts.clear()
    source = source_type(CountingEnv(turns=8, reset_length=3), max_turns=8, max_turn_tokens=4,
                         max_episode_tokens=40, turn_end_tokens=(TURN_END,), cache_headroom=0)
    rollouts[reuse] = source(model, _batch(rows=5), jax.random.key(5))
    rollouts[reuse, "starts"] = len(starts)
  assert 1 < rollouts[True, "starts"] < rollouts[False, "starts"]  # rebuilt when full
  kept, rebuilt = rollouts[True], rollouts[False]
  for name in ("tokens", "mask", "token_valid", "turn_ids", "rewards", "truncated"):
    np.testing.assert_array_equal(getattr(kept, name), getattr(rebuilt, name), err_msg=name)
  # float32 at logits made large on purpose; another summation order (pad slots between).
  np.testing.assert_allclose(kept.behaviour_logprobs, rebuilt.behaviour_logprobs, rtol=2e-3,
                             atol=1e-4)
  assert np.asarray(kept.extras["turns"]).min() >= 3


def test_fixed_length_turns_without_turn_end_tokens(model):
  rollout = MultiTurn(CountingEnv(turns=2), max_turns=2, max_turn_tokens=3,
                      max_episode_tokens=20)(model, _batch(rows=2), jax.random.key(1))
  for row in range(2):
    assert [len(actions) for actions, _ in _turns(rollout, row)] == [3, 3]
  np.testing.assert_array_equal(np.asarray(rollout.extras["cut_turns"]), 0)


def test_context_overflow_is_counted_and_scored(model):
  # 2 reset tokens + 4 actions + 2 observation tokens = 8 columns per first turn: room for one.
  source = MultiTurn(CountingEnv(turns=3), max_turns=3, max_turn_tokens=4, max_episode_tokens=9)
  rollout = source(model, _batch(), jax.random.key(2))
  assert np.asarray(rollout.truncated).all()
  assert np.asarray(rollout.token_valid)[:, 4:].sum(axis=1).max() <= 9
  turn_rewards = np.asarray(rollout.extras["turn_rewards"])
  np.testing.assert_array_equal(np.asarray(rollout.rewards), turn_rewards.sum(axis=1))
  assert np.isin(np.asarray(rollout.rewards), [0.0, 1.0]).all()  # the first turn's reward counts


class _Oversized(CountingEnv):
  """Answers turn 0 with `size` tokens; resets with `reset_length` tokens."""

  def __init__(self, size, reset_length=2):
    super().__init__(turns=3, reset_length=reset_length)
    self.size = size

  def step(self, state, actions):
    state, observation, reward, done = super().step(state, actions)
    return state, np.full(self.size if state == 1 else 2, 20), reward, done


def test_an_oversized_observation_ends_the_episode_and_counts_what_it_drops(model):
  """The rule at the context limit: what fits is kept, the episode ends truncated and scored
  by the rewards it received, and the tokens that did not fit are counted."""
  source = MultiTurn(_Oversized(40), max_turns=3, max_turn_tokens=2, max_episode_tokens=30,
                     turn_end_tokens=(TURN_END,))
  rollout = source(model, _batch(rows=4), jax.random.key(4))
  first_turn = np.asarray(rollout.mask).sum(axis=1)  # only turn 0's actions fit
  np.testing.assert_array_equal(np.asarray(rollout.extras["turns"]), 1)
  np.testing.assert_array_equal(np.asarray(rollout.extras["dropped_tokens"]),
                                40 - (30 - 2 - first_turn))
  assert np.asarray(rollout.truncated).all()
  np.testing.assert_array_equal(np.asarray(rollout.token_valid)[:, 4:].sum(axis=1), 30)
  # A reset observation longer than the episode: no turn is played.
  rollout = MultiTurn(CountingEnv(reset_length=50), max_turns=3, max_turn_tokens=2,
                      max_episode_tokens=30)(model, _batch(rows=2), jax.random.key(4))
  np.testing.assert_array_equal(np.asarray(rollout.extras["dropped_tokens"]), 20)
  np.testing.assert_array_equal(np.asarray(rollout.extras["turns"]), 0)
  assert not np.asarray(rollout.mask).any() and np.asarray(rollout.truncated).all()
  # Within the columns nothing is dropped.
  rollout = MultiTurn(CountingEnv(turns=2), max_turns=2, max_turn_tokens=2,
                      max_episode_tokens=30)(model, _batch(rows=2), jax.random.key(4))
  np.testing.assert_array_equal(np.asarray(rollout.extras["dropped_tokens"]), 0)


def test_an_episode_out_of_turns_is_truncated(model):
  rollout = MultiTurn(CountingEnv(turns=5), max_turns=2, max_turn_tokens=2,
                      max_episode_tokens=30)(model, _batch(rows=2), jax.random.key(3))
  assert np.asarray(rollout.truncated).all()
  np.testing.assert_array_equal(np.asarray(rollout.extras["turns"]), 2)


class _Hostile(CountingEnv):
  def __init__(self, observation=None, reward=1.0):
    super().__init__()
    self.bad_observation, self.bad_reward = observation, reward

  def step(self, state, actions):
    state, observation, _, done = super().step(state, actions)
    return state, (observation if self.bad_observation is None else self.bad_observation), \
        self.bad_reward, done


@pytest.mark.parametrize("env,error,match", [
    (_Hostile(observation="the answer is 4"), TypeError, "not a 1-D array of token ids"),
    (_Hostile(observation=np.asarray([1.5, 2.0])), TypeError, "not a 1-D array of token ids"),
    (_Hostile(observation=np.asarray([[1, 2]])), TypeError, "not a 1-D array of token ids"),
    (_Hostile(observation=np.asarray([3, 32])), ValueError, r"outside the vocabulary \[0, 32\)"),
    (_Hostile(reward=float("nan")), ValueError, "non-finite reward"),
    (_Hostile(reward="1"), TypeError, "not a real number"),
])
def test_hostile_environments_are_named(model, env, error, match):
  source = MultiTurn(env, max_turns=2, max_turn_tokens=2, max_episode_tokens=20)
  with pytest.raises(error, match=match) as raised:
    source(model, _batch(rows=2), jax.random.key(4))
  assert "_Hostile.step (turn 0)" in str(raised.value)


def test_bad_budgets_are_named():
  with pytest.raises(ValueError, match="max_turn_tokens must be a positive int"):
    MultiTurn(CountingEnv(), max_turns=2, max_turn_tokens=0, max_episode_tokens=20)


def _compact(x, mask):
  """Each row's action positions moved to the front (right-padded with 0)."""
  out = np.zeros_like(x)
  for row in range(len(x)):
    picked = x[row][mask[row]]
    out[row, :len(picked)] = picked
  return out


@pytest.mark.parametrize("seed", range(3))
def test_returns_and_values_carry_across_observation_spans(seed):
  """GAE and discounted returns over [actions, observation, actions, ...] rows
  equal those over the same actions laid out as one response."""
  rng = np.random.default_rng(seed)
  batch, length = 4, 48
  spans = rng.random((batch, length)) < 0.3  # observation tokens
  mask = ~spans & (np.arange(length)[None] < rng.integers(10, length + 1, (batch, 1)))
  rewards = rng.normal(size=(batch, length)).astype(np.float32)
  values = rng.normal(size=(batch, length)).astype(np.float32)
  rewards[spans], values[spans] = np.nan, np.inf  # what an observation carries never leaks
  compact_mask = _compact(mask, mask)
  for method in estimators.RECURRENCE_METHODS:
    advantages, returns = estimators.gae(jnp.asarray(rewards), jnp.asarray(values),
                                         jnp.asarray(mask), gamma=0.9, lam=0.8, method=method)
    want_adv, want_ret = estimators.gae(jnp.asarray(_compact(rewards, mask)),
                                        jnp.asarray(_compact(values, mask)),
                                        jnp.asarray(compact_mask), gamma=0.9, lam=0.8,
                                        method=method)
    np.testing.assert_allclose(_compact(np.asarray(advantages), mask), want_adv, atol=1e-5)
    np.testing.assert_allclose(_compact(np.asarray(returns), mask), want_ret, atol=1e-5)
  discounted = estimators.discounted_returns(jnp.asarray(rewards), jnp.asarray(mask), gamma=0.9)
  want = estimators.discounted_returns(jnp.asarray(_compact(rewards, mask)),
                                       jnp.asarray(compact_mask), gamma=0.9)
  np.testing.assert_allclose(_compact(np.asarray(discounted), mask), want, atol=1e-5)
  assert np.isfinite(np.asarray(discounted)).all()


class _Forgetful(CountingEnv):
  """Observes a counter that lives outside the state: a replay sees other observations."""

  calls = 0

  def step(self, state, actions):
    _Forgetful.calls += 1
    state, _, reward, done = super().step(state, actions)
    return state, np.asarray([20 + _Forgetful.calls % 5]), reward, done


def test_per_turn_baselines_refuse_an_environment_that_does_not_replay(model):
  source = MultiTurn(_Forgetful(), max_turns=3, max_turn_tokens=2, max_episode_tokens=30)
  batch = _batch(rows=2)
  rollout = source(model, batch, jax.random.key(6))
  with pytest.raises(ValueError, match="_Forgetful replayed turn 0 of row 0"):
    source.returns_to_go(model, rollout, batch["examples"], samples=2, key=jax.random.key(7))
  counting = MultiTurn(CountingEnv(), max_turns=3, max_turn_tokens=2, max_episode_tokens=30)
  rollout = counting(model, batch, jax.random.key(6))
  baselines, _ = counting.returns_to_go(model, rollout, batch["examples"], samples=2,
                                        key=jax.random.key(7))
  assert np.isfinite(baselines).all() and (np.asarray(rollout.mask) | (baselines == 0)).all()


def test_a_turn_tree_shares_whole_turns_copies_the_environment_and_records_the_tree(model):
  from jaxcredit.rollout_sources import TurnTree

  tree = TurnTree(roots=2, branching=2, depth=2, segment_turns=1)  # forks after turns 0 and 1
  source = MultiTurn(CountingEnv(turns=4), max_turns=4, max_turn_tokens=3,
                     max_episode_tokens=40, turn_end_tokens=(TURN_END,), group_size=8, tree=tree)
  batch = _batch(rows=16)
  batch["examples"] = [{"offset": i // 8} for i in range(16)]  # a group repeats its prompt
  rollout = source(model, batch, jax.random.key(3))
  path, segments = (np.asarray(rollout.extras[k]) for k in ("tree_path", "tree_segments"))
  np.testing.assert_array_equal(path[:8, 0], [0] * 4 + [12] * 4)  # two roots per prompt
  tokens, turn_ids = np.asarray(rollout.tokens), np.asarray(rollout.turn_ids)
  prompt = np.arange(tokens.shape[1]) < batch["prompts"].shape[1]
  for level in range(3):
    for a in range(16):
      for b in np.flatnonzero(path[:, level] == path[a, level]):
        # Rows under one node hold the same turns up to it: prompt, episode and observations.
        shared = prompt | ((segments[a] <= level) & (segments[a] >= 0))
        np.testing.assert_array_equal(tokens[a][shared], tokens[b][shared])
    # A segment is whole turns with the observations answering them (the reset observation
    # before the first turn; the last segment, every turn after the last fork).
    for row in range(16):
      turns = set(turn_ids[row][segments[row] == level].tolist())
      assert turns <= ({-1, 0} if level == 0 else {1} if level == 1 else {2, 3}), turns
  # Copied environment states: each leaf's observations are those its actions get, and the
  # rewards sum its turns' (replayed from the reset seed, as the per-turn baseline does).
  for row in range(16):
    turns = _turns(rollout, row)
    assert len(turns) == 4
    for actions, observation in turns:
      np.testing.assert_array_equal(observation, CountingEnv().observe(actions))
    assert float(rollout.rewards[row]) == sum(float(a[0] % 2 == 0) for a, _ in turns)
  source.returns_to_go(model, rollout, batch["examples"], samples=1, key=jax.random.key(0))
  advantages = estimators.get("tree_grpo")(rollout).advantages
  assert np.all(np.isfinite(advantages))
  assert np.all(np.asarray(advantages)[~np.asarray(rollout.mask)] == 0)
  with pytest.raises(ValueError, match="set rl.group_size = 8"):
    MultiTurn(CountingEnv(), max_turns=4, max_turn_tokens=3, max_episode_tokens=40,
              group_size=4, tree=tree)
  with pytest.raises(ValueError, match="not within the episode's 2 turns"):
    MultiTurn(CountingEnv(), max_turns=2, max_turn_tokens=3, max_episode_tokens=40,
              group_size=8, tree=tree)


class _Varying(CountingEnv):
  """CountingEnv whose episode also ends on a first action divisible by 3: 1 to `turns`
  turns."""

  def step(self, state, actions):
    state, observation, reward, done = super().step(state, actions)
    return state, observation, reward, done or actions[0] % 3 == 0


@pytest.mark.parametrize("hidden", [False, True])
def test_episode_slots_play_each_episode_as_every_row_at_once_does(model, hidden):
  """Continuous batching of episodes: through one slot (each episode after the others in the
  same cache row, cleared between them) or three (a new episode prefilled beside the others'
  observations; no headroom, so the cache is also rebuilt), every episode is the one it is
  with a slot of its own - tokens, rewards, the environment's records - and the learner's
  teacher-forced pass reproduces its log-probs, so no episode sees its slot's previous one."""
  rows, prompt_width, columns = 8, 4, 48
  actions = Actions()
  if hidden:  # hidden columns, on the prompt and on the episode, fed as another token
    hidden_columns = np.zeros(prompt_width + columns, bool)
    hidden_columns[[2, 7, 12, 20]] = True
    actions = Actions(hidden=hidden_columns, hidden_token=3)
  rollouts = {}
  for slots in (rows, 3, 1):
    source = MultiTurn(_Varying(turns=6), max_turns=6, max_turn_tokens=4,
                       max_episode_tokens=columns, turn_end_tokens=(TURN_END,), actions=actions,
                       cache_headroom=0, slots=slots)
    rollouts[slots] = source(model, _batch(rows=rows, length=prompt_width), jax.random.key(3))
  turns = np.asarray(rollouts[rows].extras["turns"])
  assert turns.min() == 1 and turns.max() >= 4, "the test should see short and long episodes"
  for slots in (3, 1):
    for name in ("tokens", "mask", "token_valid", "turn_ids", "rewards", "truncated"):
      np.testing.assert_array_equal(getattr(rollouts[rows], name), getattr(rollouts[slots], name),
                                    err_msg=f"{name}, {slots} slots")
    for name in ("turns", "cut_turns", "turn_rewards", "turn_anchors", "env_seeds"):
      np.testing.assert_array_equal(rollouts[rows].extras[name], rollouts[slots].extras[name],
                                    err_msg=f"{name}, {slots} slots")
    np.testing.assert_allclose(rollouts[rows].behaviour_logprobs,
                               rollouts[slots].behaviour_logprobs, rtol=2e-3, atol=1e-4)
  rollout = rollouts[1]
  mask = np.asarray(rollout.mask)
  forced = forward.policy_outputs(model, rollout, 1.0, actions=actions)
  np.testing.assert_allclose(np.asarray(rollout.behaviour_logprobs)[mask],
                             np.asarray(forced.logprobs)[mask], rtol=1e-4, atol=1e-4)


def test_bad_episode_slots_are_refused_naming_them():
  with pytest.raises(ValueError, match="MultiTurn.slots must be a positive int, got 0"):
    MultiTurn(CountingEnv(), max_turns=2, max_turn_tokens=3, max_episode_tokens=20, slots=0)
  from jaxcredit.rollout_sources import TurnTree

  with pytest.raises(ValueError, match="set slots = None or tree = None"):
    MultiTurn(CountingEnv(), max_turns=2, max_turn_tokens=3, max_episode_tokens=20,
              group_size=2, tree=TurnTree(roots=1, branching=2, depth=1), slots=2)
