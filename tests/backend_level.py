"""Tests whose programs compile at XLA's backend optimisation level 1 instead of the suite's 0.

The suite compiles at `--xla_backend_optimization_level=0` (tests/conftest.py): most of its
programs run once or a few times, and LLVM's optimisations cost more than they save. A few
tests run their programs long (hundreds of sampled turns, thousands of Monte-Carlo paths, SFT
before the check) and are faster with them. `backend_level_1.txt` lists those: the tests at
least `GAIN` of their seconds and `MIN_SECONDS` faster in a whole run at level 1 than in one at
0. conftest.py marks them `backend_level(1)` and compiles a marked test's programs, in its
process (`compiling_at`) and in the processes it starts (`XLA_FLAGS`), at level 1. Semantics
are unchanged: the level changes LLVM's code generation only. Regenerate the list from two
`--durations=0` reports of the whole suite:

  python -m pytest -q -n 2 --dist loadfile tests --durations=0 > level0.log
  XLA_FLAGS="--xla_backend_optimization_level=1 --xla_cpu_use_fusion_emitters=false \
    --xla_cpu_parallel_codegen_split_count=1" \
    python -m pytest -q -n 2 --dist loadfile tests --durations=0 > level1.log
  python -m tests.backend_level level0.log level1.log
"""

import contextlib
import os
import pathlib
import sys
from unittest import mock

from tests import slow_tests

LIST = pathlib.Path(__file__).with_name("backend_level_1.txt")
FLAG = "--xla_backend_optimization_level"
GAIN = 0.15
MIN_SECONDS = 1.0


def faster_at_level_1(level_0: str, level_1: str) -> list[str]:
  """The test ids at least GAIN of their level-0 seconds and MIN_SECONDS faster in the
  `--durations=0` report `level_1` than in `level_0`."""
  before, after = slow_tests.durations([level_0])[0], slow_tests.durations([level_1])[0]
  return sorted(test for test, seconds in before.items() if test in after and
                seconds - after[test] >= max(MIN_SECONDS, GAIN * seconds))


_LEVEL: list[int] = []  # the level `compiling_at` holds, innermost last


def _with_level(get_compile_options):
  """`jax._src.compiler.get_compile_options`, setting the backend level `compiling_at` holds."""

  def get_compile_options_at_level(*args, **kwargs):
    options = get_compile_options(*args, **kwargs)
    if _LEVEL:
      options.executable_build_options.debug_options.xla_backend_optimization_level = _LEVEL[-1]
    return options

  get_compile_options_at_level.at_level = True
  return get_compile_options_at_level


@contextlib.contextmanager
def compiling_at(level: int):
  """Within: this process compiles at XLA backend level `level` (the persistent compilation
  cache keys each program by its options), and the processes it starts read `level` last in
  their XLA_FLAGS (XLA reads the later of two values)."""
  from jax._src import compiler

  if not getattr(compiler.get_compile_options, "at_level", False):
    compiler.get_compile_options = _with_level(compiler.get_compile_options)
  flags = f"{os.environ.get('XLA_FLAGS', '')} {FLAG}={level}".strip()
  _LEVEL.append(level)
  try:
    with mock.patch.dict(os.environ, {"XLA_FLAGS": flags}):
      yield
  finally:
    _LEVEL.pop()


if __name__ == "__main__":  # the level-0 report, then the level-1 one
  level_0, level_1 = (pathlib.Path(path).read_text() for path in sys.argv[1:3])
  LIST.write_text("".join(f"{test}\n" for test in faster_at_level_1(level_0, level_1)))
