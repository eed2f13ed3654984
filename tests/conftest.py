"""Shared random inputs: ragged masks with interior holes and all-masked rows."""

import functools
import gc
import importlib.util
import os
import pathlib
import re
import sys
import tempfile
import uuid

import hypothesis
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).parent.parent

hypothesis.settings.register_profile(
    "jaxcredit", max_examples=25, deadline=None, derandomize=True,
    suppress_health_check=[hypothesis.HealthCheck.too_slow],
)
hypothesis.settings.load_profile("jaxcredit")

SHAPES = [(1, 1), (3, 7), (8, 16), (5, 33)]


def random_mask(rng: np.random.Generator, shape, *, holes: bool = True) -> np.ndarray:
  """Prompt prefix, ragged response end, interior holes, and (if B > 2) an all-masked row."""
  batch, length = shape
  mask = np.zeros(shape, bool)
  for b in range(batch):
    start = rng.integers(0, max(1, length // 3) + 1)
    end = rng.integers(start, length + 1)
    mask[b, start:end] = True
  if holes:
    mask &= rng.random(shape) > 0.15
  if batch > 2:
    mask[rng.integers(batch)] = False
  return mask


def random_rewards(batch: int, seed: int = 0, binary: bool = False) -> np.ndarray:
  """[batch] float32 rewards: 0/1 draws if `binary`, else standard normal."""
  rng = np.random.default_rng(seed)
  if binary:
    return rng.integers(0, 2, batch).astype(np.float32)
  return rng.normal(size=batch).astype(np.float32)


@functools.cache
def documentation() -> str:
  """The README and every page of the docs site, as one text."""
  pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
  return "\n".join(page.read_text() for page in pages if "_build" not in page.parts)


def doc_block(marker: str, language: str = "python") -> str:
  """The ```python (or `language`) block of the README or the docs containing `marker`
  (examples are executed by tests)."""
  blocks = re.findall(rf"```{language}\n(.*?)```", documentation(), re.S)
  return next(b for b in blocks if marker in b)


def load_experiment(name: str, *variant: str):
  """get_config(*variant) of experiments/<name>.py (e.g. "smoke" for `<name>.py:smoke`)."""
  spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(*variant)


def poison(x: np.ndarray, mask: np.ndarray, value=np.nan) -> np.ndarray:
  """x with `value` written at every masked position."""
  return np.where(mask, x, value).astype(x.dtype)


def pytest_configure(config):
  """One persistent JAX compilation cache for the test run, shared by the xdist workers and
  the CLI subprocesses the tests start (they inherit the environment): runs that build the
  same programs (same model and batch shapes) compile them once. Set before any test module
  imports jax."""
  _preload_jemalloc()
  worker = getattr(config, "workerinput", {})
  _pin_worker(worker)
  if hasattr(config.option, "loadscopereorder"):  # xdist: keep the files' order (below)
    config.option.loadscopereorder = False
  run = worker.get("testrunuid") or uuid.uuid4().hex
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                        str(pathlib.Path(tempfile.gettempdir()) / f"jaxcredit-jax-cache-{run}"))
  # Every program, however small: a test run compiles tens of thousands, many of them again in
  # the other worker or a subprocess, and reading one back costs less than compiling it (the
  # CLI and estimator test files run ~5% faster than with only those over 0.1 s kept; the
  # whole suite from a clean clone, 17 min 21 s against 17 min 28 s, hardly moves).
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
  # The tests' programs are small and compiled once: LLVM's optimisation passes cost more
  # time than they save (the suite runs ~25% faster without them), and XLA:CPU's older
  # fusion emitters compile small programs faster (eager ops ~40%), and one LLVM module per
  # program compiles faster than one split for parallel code generation (~20% less backend
  # compile time on the conformance kit's ~2,500 small programs). Semantics are unchanged;
  # speed is measured in bench/, which compiles with XLA's defaults.
  os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 "
                                     "--xla_cpu_use_fusion_emitters=false "
                                     "--xla_cpu_parallel_codegen_split_count=1")
  _startup()


def _startup() -> None:
  """The processes this one starts, and this one, collect garbage less often and lower many
  programs per MLIR context (tests/startup/sitecustomize.py, which this directory first on
  PYTHONPATH has every Python process import at its start)."""
  startup = str(ROOT / "tests" / "startup")
  if startup not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = python_path(startup)
  started = getattr(sys.modules.get("sitecustomize"), "__file__", None)
  if started is None or pathlib.Path(started).parent != pathlib.Path(startup):
    from tests.startup import sitecustomize  # this process started before PYTHONPATH held it

    sitecustomize.install()


