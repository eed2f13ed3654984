"""Partial rollouts across steps: every step emits a whole batch of complete groups, oldest
first, each exactly once; tokens drawn before a step carry the policy that drew them."""

import jax
import numpy as np
import pytest

from jaxcredit.models import preset
from jaxcredit.rollout_sources import PartialRollouts, SingleTurn
from tests.unit.sampling.conftest import left_padded_prompts, peaked_model

CONFIG = preset("tiny", vocab_size=16)


def _batch(step, prompts=2, group_size=3):
  tokens, valid = left_padded_prompts(np.random.default_rng(step), prompts, 5, 8, 16)
  return {"prompts": np.repeat(np.asarray(tokens), group_size, 0),
          "prompt_valid": np.repeat(np.asarray(valid), group_size, 0),
          "examples": [(step, p) for p in range(prompts) for _ in range(group_size)],
          "truncated": 0}


def test_each_step_emits_whole_groups_oldest_first_with_their_sampling_policies():
  policies = [peaked_model(CONFIG, scale) for scale in (6, 3, 5, 4, 2, 6)]
  lengths = lambda tokens, mask, examples: mask.sum(1).astype(np.float32)
  source = SingleTurn(lengths, 12, group_size=3, stop_tokens=(5,), slots=2)
  partial = PartialRollouts(source, decode_limit=8)
  emitted, stale = [], 0
  for step, policy in enumerate(policies):
    ahead = [_batch(step + 1)] if partial.started else [_batch(step), _batch(step + 1)]
    batch, rollout = partial.sample(policy, ahead, jax.random.key(step))
    assert rollout.tokens.shape == (6, 17) and rollout.group_size == 3
    groups = batch["examples"][::3]
    emitted += groups
    assert batch["examples"] == [g for g in groups for _ in range(3)]
    np.testing.assert_array_equal(batch["prompts"], np.asarray(rollout.tokens)[:, :5])
    np.testing.assert_array_equal(rollout.rewards, np.asarray(rollout.mask).sum(1))
    staleness = np.asarray(rollout.extras["token_staleness"])
    mask = np.asarray(rollout.mask)
    stale += int((staleness[mask] > 0).sum())
    # Each token's behaviour log-prob is its own sampling policy's (teacher forcing).
    for lag in np.unique(staleness[mask]):
      drew = policies[step - lag]
      logits = drew(rollout.tokens, positions=rollout.positions,
                    token_valid=rollout.token_valid).logits[:, :-1]
      forced = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits, -1)),
                                  np.asarray(rollout.tokens)[:, 1:, None], -1)[..., 0]
      mine = (staleness[:, 1:] == lag) & mask[:, 1:]
      np.testing.assert_allclose(np.asarray(rollout.behaviour_logprobs)[:, 1:][mine],
                                 forced[mine], rtol=1e-4, atol=1e-4)
    first = np.argmax(mask, 1)
    np.testing.assert_array_equal(rollout.staleness, staleness[np.arange(6), first])
  assert stale > 0  # some responses ran across steps
  assert len(set(emitted)) == len(emitted)  # no group twice
  assert emitted == sorted(emitted)  # oldest first


def test_partial_rollouts_need_the_continuous_engine_and_a_positive_limit():
  score = lambda tokens, mask, examples: np.zeros(len(tokens), np.float32)
  with pytest.raises(ValueError, match="rollout.engine = 'continuous'"):
    PartialRollouts(SingleTurn(score, 8), decode_limit=4)
  with pytest.raises(ValueError, match="rollout.partial_decode_steps must be a positive int"):
    PartialRollouts(SingleTurn(score, 8, slots=2), decode_limit=0)
