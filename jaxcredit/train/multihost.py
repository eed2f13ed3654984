"""One run on several processes: joining them, and letting process 0 prepare what the
others then read (the task's data).

  multihost.connect(config.mesh)                      # jax.distributed.initialize
  task = multihost.process_0_first(lambda: tasks.make(...))
"""

from collections.abc import Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

PREPARATION_TIMEOUT_S = 3600  # how long other processes wait for process 0's data


def connect(mesh) -> None:
  """Joins the processes of a multi-host run (`jax.distributed.initialize`).

  Args:
    mesh: ``config.mesh`` (coordinator_address, num_processes, process_id).

  Raises:
    ValueError: naming those settings when the cluster cannot be detected or joined.
  """
  settings = {field: mesh[field] for field in ("coordinator_address", "num_processes",
                                                "process_id")}
  try:
    jax.distributed.initialize(**settings)
  except (ValueError, RuntimeError) as error:
    given = ", ".join(f"mesh.{k} = {v!r}" for k, v in settings.items())
    raise ValueError(
        f"mesh.distributed = True could not join the processes ({error}); with {given}. "
        "Outside a cluster jax detects (TPU pods, SLURM, ...), set "
        "--config.mesh.coordinator_address=HOST:PORT (process 0's), "
        "--config.mesh.num_processes and --config.mesh.process_id on every process.") from None


def process_0_first(make: Callable):
  """make() on process 0, then, after every process has reached this point, on the others
  (which then find what process 0 wrote).

  Args:
    make: ``make() -> result``, e.g. building the task's data on the shared filesystem.

  Returns:
    this process's make().

  Raises:
    ValueError: on every process, with its message, when process 0's make() raises
      ValueError (no process waits for the others).
  """
  if jax.process_count() == 1:
    return make()
  first, refusal = jax.process_index() == 0, None
  try:
    result = make() if first else None
  except ValueError as error:
    refusal = error
  # The coordination service's barrier, not a device collective: its timeout is ours.
  ocp.multihost.get_barrier_sync_fn()(key="jaxcredit: process 0 done",
                                      timeout_ms=PREPARATION_TIMEOUT_S * 1000)
  message = _from_process_0(str(refusal) if refusal else "")
  if refusal:
    raise refusal
  if message:
    raise ValueError(message)
  return result if first else make()


def _from_process_0(text: str, size: int = 4096) -> str:
  """Process 0's `text` (at most `size` UTF-8 bytes) on every process."""
  data = np.zeros(size, np.uint8)
  encoded = text.encode()[:size]
  data[:len(encoded)] = np.frombuffer(encoded, np.uint8)
  data = multihost_utils.broadcast_one_to_all(data)
  return bytes(np.asarray(data)).rstrip(b"\0").decode(errors="replace")
