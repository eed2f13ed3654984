"""Partial rollouts: responses still running when a step's decode budget is spent continue in
the next step, under the newer policy (Kimi k1.5's and slime's partial rollouts).

`PartialRollouts` wraps a continuous-engine `SingleTurn`. Each `sample` takes new prompts
(whole groups: the trainer brings one batch ahead at its first call, so that a batch's worth of
groups is always in flight), resumes the responses carried from earlier calls first, and
decodes for at most `decode_limit` steps (`sampling.continuous.generate_partial`); responses
still running are carried to the next call. It returns the step's batch: the Q oldest groups
whose responses have all finished (decoding on, without new prompts, until Q groups are
complete), so every step's rollout has the same shape; finished groups beyond Q wait for the
next step (the batch returned beside the rollout holds the emitted groups' prompts and
examples). A token's behaviour log-prob is the one its own sampling policy gave it, and
``extras["token_staleness"]`` ``[B, T]`` says how many calls ago that policy sampled it;
`Rollout.staleness` ``[B]`` is that of each response's oldest token. Carried responses live in
the process: a run resumed from a checkpoint starts them again.
"""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax import Array

from jaxcredit.rollout import Rollout
from jaxcredit.rollout_sources.single_turn import SingleTurn
from jaxcredit.sampling import continuous, partial_responses

_FIELDS = ("tokens", "mask", "logprobs", "entropy", "token_valid", "positions", "truncated")


@dataclasses.dataclass
class PartialRollouts:
  """A continuous-engine `SingleTurn` whose responses may run across calls (module docstring).

  Attributes:
    source: the `SingleTurn` (its `slots` set: the continuous engine) whose settings sample and
      score.
    decode_limit: the decode steps each call runs before returning what has finished (more
      when fewer than a batch of groups has).
  """

  source: SingleTurn
  decode_limit: int
  _calls: int = 0
  _carried: partial_responses.Partial | None = None
  _owners: list = dataclasses.field(default_factory=list)  # (group, member) of carried rows
  _groups: list = dataclasses.field(default_factory=list)  # oldest first

  def __post_init__(self):
    if self.source.slots is None:
      raise ValueError("Partial rollouts need the continuous engine: rollout.engine = "
                       "'continuous'.")
    if not isinstance(self.decode_limit, int) or self.decode_limit < 1:
      raise ValueError(f"rollout.partial_decode_steps must be a positive int, got "
                       f"{self.decode_limit!r}.")

  @property
  def started(self) -> bool:
    """Whether a call has run (groups may be in flight)."""
    return self._calls > 0

  def sample(self, model, batches: Sequence[Mapping[str, Any]],
             key: Array) -> tuple[dict, Rollout]:
    """The step's batch and its scored rollout: the Q oldest complete groups (module
    docstring), Q being the number of groups one batch brings.

    Args:
      model: the policy now (its version is this object's call count).
      batches: new prompts, whole groups, in `SingleTurn`'s batch layout: the next batch, or
        at the first call the step's and the next (a batch's worth of groups in flight).
      key: a PRNG key.

    Returns:
      ``(batch, rollout)``: the emitted groups' prompts, validity and examples (a batch's
      layout), and their `Rollout`.
    """
    source, group_size = self.source, self.source.group_size
    prompts = np.concatenate([np.asarray(b["prompts"])[::group_size] for b in batches])
    valid = np.concatenate([np.asarray(b["prompt_valid"])[::group_size] for b in batches])
    wanted = len(batches[-1]["prompts"]) // group_size
    examples = [e for b in batches for e in list(b["examples"])[::group_size]]
    batch = batches[-1]
    for prompt, prompt_valid, example in zip(prompts, valid, examples):
      self._groups.append({"prompt": prompt, "prompt_valid": prompt_valid, "example": example,
                           "rows": [None] * group_size})
    fresh = [(group, member) for group in self._groups[len(self._groups) - len(prompts):]
             for member in range(group_size)]
    while True:
      owners = self._owners + fresh
      sample = continuous.generate_partial(
          model, prompts, valid, key, resume=self._carried, decode_limit=self.decode_limit,
          version=self._calls, slots=min(source.slots, len(owners)), group_size=group_size,
          **source.sampling)
      output = jax.tree.map(np.asarray, sample.output._asdict())
      version, cut = np.asarray(sample.version), np.asarray(sample.unfinished)
      unfinished = cut & np.asarray([o is not None for o in owners])
      for row in np.flatnonzero(~cut):
        if owners[row] is not None:
          group, member = owners[row]
          group["rows"][member] = ({k: output[k][row] for k in _FIELDS}
                                   | {"version": version[row]})
      left = np.flatnonzero(unfinished)
      # Padded to a power of two rows (the copies own nothing: their samples are dropped).
      unfinished_sample = sample._replace(unfinished=unfinished)
      self._carried = (partial_responses.carry_over(unfinished_sample, pad=True)
                       if left.size else None)
      self._owners = [owners[row] for row in left]
      if left.size:
        self._owners += [None] * (self._carried.tokens.shape[0] - left.size)
      complete = [g for g in self._groups if all(r is not None for r in g["rows"])]
      if len(complete) >= wanted:
        break
      prompts, valid, fresh = prompts[:0], valid[:0], []  # decode on, no new prompts
    emitted = complete[:wanted]
    self._groups = [g for g in self._groups if all(g is not e for e in emitted)]
    rollout = self._rollout(emitted)
    self._calls += 1
    repeat = lambda key: np.repeat(np.stack([g[key] for g in emitted]), group_size, 0)
    return {"prompts": repeat("prompt"), "prompt_valid": repeat("prompt_valid"),
            "examples": [g["example"] for g in emitted for _ in range(group_size)],
            "truncated": batch.get("truncated", 0)}, rollout

  def _rollout(self, groups: list) -> Rollout:
    source = self.source
    rows = [row for group in groups for row in group["rows"]]
    stacked = {k: np.stack([row[k] for row in rows]) for k in (*_FIELDS, "version")}
    staleness = np.where(stacked["mask"], self._calls - stacked["version"], 0).astype(np.int32)
    examples = [group["example"] for group in groups for _ in group["rows"]]
    rewards = source.score(stacked["tokens"], stacked["mask"], examples)
    first = np.argmax(stacked["mask"], axis=1)
    place = source.place
    return Rollout(tokens=place(stacked["tokens"]), mask=place(stacked["mask"]),
                   rewards=place(np.asarray(rewards, np.float32)),
                   behaviour_logprobs=place(stacked["logprobs"]),
                   entropy=place(stacked["entropy"]), truncated=place(stacked["truncated"]),
                   positions=place(stacked["positions"]),
                   token_valid=place(stacked["token_valid"]),
                   staleness=place(staleness[np.arange(len(rows)), first]),
                   extras={"token_staleness": place(staleness)}, group_size=source.group_size)

