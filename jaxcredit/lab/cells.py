"""A batched study cell: the task, the policy architecture, the arms and the training
settings its runs share (`Cell`), and the warm start that sets the regime a run starts in
(`Warmup`); both checked when built. `jaxcredit.lab.batched` runs them.
"""

import dataclasses
from collections.abc import Mapping

import numpy as np

from jaxcredit import estimators
from jaxcredit.lab import arms
from jaxcredit.models import TransformerConfig
from jaxcredit.sampling import TreeSpec
from jaxcredit.tasks import key_token, target_sum, zipf_explain

# The options of the tasks whose traceable form a cell runs.
TaskOptions = (key_token.KeyTokenConfig | target_sum.TargetSumConfig
               | zipf_explain.ZipfExplainConfig)
DEFAULT_OBJECTIVE = {"policy": {"name": "ppo_clip", "aggregation": "seq-mean-token-sum-norm"}}
MAX_TREE_PATHS = 4096  # E-TREE paths per prompt inside a batched run (visible filler)


@dataclasses.dataclass(frozen=True)
class Warmup:
  """A short SFT of the initial policy before RL (its own Adam), which sets the regime the run
  starts in. The loss is the mean negative log-likelihood of the response tokens.

  Attributes:
    steps: SFT steps.
    filler_probs: key_token's filler distribution over its filler alphabet F (a peaked one
      gives confident filler); None on zipf_explain, whose text comes from its grammar.
    key_accuracy: the probability that a demonstration's decisive token is the right key,
      else a uniform key (0: success stays at chance).
    batch_size: demonstrations per step.
    learning_rate: its Adam's rate.
  """

  steps: int
  filler_probs: tuple[float, ...] | None = None  # key_token's (zipf_explain: None)
  key_accuracy: float = 0.0
  batch_size: int = 64
  learning_rate: float = 1e-3

  def __post_init__(self):
    # A traced key_accuracy (a study vmapping over starting successes) is taken as is.
    if isinstance(self.key_accuracy, (int, float)) and not 0 <= self.key_accuracy <= 1:
      raise ValueError(f"warmup.key_accuracy must be in [0, 1], got {self.key_accuracy}.")


