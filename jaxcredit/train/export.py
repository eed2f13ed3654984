"""Per-token export: a sample of a step's rollout, one row per token, as Parquet.

Every `export.every` RL steps the loop hands the `Exporter` the step's rollout and the
learner's state before and after the update; a background thread computes the credit of the
first `export.groups` groups (whole; every group when the batch has fewer) and writes
WORKDIR/tokens/step_<step>.parquet atomically (read the directory with one
`pandas.read_parquet(WORKDIR / "tokens")`). The training thread only queues the work: it
waits for an export only when the previous one is still running. In a multi-process run
every process computes the credit on the training thread, at the same point of its program
(collectives issued from a thread could interleave with the training step's differently on
each process), and process 0 gathers the rows and writes them in the background.

Schema (`SCHEMA_VERSION`; one row per real token, prompt tokens included, padding excluded)::

  step                int64    the metrics step of the update (SFT steps + RL steps)
  rl_step             int64    the RL update, 1-based
  group, sample       int32    the prompt's group in the batch, the response within the group
  position            int32    the token's column in the [P + N] row
  token_id            int32
  token               string   the token on its own (`TrainTask.token_texts`)
  is_action           bool     a policy action (the response's sampled tokens)
  reward              float32  the response's outcome reward
  behaviour_logprob   float32  log mu(y_t), as the sampler computed it   (null off actions)
  logprob             float32  log pi(y_t) under the parameters after the update   (null ...)
  entropy             float32  the sampler's entropy at the position   (null ...)
  ratio               float32  pi / mu = exp(logprob - behaviour_logprob)   (null ...)
  advantage           float32  the configured estimator's advantage A_t (0 off actions)
  advantage.<name>    float32  each `export.compare` estimator on the same batch, e.g.
                               advantage.oracle: the exact credit (lab tasks with an oracle)

The file's metadata holds `jaxcredit.schema`, `estimator` (the configured advantage as JSON),
`compare` (JSON list) and `task`. Every advantage is computed as the learner computes it:
`learner.prepare` (reference log-probs, critic values, KL shaping) under the parameters before
the update, on the whole batch (so batch-normalised estimators see what the learner saw).
"""

import concurrent.futures
import functools
import json
import pathlib
import sys
import time
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from jaxcredit import estimators
from jaxcredit.atomic import write_atomically
from jaxcredit.credit import extras
from jaxcredit.rollout import Rollout
from jaxcredit.train import learner

SCHEMA_VERSION = 1
DIRECTORY = "tokens"
TEXT_TOKENS = 64  # tokens per response in the TensorBoard text summary


def file_name(step: int) -> str:
  """The Parquet file of the export at a metrics step (under WORKDIR/tokens/).

  Args:
    step: the metrics step.

  Returns:
    e.g. 'step_00000012.parquet'.
  """
  return f"step_{step:08d}.parquet"


