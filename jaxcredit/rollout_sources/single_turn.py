"""Single-turn rollouts: sample one response per prompt row, score it, return a Rollout."""

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import jax.numpy as jnp
import numpy as np
from jax import Array

from jaxcredit.rollout import Rollout
from jaxcredit.sampling import Actions, TreeSpec, generate, generate_continuous, sample_tree

Scorer = Callable[[np.ndarray, np.ndarray, Sequence[Any]], np.ndarray]
"""score(tokens [B, P + N], mask [B, P + N], examples) -> [B] rewards (host numpy)."""


class RolloutSource(Protocol):
  """The contract of a rollout stage: prompts in, a `Rollout` out.

  Implementations are called as ``source(model, batch, key) -> Rollout`` with `batch` the
  loader's prompts (``{"prompts", "prompt_valid", "examples"}``) and `key` a PRNG key.
  """

  def __call__(self, model, batch: Mapping[str, Any], key: Array) -> Rollout: ...


@dataclasses.dataclass(frozen=True)
class SingleTurn:
  """Samples `max_new_tokens` per row (KV-cache `generate`, or `generate_continuous`) and
  scores the rows.

  The other fields are `generate`'s settings. The Rollout carries tokens, mask,
  behaviour log-probs and entropies, rewards, truncation, positions and
  token_valid, with `group_size` rows per prompt. With a `tree`, each prompt's group is the
  leaves of a tree sampled from it (`sample_tree`: shared prefixes, the tree recorded in
  rollout.extras["tree_path"] and ["tree_segments"]).

  Attributes:
    score: the task's reward of whole sampled rows (`Scorer`), run on the host over this
      process's rows.
    place: this process's rows -> the global batch-sharded array (identity on one process).
    local: its inverse, for scoring.
    tree: the `TreeSpec` of each prompt's group (its leaves must be `group_size`), or None
      for independent responses.
    slots: None samples the rows as one static batch (`generate`); an int samples them by
      continuous batching through that many slots (`generate_continuous`: a slot takes the
      next response as soon as its own ends; each response drawn with a key of its own).
  """

  score: Scorer
  max_new_tokens: int
  group_size: int = 1
  temperature: float = 1.0
  stop_tokens: tuple[int, ...] = ()
  pad_id: int = 0
  actions: Actions = Actions()
  place: Callable[[np.ndarray], Array] = jnp.asarray
  local: Callable[[Array], np.ndarray] = np.asarray
  tree: TreeSpec | None = None
  slots: int | None = None

  @property
  def sampling(self) -> dict:
    """The sampler's keyword arguments these fields set (every engine's)."""
    return dict(max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                stop_tokens=self.stop_tokens, pad_id=self.pad_id, actions=self.actions)

  def __call__(self, model, batch: Mapping[str, Any], key: Array) -> Rollout:
    prompts, valid = self.place(batch["prompts"]), self.place(batch["prompt_valid"])
    settings, extras = self.sampling, {}
    if self.slots is not None:  # the group's rows repeat its prompt: prefilled once
      sample = generate_continuous(model, prompts[::self.group_size], valid[::self.group_size],
                                   key, slots=self.slots, group_size=self.group_size,
                                   **settings)
    elif self.tree is None:
      sample = generate(model, prompts, valid, key, **settings)
    else:  # the group's rows repeat its prompt: one tree from each group's first row
      tree = sample_tree(model, prompts[::self.group_size], valid[::self.group_size], key,
                         tree=self.tree, **settings)
      sample, extras = tree.output, {"tree_path": tree.path, "tree_segments": tree.segments}
    rewards = self.score(self.local(sample.tokens), self.local(sample.mask), batch["examples"])
    return Rollout(tokens=sample.tokens, mask=sample.mask,
                   rewards=self.place(np.asarray(rewards, np.float32)),
                   behaviour_logprobs=sample.logprobs,
                   entropy=sample.entropy, truncated=sample.truncated, positions=sample.positions,
                   token_valid=sample.token_valid, extras=extras, group_size=self.group_size)
