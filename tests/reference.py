"""Independent float64 NumPy references, written as plain loops from the formulas."""

import numpy as np


def discounted_returns(rewards, mask, gamma):
  rewards, mask = np.asarray(rewards, np.float64), np.asarray(mask, bool)
  out = np.zeros_like(rewards)
  for b in range(rewards.shape[0]):
    running = 0.0
    for t in reversed(range(rewards.shape[1])):
      if mask[b, t]:
        running = rewards[b, t] + gamma * running
        out[b, t] = running
  return out


def gae(rewards, values, mask, gamma, lam):
  rewards, values = np.asarray(rewards, np.float64), np.asarray(values, np.float64)
  mask = np.asarray(mask, bool)
  adv = np.zeros_like(rewards)
  for b in range(rewards.shape[0]):
    valid = np.flatnonzero(mask[b])
    next_value, next_adv = 0.0, 0.0
    for t in valid[::-1]:
      delta = rewards[b, t] + gamma * next_value - values[b, t]
      adv[b, t] = delta + gamma * lam * next_adv
      next_value, next_adv = values[b, t], adv[b, t]
  returns = np.where(mask, adv + np.where(mask, values, 0.0), 0.0)
  return adv, returns


def grpo(rewards, group_size, eps=1e-6, scale_by_std=True):
  rewards = np.asarray(rewards, np.float64)
  out = np.zeros_like(rewards)
  if group_size == 1:
    return out
  for start in range(0, len(rewards), group_size):
    group = rewards[start : start + group_size]
    centred = group - group.mean()
    out[start : start + group_size] = (
        centred / (group.std(ddof=1) + eps) if scale_by_std else centred
    )
  return out


def rloo(rewards, group_size):
  rewards = np.asarray(rewards, np.float64)
  out = np.zeros_like(rewards)
  if group_size == 1:
    return out
  for i in range(len(rewards)):
    start = i - i % group_size
    others = [rewards[j] for j in range(start, start + group_size) if j != i]
    out[i] = rewards[i] - np.mean(others)
  return out


def log_softmax(logits):
  logits = np.asarray(logits, np.float64)
  shifted = logits - logits.max(-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def token_logprobs(logits, tokens, temperature=1.0):
  logp = log_softmax(np.asarray(logits, np.float64) / temperature)
  return np.take_along_axis(logp, np.asarray(tokens)[..., None], -1)[..., 0]


def token_entropy(logits):
  logp = log_softmax(logits)
  p = np.exp(logp)
  return -np.sum(np.where(p > 0, p * logp, 0.0), -1)


def aggregate(loss_tok, mask, mode, norm_len=None):
  loss_tok, mask = np.asarray(loss_tok, np.float64), np.asarray(mask, bool)
  loss = np.where(mask, loss_tok, 0.0)
  n_rows, n_cols = loss.shape
  if mode == "token-mean":
    return loss.sum() / mask.sum() if mask.sum() else 0.0
  if mode == "seq-mean-token-sum":
    return np.mean([loss[b].sum() for b in range(n_rows)])
  if mode == "seq-mean-token-mean":
    return np.mean([loss[b].sum() / mask[b].sum() if mask[b].any() else 0.0 for b in range(n_rows)])
  return loss.sum() / (n_rows * (norm_len or n_cols))


def ppo_clip_tokens(logp, old_logp, adv, clip_low, clip_high, dual_clip=None):
  logp, old_logp, adv = (np.asarray(x, np.float64) for x in (logp, old_logp, adv))
  out = np.zeros_like(logp)
  for idx in np.ndindex(logp.shape):
    ratio = np.exp(logp[idx] - old_logp[idx])
    a = adv[idx]
    loss = max(-a * ratio, -a * min(max(ratio, 1 - clip_low), 1 + clip_high))
    if dual_clip is not None and a < 0:
      loss = min(loss, -a * dual_clip)
    out[idx] = loss
  return out


def gspo(logp, old_logp, seq_adv, mask, clip_low, clip_high):
  total = 0.0
  for b in range(logp.shape[0]):
    valid = np.asarray(mask[b], bool)
    if not valid.any():
      continue
    log_ratio = np.asarray(logp[b], np.float64)[valid] - np.asarray(old_logp[b], np.float64)[valid]
    s = np.exp(log_ratio.mean())
    a = float(seq_adv[b])
    total += max(-a * s, -a * min(max(s, 1 - clip_low), 1 + clip_high))
  return total / logp.shape[0]


def kl(logp, ref_logp, kind):
  d = np.asarray(logp, np.float64) - np.asarray(ref_logp, np.float64)
  return {"k1": d, "k2": d**2 / 2, "k3": np.exp(-d) + d - 1}[kind]


def dpo(pc, pr, rc, rr, beta):
  logits = beta * ((np.asarray(pc, np.float64) - rc) - (np.asarray(pr, np.float64) - rr))
  return np.mean(np.log1p(np.exp(-logits)))


def _valid_rows(mask):
  return [np.flatnonzero(row) for row in np.asarray(mask, bool)]


def lambda_returns(rewards, values, mask, gamma, lam):
  out = np.zeros(np.shape(rewards))
  for b, valid in enumerate(_valid_rows(mask)):
    next_value, next_return = 0.0, 0.0
    for t in valid[::-1]:
      out[b, t] = rewards[b, t] + gamma * ((1 - lam) * next_value + lam * next_return)
      next_value, next_return = float(values[b, t]), out[b, t]
  return out


def n_step_returns(rewards, values, mask, n, gamma):
  out = np.zeros(np.shape(rewards))
  for b, valid in enumerate(_valid_rows(mask)):
    for i, t in enumerate(valid):
      steps = valid[i : i + n]
      total = sum(gamma**k * float(rewards[b, s]) for k, s in enumerate(steps))
      if i + n < len(valid):
        total += gamma**n * float(values[b, valid[i + n]])
      out[b, t] = total
  return out


def vtrace(rewards, values, mask, log_rhos, gamma, lam, clip_rho, clip_c):
  vs = np.zeros(np.shape(rewards))
  pg = np.zeros(np.shape(rewards))
  for b, valid in enumerate(_valid_rows(mask)):
    next_vs, next_value = 0.0, 0.0
    for t in valid[::-1]:
      ratio = np.exp(float(log_rhos[b, t]))
      rho, c = min(clip_rho, ratio), lam * min(clip_c, ratio)
      value, reward = float(values[b, t]), float(rewards[b, t])
      vs[b, t] = value + rho * (reward + gamma * next_value - value) + gamma * c * (next_vs - next_value)
      pg[b, t] = rho * (reward + gamma * (lam * next_vs + (1 - lam) * next_value) - value)
      next_vs, next_value = vs[b, t], value
  return vs, pg
