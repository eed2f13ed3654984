"""config.rollout: the tree (TreeSpec) and the sampling engine it gives, and the settings it
refuses."""

import types

import numpy as np
import pytest

from jaxcredit.rollout_sources import MultiTurn, SingleTurn, TurnTree
from jaxcredit.sampling import Actions, TreeSpec
from jaxcredit.train import loop, rollout_config
from tests.conftest import load_experiment
from tests.unit.train.test_staleness import _train_records

SINGLE_TURN = types.SimpleNamespace(name="key_token", environment=None, max_response_length=24,
                                    actions=Actions())
MULTI_TURN = types.SimpleNamespace(name="key_turns", environment=object(), max_turns=4)


def test_the_shipped_tree_config_gives_its_tree_and_none_without_one():
  config = load_experiment("key_token_treepo")
  assert rollout_config.tree_spec(config, SINGLE_TURN) == TreeSpec(roots=2, branching=2, depth=2,
                                                          segment_tokens=8)
  assert rollout_config.tree_spec(load_experiment("key_token_grpo"), SINGLE_TURN) is None
  assert rollout_config.tree_spec(load_experiment("key_turns_tree_grpo"), MULTI_TURN) == TurnTree(
      roots=2, branching=2, depth=2, segment_turns=1)
  config = load_experiment("key_turns_tree_grpo")
  config.rollout.tree.depth = 4
  with pytest.raises(ValueError, match="not within the episode's 4 turns"):
    rollout_config.tree_spec(config, MULTI_TURN)


def test_tree_settings_that_cannot_work_are_refused_naming_them():
  config = load_experiment("key_token_treepo")
  config.rl.group_size = 4
  with pytest.raises(ValueError, match=r"rollout.tree has 8 leaves per prompt .* set "
                                       r"rl.group_size = 8"):
    rollout_config.tree_spec(config, SINGLE_TURN)
  config = load_experiment("key_token_treepo")
  config.rollout.tree.segment_tokens = 12
  with pytest.raises(ValueError, match="beyond the response budget of 24 tokens"):
    rollout_config.tree_spec(config, SINGLE_TURN)
  config = load_experiment("key_token_treepo")
  multi_turn = types.SimpleNamespace(name="key_turns", environment=object(),
                                     max_response_length=24, actions=Actions())
  with pytest.raises(ValueError, match="does not suit task 'key_turns'.*fork='turns'"):
    rollout_config.tree_spec(config, multi_turn)
  config.rollout.tree.fork = "delimiter"
  with pytest.raises(ValueError, match="delimiter is the token that ends a segment"):
    rollout_config.tree_spec(config, SINGLE_TURN)
  config.rollout.tree.fork, config.rollout.tree.entropy_threshold = "entropy", 1.0
  assert rollout_config.tree_spec(config, SINGLE_TURN).entropy_threshold == 1.0


def test_a_tree_estimator_without_a_tree_rollout_is_refused_before_any_work():
  from jaxcredit import estimators
  from jaxcredit.train import refusals

  shape = dict(rows=8, columns=10, group_size=4, fields=set())
  for name in ("spo_tree", "treerl", "tempo", "treepo", "tree_grpo"):
    with pytest.raises(ValueError, match=rf"{name} needs a tree rollout.*rollout.tree.fork"):
      refusals.check_learner_inputs(estimators.from_config(name), None, **shape)
    refusals.check_learner_inputs(estimators.from_config(name), None, tree_depth=2, **shape)


def test_the_engine_gives_the_continuous_slots_and_none_for_the_static_sampler():
  config = load_experiment("quickstart")
  rows = config.rl.prompts_per_step * config.rl.group_size
  assert rollout_config.engine_slots(config, SINGLE_TURN) is None
  config.rollout.engine = "continuous"
  assert rollout_config.engine_slots(config, SINGLE_TURN) == rows // 4
  config.rollout.slots = 3
  assert rollout_config.engine_slots(config, SINGLE_TURN) == 3


