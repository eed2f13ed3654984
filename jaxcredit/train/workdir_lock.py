"""One training process per workdir (per process index of a multi-process run).

An exclusive `fcntl.flock` on WORKDIR/.lock (WORKDIR/.lock.process-I for
process I > 0 of a multi-process run), held for the whole run. The
kernel releases it when the process exits, however it exits (kill -9
included), so a stale lock never blocks a rerun. The file records the
holder's host and PID so that a second process can say who holds it.
Requires a filesystem with POSIX locks (local disks, most NFS mounts);
object-store paths such as gs:// are not supported as workdirs.
"""

import fcntl
import os
import pathlib
import socket


class WorkdirBusy(RuntimeError):
  """Another process holds the workdir's lock."""


class WorkdirLock:
  """A lock on a workdir: ``with WorkdirLock(workdir): ...``.

  Args:
    workdir: the run's directory.
    process_index: this process's index (each process holds its own lock file).

  Raises:
    WorkdirBusy: on entering, naming the holder's host and PID.
  """

  def __init__(self, workdir: pathlib.Path, process_index: int = 0):
    name = ".lock" if process_index == 0 else f".lock.process-{process_index}"
    self.path = pathlib.Path(workdir) / name
    self.file = None

  def __enter__(self) -> "WorkdirLock":
    file = open(self.path, "a+")
    try:
      fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      file.seek(0)
      holder = file.read().strip() or "another process"
      file.close()
      raise WorkdirBusy(
          f"{self.path.parent} is in use by {holder}; one training process per workdir "
          "(wait for it to finish or stop it, or use another --workdir).") from None
    file.seek(0)
    file.truncate()
    file.write(f"host {socket.gethostname()} pid {os.getpid()}\n")
    file.flush()
    self.file = file
    return self

  def __exit__(self, *exc_info) -> None:
    fcntl.flock(self.file, fcntl.LOCK_UN)
    self.file.close()