class Exporter:
  """Writes the per-token export of every `every`-th RL step off the training thread.

  Args:
    workdir: the run's directory (the export goes to WORKDIR/tokens).
    every: export every `every`-th RL step.
    groups: the groups of a batch exported.
    compare: names (or configs) of further estimators computed on the same batch; their
      rollout.extras are computed here (only on export steps) unless the run's own extras
      hold them already.
    graphdef: of the learner's modules dict (``nnx.split``).
    advantage: the run's advantage function.
    advantage_config: its config.
    settings: the learner's `Settings`.
    task: the run's `TrainTask`.
    mesh: the learner's mesh.
    temperature: the sampling temperature.
    tensorboard: a summary writer for the text summary, or None.
  """

  def __init__(self, workdir: pathlib.Path, *, every: int, groups: int, compare: Sequence,
               graphdef, advantage, advantage_config, settings: learner.Settings, task,
               mesh: jax.sharding.Mesh, temperature: float, tensorboard=None):
    self.directory = workdir / DIRECTORY
    self.every, self.groups, self.task, self.mesh = every, groups, task, mesh
    self.tensorboard = tensorboard
    self.compare = {_label(c): estimators.from_config(c) for c in compare}
    self.compare_extras = extras.chain(*(extras.hook(fn, temperature=temperature)
                                         for fn in self.compare.values()))
    self.metadata = {"jaxcredit.schema": str(SCHEMA_VERSION),
                     "estimator": json.dumps(advantage_config),
                     "compare": json.dumps(list(self.compare)), "task": task.name}
    self._graphdef = graphdef
    self._credit = jax.jit(functools.partial(_credit, graphdef, settings, advantage,
                                             self.compare))
    self._logprobs = nnx.jit(functools.partial(learner.reference_logprobs, settings=settings))
    self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                       thread_name_prefix="jaxcredit-export")
    self._pending: concurrent.futures.Future | None = None
    self.failures = 0  # exports that raised (reported, skipped)

  def due(self, rl_step: int) -> bool:
    """Whether update `rl_step` (0-based) is exported."""
    return self.every > 0 and (rl_step + 1) % self.every == 0

  def submit(self, *, step: int, rl_step: int, rollout: Rollout, examples: list, before,
             after, key: jax.Array) -> float:
    """Queues the export of update `rl_step` (0-based); `before` and `after`: the learner's
    modules' states around the update (snapshots: later updates must not change them).
    Returns the seconds the caller waited (for the previous export, if still running)."""
    started = time.perf_counter()
    self.wait()
    if jax.process_count() == 1:
      self._pending = self._pool.submit(self._export, step, rl_step, rollout, examples, before,
                                        after, key)
      return time.perf_counter() - started
    try:
      arrays = multihost_utils.process_allgather(
          self.arrays(rl_step, rollout, examples, before, after, key), tiled=True)
    except Exception as error:  # noqa: BLE001 - as in wait(): reported, skipped
      self._report(error)
      return time.perf_counter() - started
    if jax.process_index() == 0:
      self._pending = self._pool.submit(self._write, step, rl_step, arrays)
    return time.perf_counter() - started

  def wait(self) -> None:
    """Blocks until the queued export is written. An export that failed is reported on
    stderr and counted in `failures`; it never stops training."""
    if self._pending is not None:
      pending, self._pending = self._pending, None
      try:
        pending.result()
      except Exception as error:  # noqa: BLE001 - diagnostics must not cost training work
        self._report(error)

  def _report(self, error: Exception) -> None:
    self.failures += 1
    print(f"Warning: the per-token export failed ({type(error).__name__}: {error}); "
          "training continues without it.", file=sys.stderr, flush=True)

  def close(self) -> None:
    self.wait()
    self._pool.shutdown()

  def _export(self, step, rl_step, rollout, examples, before, after, key) -> None:
    arrays = self.arrays(rl_step, rollout, examples, before, after, key)
    self._write(step, rl_step, jax.device_get(arrays))

  def _write(self, step: int, rl_step: int, arrays: tuple) -> None:
    """Writes the Parquet file (and the TensorBoard text) of `arrays` (host `arrays()`)."""
    sample, logprobs, credit = arrays
    rows = min(self.groups * sample.group_size, sample.tokens.shape[0])
    sample, logprobs, credit = jax.tree.map(lambda x: x[:rows], (sample, logprobs, credit))
    columns = _token_columns(step, rl_step, sample, logprobs, credit, self.task.token_texts)
    write_parquet(self.directory / file_name(step), columns, self.metadata)
    if self.tensorboard is not None:
      self.tensorboard.add_text("tokens/credit", text_summary(columns), step)
      self.tensorboard.flush()

  def arrays(self, rl_step, rollout, examples, before, after, key) -> tuple:
    """(rollout, log-probs after the update, {column: advantages}) of the exported rows: the
    first `groups` groups, or, in a multi-process run, every row (the learner's batch, which
    every mesh divides; `_write` keeps the first groups)."""
    missing = any(needed not in rollout.extras for fn in self.compare.values()
                  for component in estimators.components(fn) for needed in component.needs)
    with jax.set_mesh(self.mesh):
      if self.compare_extras is not None and missing:
        model = nnx.merge(self._graphdef, before)["model"]
        context = extras.Context(self.task, model, examples, key, rl_step)
        computed, _ = self.compare_extras(context, rollout)
        rollout = rollout.replace(extras={**computed, **rollout.extras})
      credit = self._credit(before, rollout)
      rows = rollout.tokens.shape[0]
      if jax.process_count() == 1:
        rows = min(self.groups * rollout.group_size, rows)
      sample, credit = jax.tree.map(lambda x: x[:rows], (rollout, credit))
      return sample, self._logprobs(nnx.merge(self._graphdef, after)["model"], sample), credit


