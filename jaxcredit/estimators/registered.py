"""Registry adapters: every estimator as `fn(rollout, **hparams) -> Estimate`; here the registry
and the estimators that credit a response's outcome (group and leave-one-out baselines,
REINFORCE and its variants, trees), and in `registered_token` those of token- and turn-level
credit."""

import functools
from collections.abc import Callable

import jax.numpy as jnp

from jaxcredit._masking import as_bool
from jaxcredit.estimators import (group, group_objectives, length_aware, returns, token_credit,
                                  tree_credit)
from jaxcredit.registry import Registry
from jaxcredit.rollout import Estimate, Rollout

EstimatorFn = Callable[..., Estimate]


def _adapt(name: str, fn: Callable) -> EstimatorFn:
  """Validates the rollout and accepts a bare [B, T] array as the advantages."""

  @functools.wraps(fn)
  def estimator(rollout: Rollout, **hparams) -> Estimate:
    out = fn(rollout.check(), **hparams)
    return out if isinstance(out, Estimate) else Estimate(advantages=out)

  return estimator


REGISTRY: Registry[EstimatorFn] = Registry("estimator", wrap=_adapt)
get = REGISTRY.get
names = REGISTRY.names


def register(name: str, *, needs: tuple[str, ...] = (), settings: dict | None = None,
             overwrite: bool = False):
  """Decorator registering ``fn(rollout, **hparams) -> Estimate | [B, T]`` as `name`.

  The registered function is adapted to take a checked `Rollout` and to return an
  `Estimate`, so configs select it by name (`get`, `from_config`).

  Args:
    name: the estimator's name.
    needs: the rollout.extras keys it reads; before the learner step, the extras provider
      registered for each key computes it (`jaxcredit.credit.extras`).
    settings: ``{name: default}`` of the providers' own hyperparameters (e.g. the
      Monte-Carlo `k`), accepted in an advantage config beside the estimator's keyword
      arguments and handed to the providers.
    overwrite: replace an earlier registration of `name`.

  Returns:
    The decorator (it returns `fn` unchanged).

  Raises:
    ValueError: for a name already registered without `overwrite`.

  Examples:
    >>> import jax.numpy as jnp
    >>> import jaxcredit as jc
    >>> @jc.estimators.register("doc_max_baseline")
    ... def max_baseline(rollout):
    ...   grouped = rollout.rewards.reshape(-1, rollout.group_size)
    ...   seq = (grouped - grouped.max(axis=1, keepdims=True)).reshape(-1)
    ...   return jc.estimators.broadcast_to_tokens(seq, rollout.mask)
    >>> rollout = jc.Rollout(tokens=jnp.zeros((2, 2), jnp.int32), mask=jnp.ones((2, 2), bool),
    ...                      rewards=jnp.array([1.0, 0.0]), group_size=2)
    >>> jc.estimators.get("doc_max_baseline")(rollout).advantages
    Array([[ 0.,  0.],
           [-1., -1.]], dtype=float32)
    >>> jc.estimators.REGISTRY.unregister("doc_max_baseline")
  """
  return REGISTRY.register(name, overwrite=overwrite, needs=tuple(needs),
                           settings=dict(settings or {}))


def token_level_rewards(rollout: Rollout) -> jnp.ndarray:
  """Per-token rewards: the outcome reward on each row's last action plus any dense
  ``rollout.token_rewards``.

  Args:
    rollout: a `Rollout`.

  Returns:
    float32 ``[B, T]``, 0 at masked positions.

  Examples:
    >>> from jaxcredit import demo, estimators
    >>> rollout = demo.sample_rollout()
    >>> estimators.token_level_rewards(rollout).sum(axis=1)  # the outcome reward of each row
    Array([1., 0., 0., 1., 1., 1., 1., 0.], dtype=float32)
  """
  rewards = group.outcome_to_tokens(rollout.rewards, rollout.mask)
  if rollout.token_rewards is not None:
    rewards += jnp.where(as_bool(rollout.mask), rollout.token_rewards, 0.0)
  return rewards


@register("grpo")
def _grpo(rollout: Rollout, *, eps: float = 1e-6, scale_by_std: bool = True):
  seq = group.grpo_advantages(
      rollout.rewards, group_size=rollout.group_size, eps=eps, scale_by_std=scale_by_std
  )
  return group.broadcast_to_tokens(seq, rollout.mask)


@register("dr_grpo")
def _dr_grpo(rollout: Rollout):
  return _grpo(rollout, scale_by_std=False)