@pytest.mark.parametrize("setting,value,message", [
    ("engine", "vllm", r"Unknown rollout.engine 'vllm'; known: static, continuous"),
    ("slots", 0, r"rollout.slots = 0 must lie in \[1, rl.prompts_per_step x rl.group_size"),
    ("slots", 10_000, r"rollout.slots = 10000 must lie in \[1,"),
])
def test_bad_engine_settings_are_refused_naming_them(setting, value, message):
  config = load_experiment("quickstart")
  config.rollout.engine = "continuous"
  config.rollout[setting] = value
  with pytest.raises(ValueError, match=message):
    rollout_config.engine_slots(config, SINGLE_TURN)


def test_the_continuous_engine_refuses_trees_and_plays_episodes_in_slots():
  config = load_experiment("key_token_treepo")
  config.rollout.engine = "continuous"
  with pytest.raises(ValueError, match="set rollout.tree.fork = 'none', or rollout.engine"):
    rollout_config.engine_slots(config, SINGLE_TURN)
  config = load_experiment("key_turns_grpo")
  config.rollout.engine, config.rollout.slots = "continuous", 5
  assert rollout_config.engine_slots(config, MULTI_TURN) == 5
  task = types.SimpleNamespace(**vars(MULTI_TURN), max_turn_tokens=1, max_response_length=8,
                               turn_end_tokens=(), pad_id=0, actions=Actions())
  source = rollout_config.rollout_source(config, task, np.asarray, np.asarray)
  assert isinstance(source, MultiTurn) and source.slots == 5
  config.rollout.partial_decode_steps = 4
  with pytest.raises(ValueError, match="episodes are played whole within a step"):
    rollout_config.partial_rollouts(config, source)


def test_a_multi_turn_task_trains_with_episode_slots_as_with_every_row_at_once(tmp_path,
                                                                            monkeypatch):
  """rollout.engine = 'continuous' plays key_turns' episodes 5 rows at a time: the run equals
  the one with a slot per row (each episode has its own key)."""
  played = []
  play = MultiTurn._play_slots
  monkeypatch.setattr(MultiTurn, "_play_slots",
                      lambda self, *args: played.append(self.slots) or play(self, *args))
  records = {}
  for slots in (5, 32):
    config = load_experiment("key_turns_grpo")
    config.task.options.update(n_turns=3, decisive=(1,))  # one key to copy: some rewards
    config.task.train_size, config.task.test_size = 64, 16
    config.rl.prompts_per_step, config.rl.group_size, config.rl.steps = 8, 4, 3
    config.rl.eval_every, config.checkpoint.every = 100, 100
    config.rollout.engine, config.rollout.slots = "continuous", slots
    loop.run(config, str(tmp_path / str(slots)))
    records[slots] = _train_records(tmp_path / str(slots))
  assert sorted(set(played)) == [5, 32]
  assert len(records[5]) == 3 and records[5][0].keys() == records[32][0].keys()
  assert sum(record["train/reward_mean"] for record in records[5]) > 0
  for got, want in zip(records[5], records[32]):
    for key in want:
      np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6, err_msg=key)


def test_episode_slots_on_several_processes_are_refused(monkeypatch):
  config = load_experiment("key_turns_grpo")
  config.rollout.engine = "continuous"
  monkeypatch.setattr(rollout_config.jax, "process_count", lambda: 2)
  with pytest.raises(ValueError, match="episodes on one process: set rollout.engine = 'static'"):
    rollout_config.engine_slots(config, MULTI_TURN)
  assert rollout_config.engine_slots(load_experiment("countdown_continuous"), SINGLE_TURN) >= 1


def test_partial_rollouts_need_the_continuous_engine_and_fresh_sampling():
  source = SingleTurn(lambda tokens, mask, examples: mask.sum(1), 8, slots=2)
  config = load_experiment("countdown_continuous")
  assert rollout_config.partial_rollouts(config, source) is None
  config.rollout.partial_decode_steps = 4
  assert rollout_config.partial_rollouts(config, source).decode_limit == 4
  config.rl.max_staleness = 1
  with pytest.raises(ValueError, match="does not combine with rl.max_staleness"):
    rollout_config.partial_rollouts(config, source)
  config = load_experiment("quickstart")
  config.rollout.partial_decode_steps = 4
  with pytest.raises(ValueError, match="rollout.partial_decode_steps needs the continuous engine"):
    rollout_config.partial_rollouts(config, source)