def _label(compare) -> str:
  """A column suffix for a compare entry: its name, or its config as compact JSON."""
  if isinstance(compare, str):
    return compare
  compare = dict(compare)
  return compare["name"] if set(compare) == {"name"} else json.dumps(compare, sort_keys=True)


def _credit(graphdef, settings, advantage, compare, state, rollout: Rollout) -> dict:
  """{"advantage": the run's [B, T] advantages, "advantage.<name>": each compare estimator's},
  on the rollout the learner prepares from `state`."""
  rollout = learner.prepare(nnx.merge(graphdef, state), rollout, settings)
  credit = {"advantage": advantage(rollout).advantages}
  credit.update({f"advantage.{name}": fn(rollout).advantages for name, fn in compare.items()})
  return credit


def _token_columns(step: int, rl_step: int, rollout: Rollout, logprobs: np.ndarray,
                   credit: dict, token_texts) -> dict:
  """One entry per real token of the rollout's rows (host arrays)."""
  tokens = np.asarray(rollout.tokens)
  valid = (np.ones_like(tokens, bool) if rollout.token_valid is None
           else np.asarray(rollout.token_valid, bool))
  row, position = np.nonzero(valid)
  action = np.asarray(rollout.mask, bool)[row, position]
  token_ids = tokens[row, position]
  on_action = lambda x: np.where(action, np.asarray(x, np.float32)[row, position], np.nan)
  behaviour = on_action(rollout.behaviour_logprobs)
  current = on_action(logprobs)
  entropy = (np.full(len(row), np.nan, np.float32) if rollout.entropy is None
             else on_action(rollout.entropy))
  distinct = np.unique(token_ids)
  texts = dict(zip(distinct.tolist(), token_texts(distinct)))
  return {
      "step": np.full(len(row), step, np.int64),
      "rl_step": np.full(len(row), rl_step + 1, np.int64),
      "group": (row // rollout.group_size).astype(np.int32),
      "sample": (row % rollout.group_size).astype(np.int32),
      "position": position.astype(np.int32),
      "token_id": token_ids.astype(np.int32),
      "token": [texts[i] for i in token_ids.tolist()],
      "is_action": action,
      "reward": np.asarray(rollout.rewards, np.float32)[row],
      "behaviour_logprob": behaviour,
      "logprob": current,
      "entropy": entropy,
      "ratio": np.exp(current - behaviour),
      **{name: np.where(action, np.asarray(a, np.float32)[row, position], 0.0).astype(np.float32)
         for name, a in credit.items()},
  }


def write_parquet(path: pathlib.Path, columns: dict, metadata: dict) -> None:
  """Writes columns as one Parquet file, atomically (NaN stored as null).

  Args:
    path: the file.
    columns: ``{name: values}``.
    metadata: the schema's key-value metadata.
  """
  import pyarrow as pa  # tensorflow-datasets depends on it; jaxcredit[view] names it
  import pyarrow.parquet as pq

  arrays = {name: pa.array(values, from_pandas=True) for name, values in columns.items()}
  table = pa.table(arrays).replace_schema_metadata(metadata)
  path.parent.mkdir(parents=True, exist_ok=True)
  write_atomically(path, lambda tmp: pq.write_table(table, str(tmp)))


def text_summary(columns: dict) -> str:
  """Markdown for TensorBoard: each exported response's first TEXT_TOKENS actions as
  ``token (advantage)``, with its reward.

  Args:
    columns: the export's columns (`Exporter`).

  Returns:
    the Markdown text.
  """
  lines = []
  keys = np.stack([columns["group"], columns["sample"]], axis=1)
  for group, sample in np.unique(keys, axis=0):
    where = (columns["group"] == group) & (columns["sample"] == sample) & columns["is_action"]
    picked = np.flatnonzero(where)[:TEXT_TOKENS]
    reward = columns["reward"][picked[0]] if len(picked) else float("nan")
    spans = " ".join(f"`{columns['token'][i]!r}` ({columns['advantage'][i]:+.3f})"
                     for i in picked)
    lines.append(f"**group {group} sample {sample}**, reward {reward:.3f}: {spans}")
  return "\n\n".join(lines)