@register("grpo_batch_std")
def _grpo_batch_std(rollout: Rollout, *, eps: float = 1e-6):
  seq = group.grpo_batch_std_advantages(rollout.rewards, group_size=rollout.group_size, eps=eps)
  return group.broadcast_to_tokens(seq, rollout.mask)


@register("remax", needs=("baseline_rewards",))
def _remax(rollout: Rollout):
  """Needs rollout.extras["baseline_rewards"] [B]: rewards of greedy responses."""
  baseline = rollout.extra("baseline_rewards", by="remax", per="sequence")
  return group.broadcast_to_tokens(group.remax_advantages(rollout.rewards, baseline), rollout.mask)


@register("opo")
def _opo(rollout: Rollout):
  lengths = jnp.sum(as_bool(rollout.mask), axis=1)
  seq = length_aware.opo_advantages(rollout.rewards, lengths, group_size=rollout.group_size)
  return group.broadcast_to_tokens(seq, rollout.mask)


@register("pass_at_k")
def _pass_at_k(rollout: Rollout, *, k: int | None = None):
  """k defaults to max(1, group_size // 2); an explicit k > group_size raises."""
  k = max(1, rollout.group_size // 2) if k is None else k
  seq = group_objectives.pass_at_k_advantages(rollout.rewards, group_size=rollout.group_size, k=k)
  return group.broadcast_to_tokens(seq, rollout.mask)


@register("gpg")
def _gpg(rollout: Rollout, *, scale_by_std: bool = False):
  seq = group.gpg_advantages(
      rollout.rewards, group_size=rollout.group_size, scale_by_std=scale_by_std
  )
  return group.broadcast_to_tokens(seq, rollout.mask)


@register("maxrl")
def _maxrl(rollout: Rollout):
  seq = group_objectives.maxrl_advantages(rollout.rewards, group_size=rollout.group_size)
  return group.broadcast_to_tokens(seq, rollout.mask)


@register("gdpo", needs=("reward_components",))
def _gdpo(rollout: Rollout, *, weights: tuple[float, ...] | None = None, eps: float = 1e-6):
  """Needs rollout.extras["reward_components"] [B, K]: each response's reward components."""
  components = rollout.extra("reward_components", by="gdpo", per="vector")
  seq = group.gdpo_advantages(components, group_size=rollout.group_size, weights=weights, eps=eps)
  return group.broadcast_to_tokens(seq, rollout.mask)


@register("lambda_grpo")
def _lambda_grpo(rollout: Rollout, *, lam: float = 1.0, r: float = 1.0, h_min: float = 1e-3,
                 eps: float = 1e-6):
  """lambda-GRPO with a fixed preference exponent `lam` (length_aware.lambda_grpo_advantages, the
  lengths counted on rollout.mask); lam = 0 is GRPO under token-mean aggregation."""
  lengths = jnp.sum(as_bool(rollout.mask), axis=1)
  seq = length_aware.lambda_grpo_advantages(rollout.rewards, lengths,
                                            group_size=rollout.group_size, lam=lam, r=r,
                                            h_min=h_min, eps=eps)
  return group.broadcast_to_tokens(seq, rollout.mask)


@register("lambda_grpo_learned", needs=("length_weights",),
          settings={"lam": 1.0, "r": 1.0, "lam_learning_rate": 0.01})
def _lambda_grpo_learned(rollout: Rollout, *, eps: float = 1e-6):
  """lambda-GRPO with a learnt exponent: GRPO's advantages times
  rollout.extras["length_weights"] [B], the weights under the lam its provider learns
  (credit.length_preference; settings lam, its start, r, and lam_learning_rate)."""
  weights = rollout.extra("length_weights", by="lambda_grpo_learned", per="sequence")
  seq = group.grpo_advantages(rollout.rewards, group_size=rollout.group_size, eps=eps)
  return group.broadcast_to_tokens(seq * weights.astype(jnp.float32), rollout.mask)


@register("rae", needs=("role_baselines",), settings={"decay": 0.95, "roles": 8})
def _rae(rollout: Rollout):
  """Role-conditioned advantage estimation (RAE): ``A = r - b_role`` on every token, with
  b_role an exponential moving average of the role's rewards over earlier batches
  (rollout.extras["role_baselines"] [B], its provider updating
  ``b <- decay b + (1 - decay) r_role``; one role without rollout.extras["roles"]).
  SPIRAL (Liu et al., 2025, arXiv 2506.24119)."""
  baselines = rollout.extra("role_baselines", by="rae", per="sequence")
  seq = rollout.rewards.astype(jnp.float32) - baselines.astype(jnp.float32)
  return group.broadcast_to_tokens(seq, rollout.mask)


def _tree(rollout: Rollout, by: str):
  """(path [B, S], segments [B, T]) of a tree rollout; ValueError naming `by` on a flat one."""
  if "tree_path" not in rollout.extras or "tree_segments" not in rollout.extras:
    raise ValueError(
        f"{by} needs a tree rollout: rollout.extras['tree_path'] and ['tree_segments'], which "
        "jaxcredit.sampling.sample_tree records (in the trainer: rollout.tree.fork = 'fixed' "
        f"or 'delimiter'); this rollout's extras are {sorted(rollout.extras)}.")
  return (rollout.extra("tree_path", by=by, per="vector"),
          rollout.extra("tree_segments", by=by))


@register("spo_tree")
def _spo_tree(rollout: Rollout):
  """V(n_k) - V(n_{k-1}) on segment k (`tree_credit.spo_tree_advantages`); needs a tree
  rollout (rollout.extras["tree_path"], ["tree_segments"])."""
  return tree_credit.spo_tree_advantages(rollout.rewards, *_tree(rollout, "spo_tree"),
                                         rollout.mask, group_size=rollout.group_size)


@register("treerl")
def _treerl(rollout: Rollout):
  """TreeRL's global plus local segment advantage (`tree_credit.treerl_advantages`); needs a
  tree rollout."""
  return tree_credit.treerl_advantages(rollout.rewards, *_tree(rollout, "treerl"), rollout.mask,
                                       group_size=rollout.group_size)


@register("tempo")
def _tempo(rollout: Rollout, *, eps: float = 1e-6):
  """GRPO plus the value step at each fork (`tree_credit.tempo_advantages`); needs a tree
  rollout."""
  return tree_credit.tempo_advantages(rollout.rewards, *_tree(rollout, "tempo"), rollout.mask,
                                      group_size=rollout.group_size, eps=eps)


@register("treepo")
def _treepo(rollout: Rollout, *, eps: float = 1e-8):
  """The reward relative to each subgroup sharing an ancestor, size-weighted and whitened
  (`tree_credit.treepo_advantages`); needs a tree rollout."""
  path, _ = _tree(rollout, "treepo")
  return tree_credit.treepo_advantages(rollout.rewards, path, rollout.mask,
                                       group_size=rollout.group_size, eps=eps)


@register("tree_grpo")
def _tree_grpo(rollout: Rollout, *, eps: float = 1e-6):
  """Intra-tree plus inter-tree normalised rewards (`tree_credit.tree_grpo_advantages`); needs
  a tree rollout."""
  path, _ = _tree(rollout, "tree_grpo")
  return tree_credit.tree_grpo_advantages(rollout.rewards, path, rollout.mask,
                                          group_size=rollout.group_size, eps=eps)


@register("rloo")
def _rloo(rollout: Rollout):
  seq = group.rloo_advantages(rollout.rewards, group_size=rollout.group_size)
  return group.broadcast_to_tokens(seq, rollout.mask)


@register("reinforce")
def _reinforce(rollout: Rollout, *, gamma: float = 1.0):
  ret = returns.discounted_returns(token_level_rewards(rollout), rollout.mask, gamma=gamma)
  return Estimate(advantages=ret, returns=ret)


@register("reinforce_pp")
def _reinforce_pp(rollout: Rollout, *, gamma: float = 1.0):
  """REINFORCE++ (Hu, 2025): batch-whitened discounted returns of the token
  rewards (outcome + any dense rewards such as a KL penalty)."""
  ret = returns.discounted_returns(token_level_rewards(rollout), rollout.mask, gamma=gamma)
  return Estimate(advantages=token_credit.whiten(ret, rollout.mask), returns=ret)


@register("reinforce_pp_baseline")
def _reinforce_pp_baseline(rollout: Rollout):
  """REINFORCE++-baseline (Hu, 2025): group-mean-centred outcome rewards,
  broadcast to tokens, then whitened over the batch."""
  centred = group.grpo_advantages(
      rollout.rewards, group_size=rollout.group_size, scale_by_std=False
  )
  return token_credit.whiten(group.broadcast_to_tokens(centred, rollout.mask), rollout.mask)
