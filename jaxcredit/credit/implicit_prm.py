"""PRIME's implicit process reward model, trained inside the RL loop.

PRIME (Cui et al., 2025, arXiv 2502.01456; recipe prime_dp_rm.py): pi_phi
starts as the policy at the first RL step and after scoring each batch takes
one Adam step on BCE(sigmoid(beta sum_t (log pi_phi - log pi_ref)), R), with
pi_ref the loop's frozen reference. The `prime` estimator reads its pre-update
log-probs as rollout.extras["prm_logprobs"].
"""

import jax.numpy as jnp
import optax
from flax import nnx

from jaxcredit import forward
from jaxcredit.models import sharding


class ImplicitPRM:
  """PRIME's implicit PRM as an extras provider: its parameters and optimizer live in this
  object.

  `start(policy)` makes phi a copy of the policy with a fresh optimizer (the first call does
  it with the policy it is given, unless `start` came first); `modules()` are what a
  checkpoint saves and restores, so a resumed run continues the same phi.

  Args:
    beta: the implicit reward's scale.
    learning_rate: the PRM's Adam rate.
    temperature: the sampling temperature its log-probs are taken at.

  References:
    Cui et al., 2025, "Process Reinforcement through Implicit Rewards", arXiv 2502.01456.
  """

  def __init__(self, *, beta: float = 0.05, learning_rate: float = 1e-4, temperature: float = 1.0):
    self.beta, self.learning_rate, self.temperature = beta, learning_rate, temperature
    self.prm = self.optimizer = None

  def start(self, policy) -> None:
    """phi <- a copy of `policy`, with a fresh Adam state."""
    self.prm = nnx.clone(policy)
    self.optimizer = nnx.Optimizer(self.prm, optax.adam(self.learning_rate), wrt=nnx.Param)

  def modules(self) -> dict:
    """{"prm", "prm_optimizer"} once started (empty before)."""
    return {} if self.prm is None else {"prm": self.prm, "prm_optimizer": self.optimizer}

  def __call__(self, task, model, rollout) -> tuple[dict, dict]:
    """({"prm_logprobs": [B, L]}, {"prm_loss": BCE}) on a rollout with ref_logprobs; one PRM
    update."""
    if self.prm is None:
      self.start(model)
    loss, logprobs = _prm_step(self.prm, self.optimizer, rollout, task.actions, self.beta,
                               self.temperature)
    return {"prm_logprobs": logprobs}, {"prm_loss": float(loss)}


def loss(prm, rollout, actions, beta: float, temperature: float):
  """PRIME's implicit-PRM loss on a rollout::

    BCE(sigmoid(beta sum_t (log pi_phi - log pi_ref)), R)

  Args:
    prm: the PRM, a `jaxcredit.models.Transformer`.
    rollout: a `Rollout` with ``ref_logprobs``.
    actions: the task's action restrictions.
    beta: the implicit reward's scale.
    temperature: the sampling temperature.

  Returns:
    ``(loss, logprobs)``: a float32 scalar, and the PRM's log-probs ``[B, L]``, 0 off the
    mask.
  """
  logprobs = forward.policy_outputs(prm, rollout, temperature, actions).logprobs
  valid = rollout.mask
  score = beta * jnp.sum(jnp.where(valid, logprobs - rollout.ref_logprobs, 0.0), axis=1)
  return (jnp.mean(optax.sigmoid_binary_cross_entropy(score, rollout.rewards)),
          jnp.where(valid, logprobs, 0.0))


def update(prm, optimizer, rollout, actions, beta: float, temperature: float):
  """One Adam step of the PRM on `loss`, in place. Traceable.

  Args:
    prm: the PRM, a `jaxcredit.models.Transformer`.
    optimizer: its `nnx.Optimizer`.
    rollout: a `Rollout` with ``ref_logprobs``.
    actions: the task's action restrictions.
    beta: the implicit reward's scale.
    temperature: the sampling temperature.

  Returns:
    ``(loss, logprobs)``: the BCE loss and the pre-update PRM log-probs ``[B, L]``.
  """
  (value, logprobs), grads = nnx.value_and_grad(loss, has_aux=True)(
      prm, rollout, actions, beta, temperature)
  optimizer.update(prm, grads)
  return value, logprobs


_prm_step = sharding.jit_in_place(update, static_argnums=(4, 5))