def _preload_jemalloc() -> None:
  """Processes this one starts (xdist's workers, the CLI runs, the docs build) allocate with
  jemalloc where the machine has it (Debian's libjemalloc2, which .ci/run installs) and nothing
  else is preloaded: tracing, lowering and XLA's compiler allocate millions of short-lived
  objects, and glibc's malloc serves them ~6% slower (paired runs on one core each, same
  files: test_returns 56.2 and 54.6 s against 58.8 and 60.2 s; a lab test 27.6 and 26.9 s
  against 30.3 and 28.6 s)."""
  if os.environ.get("LD_PRELOAD"):  # set already (in a worker: inherited from the run)
    return
  import ctypes.util

  library = ctypes.util.find_library("jemalloc")  # runs `ldconfig -p`: once per run
  if library:
    os.environ["LD_PRELOAD"] = library


_RUN_CPUS: set[int] = set()  # the CPUs the run may use, before _pin_worker narrows a worker's


def _pin_worker(worker: dict) -> None:
  """Runs each xdist worker (`worker`: its workerinput, empty outside xdist), and the
  subprocesses it starts, on CPUs of its own (worker i of n on every n-th CPU from the i-th),
  where there are at least as many CPUs as workers. XLA:CPU sizes its thread pools by the CPUs
  a process may use: two workers sharing two cores each run pools of two, whose threads
  contend (test_batched beside test_cli_faults, each on one core: 128 s and 78 s against 137 s
  and 87 s sharing both; test_logprobs beside test_returns: 40 s and 42 s against 45 s and
  47 s)."""
  if not worker or not hasattr(os, "sched_setaffinity"):
    return
  cpus = sorted(os.sched_getaffinity(0))
  _RUN_CPUS.update(cpus)
  workers = worker["workercount"]
  if len(cpus) >= workers:
    os.sched_setaffinity(0, cpus[int(worker["workerid"].removeprefix("gw")) :: workers])


@pytest.fixture
def every_cpu():
  """The test's process on every CPU the run may use (for a test of work spread over the
  cores), back on its worker's own CPUs after."""
  if not hasattr(os, "sched_getaffinity"):
    yield
    return
  own = os.sched_getaffinity(0)
  os.sched_setaffinity(0, _RUN_CPUS or own)
  yield
  os.sched_setaffinity(0, own)


def xla_flags(*flags: str) -> str:
  """XLA_FLAGS for a subprocess: this run's flags and `flags`."""
  return " ".join([os.environ.get("XLA_FLAGS", ""), *flags]).strip()


def python_path(*paths) -> str:
  """PYTHONPATH for a subprocess: `paths` before this run's."""
  return os.pathsep.join(filter(None, [*map(str, paths), os.environ.get("PYTHONPATH")]))


@pytest.fixture(scope="session")
def cli_env() -> dict:
  """Environment for CLI subprocesses: this one, with the run's compilation cache."""
  return dict(os.environ)



def _memory_maps() -> int:
  """This process's memory mappings (Linux; 0 elsewhere)."""
  try:
    with open("/proc/self/maps") as maps:
      return sum(1 for _ in maps)
  except OSError:
    return 0


@functools.cache
def _map_limit() -> int:
  try:
    return int(pathlib.Path("/proc/sys/vm/max_map_count").read_text())
  except (OSError, ValueError):
    return 65530


def pytest_runtest_teardown(item, nextitem):
  """After a test file, drops JAX's compiled programs once this process holds half the
  kernel's memory-map limit: every executable XLA:CPU loads keeps a few mappings, and a
  worker that compiles ~10k programs reaches vm.max_map_count (65,530 by default), where
  XLA:CPU's next compilation crashes (a segmentation fault) instead of failing cleanly."""
  if nextitem is not None and nextitem.path == item.path:
    return
  if _memory_maps() > _map_limit() // 2:
    import jax

    jax.clear_caches()
    gc.collect()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
  """A test marked `backend_level(n)` (pytest_collection_modifyitems marks those
  `tests/backend_level_1.txt` lists: their programs run long) compiles at XLA's backend level
  n, setup and teardown included, in this process and those it starts."""
  del nextitem
  marker = item.get_closest_marker("backend_level")
  if marker is None:
    return (yield)
  from tests import backend_level

  with backend_level.compiling_at(*marker.args):
    return (yield)


def pytest_collection_modifyitems(config, items):
  """Marks the tests `tests/slow_tests.txt` lists (0.5 s or more on 2 cores) `slow` and those
  `tests/backend_level_1.txt` lists `backend_level(1)`, and orders the files longest first
  (`tests/file_seconds.txt`), a file's tests kept in their order: `--dist loadfile` then hands
  out the long files first, not by their number of tests (xdist's default, turned off in
  pytest_configure), which left a 2-minute file to run alone at the end."""
  del config
  from tests import backend_level, slow_tests
  slow, level_1 = slow_tests.read(), slow_tests.read(backend_level.LIST)
  for item in items:
    if item.nodeid in slow:
      item.add_marker(pytest.mark.slow)
    if item.nodeid in level_1:
      item.add_marker(pytest.mark.backend_level(1))
  seconds = slow_tests.read_file_seconds()
  items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], 0.0))
