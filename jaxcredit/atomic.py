"""Atomic file writes: a reader, or a crash, sees the old file or the new one, never a part."""

import os
import pathlib
from collections.abc import Callable


def write_atomically(path: pathlib.Path, write: Callable[[pathlib.Path], object]) -> None:
  """Calls `write(temporary)` with a temporary path beside `path`, then renames it to `path`.

  Args:
    path: the file to write.
    write: writes the whole file to the path it is given.

  Examples:
    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "config.json"
    >>> write_atomically(path, lambda tmp: tmp.write_text("{}"))
    >>> path.read_text()
    '{}'
  """
  temporary = path.with_name(f".{path.name}.tmp")
  write(temporary)
  os.replace(temporary, path)