@dataclasses.dataclass(frozen=True)
class Cell:
  """One study cell: the task, the policy architecture, the arms and the training settings its
  runs share.

  Attributes:
    task: the task's options (key_token, target_sum or zipf_explain).
    model: the policy's `TransformerConfig`.
    arms: `estimators.from_config` specs.
    group_size: G.
    prompts_per_step: prompts per update.
    updates: RL updates per run.
    eval_every: updates between evaluations (when `eval_at` is None).
    eval_at: the updates before which J is measured (increasing, from 0, below `updates`;
      J is also measured after the last update), e.g. log-spaced to resolve a fast start;
      None: every `eval_every` updates.
    max_grad_norm: the global-norm clip.
    objective: the `losses.from_config` objective.
    eval_prompts: the most evaluation prompts.
    pass_at: the k of the pass@k evaluated.
    warmup: the `Warmup`, or None.
    mechanism_batches: > 0: the gradient measurements (`diagnostics.mechanism`) over that
      many batches...
    mechanism_evals: ...at these evaluations (None: every one).
    prm_learning_rates: the implicit PRM's Adam rate in each arm's runs (None:
      `arms.PRM_LEARNING_RATE`), with a PRIME arm.
    tree: a `TreeSpec` (``fork="fixed"``): each prompt's group is sampled as the leaves of
      a tree (`sampling.sample_tree`; the tree in rollout.extras, its shared segments
      generated once), or None for independent responses.
  """

  task: TaskOptions
  model: TransformerConfig
  arms: tuple[str | Mapping, ...]
  group_size: int
  prompts_per_step: int
  updates: int
  eval_every: int
  max_grad_norm: float = 1.0
  objective: Mapping = dataclasses.field(default_factory=lambda: DEFAULT_OBJECTIVE)
  eval_prompts: int = 256
  pass_at: tuple[int, ...] = (1, 4, 16, 64)
  warmup: Warmup | None = None
  mechanism_batches: int = 0  # > 0: the gradient measurements (below) at...
  mechanism_evals: tuple[int, ...] | None = None  # ...these evaluations (None: every one)
  # The implicit PRM's Adam rate in each arm's runs (None: arms.PRM_LEARNING_RATE), with a
  # PRIME arm: a setting of the arm, as its estimator config.
  prm_learning_rates: tuple[float | None, ...] | None = None
  tree: TreeSpec | None = None
  eval_at: tuple[int, ...] | None = None

  def __post_init__(self):
    if self.updates < 1 or self.eval_every < 1 or self.updates % self.eval_every:
      raise ValueError(f"updates ({self.updates}) must be a positive multiple of eval_every "
                       f"({self.eval_every}).")
    if self.eval_at is not None and (
        not self.eval_at or self.eval_at[0] != 0 or self.eval_at[-1] >= self.updates
        or any(b <= a for a, b in zip(self.eval_at, self.eval_at[1:]))):
      raise ValueError(f"eval_at must be increasing updates from 0, below updates "
                       f"({self.updates}); got {self.eval_at}.")
    if self.group_size < 1 or self.prompts_per_step < 1:
      raise ValueError(f"group_size and prompts_per_step must be >= 1, got {self.group_size} "
                       f"and {self.prompts_per_step}.")
    for arm in self.arms:
      arms.monte_carlo(estimators.from_config(arm))  # refuses Monte-Carlo values it cannot draw
    if self.tree is not None:
      self.tree.check(self.task.length)
      if self.tree.fork != "fixed" or self.tree.leaves != self.group_size:
        raise ValueError(f"A cell's tree forks at fixed columns and its leaves are the group: "
                         f"fork='fixed' and roots x branching^depth = group_size "
                         f"({self.group_size}), got {self.tree}.")
    if self.prm_learning_rates is not None and len(self.prm_learning_rates) != len(self.arms):
      raise ValueError(f"prm_learning_rates needs one rate (or None) per arm: "
                       f"{len(self.prm_learning_rates)} for {len(self.arms)} arms.")
    if isinstance(self.task, target_sum.TargetSumConfig):
      if self.warmup is not None or self.mechanism_batches:
        raise ValueError("target_sum cells run without a warmup and without the gradient "
                         "measurements (both are defined by key_token's decisive positions).")
      paths = target_sum.oracle.passes_per_prompt(self.task)
    elif isinstance(self.task, zipf_explain.ZipfExplainConfig):
      if self.mechanism_batches or (self.warmup is not None
                                    and self.warmup.filler_probs is not None):
        raise ValueError("zipf_explain cells run without the gradient measurements (its "
                         "decisive columns differ from response to response), and a warmup "
                         f"without filler_probs (its text is the grammar's); got {self.warmup}.")
      paths = 0
    elif not self.task.constrained:
      raise ValueError("Batched cells measure J(pi) with the exact oracle: key_token must be "
                       "constrained (keys at the decisive positions, filler elsewhere).")
    else:
      paths = 0 if self.task.filler_blind else key_token.oracle.passes_per_prompt(self.task)
    if paths > MAX_TREE_PATHS:
      raise ValueError(f"The exact oracle (E-TREE) runs {paths:,} paths per prompt, over "
                       f"{MAX_TREE_PATHS:,}: on key_token place the decisive positions earlier "
                       "or use fewer fillers; on target_sum use fewer digits or values.")
    if self.warmup is not None and isinstance(self.task, key_token.KeyTokenConfig) and (
        self.warmup.filler_probs is None or len(self.warmup.filler_probs) != self.task.n_fillers
        or not np.isclose(sum(self.warmup.filler_probs), 1.0)
        or min(self.warmup.filler_probs) < 0):
      raise ValueError(f"warmup.filler_probs must be {self.task.n_fillers} probabilities "
                       f"summing to 1; got {self.warmup}.")
    if self.mechanism_evals is not None and (
        not self.mechanism_evals or sorted(set(self.mechanism_evals)) != list(self.mechanism_evals)
        or not 0 <= self.mechanism_evals[0] <= self.mechanism_evals[-1] < self.n_evals):
      raise ValueError(f"mechanism_evals must be increasing evaluation indices in [0, "
                       f"{self.n_evals}), got {self.mechanism_evals}.")

  @property
  def eval_updates(self) -> tuple[int, ...]:
    """The update before which each evaluation is taken: `eval_at` (or 0, E, 2E, ...) and
    `updates` (after the last)."""
    before = self.eval_at if self.eval_at is not None else range(0, self.updates,
                                                                 self.eval_every)
    return (*before, self.updates)

  @property
  def n_evals(self) -> int:
    """Evaluations of a run (`eval_updates`)."""
    return len(self.eval_updates)

  @property
  def measured_evals(self) -> tuple[int, ...]:
    """The evaluations (indices) at which the gradient measurements are taken."""
    if not self.mechanism_batches:
      return ()
    return tuple(range(self.n_evals)) if self.mechanism_evals is None else self.mechanism_evals

  @property
  def tokens_per_update(self) -> int:
    """Response slots sampled per update: the generated tokens on key_token (T per
    response; a tree's shared segments once), an upper bound on target_sum (a response may
    stop before n + 1)."""
    if self.tree is None:
      return self.prompts_per_step * self.group_size * self.task.length
    return self.prompts_per_step * self.tree.slots(self.task.length)
