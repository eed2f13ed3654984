"""Where the test suite's time goes: a pytest plugin that records, for each test, its seconds
and what JAX spent in the test's process making programs (tracing to a jaxpr, lowering to
StableHLO, XLA's backend compile), how many programs it compiled and how many of them the
persistent compilation cache held, from `jax.monitoring`'s events. CLI subprocesses a test
starts are not counted: their time is the test's "other" seconds, as execution is. Run the
suite with it, then read the files' table:

  python -m pytest -q -n 2 --dist loadfile -p tests.compile_profile tests
  python -m tests.compile_profile

Each worker process appends one JSON line per test to a file of its own in
$JAXCREDIT_COMPILE_PROFILE (default: jaxcredit-compile-profile under the temporary
directory); `python -m tests.compile_profile [DIR]` reads them all.
"""

import collections
import dataclasses
import json
import os
import pathlib
import sys
import tempfile
import time

import pytest

STAGES = {"/jax/core/compile/jaxpr_trace_duration": "trace",
          "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
          "/jax/core/compile/backend_compile_duration": "compile"}
CACHE_HIT = "/jax/compilation_cache/cache_hits"


def directory() -> pathlib.Path:
  """Where the records are written and read."""
  return pathlib.Path(os.environ.get("JAXCREDIT_COMPILE_PROFILE") or
                      pathlib.Path(tempfile.gettempdir()) / "jaxcredit-compile-profile")


@dataclasses.dataclass
class Recorder:
  """The seconds of each compile stage, the programs compiled and the persistent-cache hits
  since the last `reset`, from the `jax.monitoring` listeners `start` registers."""

  seconds: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  programs: int = 0
  cache_hits: int = 0

  def _on_duration(self, event: str, duration: float, **kwargs) -> None:
    del kwargs
    if event in STAGES:
      self.seconds[STAGES[event]] += duration
      self.programs += STAGES[event] == "compile"

  def _on_event(self, event: str, **kwargs) -> None:
    del kwargs
    self.cache_hits += event == CACHE_HIT

  def start(self) -> None:
    from jax import monitoring
    monitoring.register_event_duration_secs_listener(self._on_duration)
    monitoring.register_event_listener(self._on_event)

  def stop(self) -> None:
    from jax import monitoring
    monitoring.unregister_event_duration_listener(self._on_duration)
    monitoring.unregister_event_listener(self._on_event)

  def reset(self) -> None:
    self.seconds.clear()
    self.programs = self.cache_hits = 0

  def record(self, test: str, seconds: float) -> dict:
    """This test's record, its stages rounded to the millisecond."""
    return {"test": test, "seconds": round(seconds, 3),
            **{stage: round(self.seconds[stage], 3) for stage in STAGES.values()},
            "programs": self.programs, "cache_hits": self.cache_hits}


_RECORDER = Recorder()
_OUT = []


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
  """Listens once conftest.py has set the run's environment (jax is imported after it); the
  run's first process (xdist's controller, which starts the workers) clears the last run's
  records."""
  directory().mkdir(parents=True, exist_ok=True)
  if not hasattr(config, "workerinput"):
    for old in directory().glob("*.jsonl"):
      old.unlink()
  _RECORDER.start()
  _OUT.append(open(directory() / f"{os.getpid()}.jsonl", "a"))  # noqa: SIM115 (the run's)


def pytest_unconfigure(config):
  del config
  _RECORDER.stop()
  while _OUT:
    _OUT.pop().close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  del nextitem
  _RECORDER.reset()
  started = time.perf_counter()
  yield
  _OUT[0].write(json.dumps(_RECORDER.record(item.nodeid, time.perf_counter() - started)) + "\n")
  _OUT[0].flush()


def by_file(records: list[dict]) -> dict[str, dict]:
  """Each test file's sums of its tests' records."""
  files = collections.defaultdict(collections.Counter)
  for record in records:
    files[record["test"].split("::")[0]].update(
        {key: value for key, value in record.items() if key != "test"})
  return dict(files)


def table(records: list[dict], top: int = 40) -> str:
  """The `top` files by seconds, with the whole run's sums first: seconds, the compile
  stages, the seconds left (execution, Python, subprocesses), programs and cache hits."""
  files = by_file(records)
  total = sum(files.values(), collections.Counter())
  header = (f"{'seconds':>8} {'trace':>7} {'lower':>7} {'compile':>8} {'other':>8} "
            f"{'programs':>8} {'hits':>6}  file")
  rows = [header]
  for name, sums in [("(all)", total), *sorted(files.items(), key=lambda kv: -kv[1]["seconds"])
                                        [:top]]:
    other = sums["seconds"] - sum(sums[stage] for stage in STAGES.values())
    rows.append(f"{sums['seconds']:8.1f} {sums['trace']:7.1f} {sums['lower']:7.1f} "
                f"{sums['compile']:8.1f} {other:8.1f} {sums['programs']:8d} "
                f"{sums['cache_hits']:6d}  {name}")
  return "\n".join(rows)


def read(path: pathlib.Path) -> list[dict]:
  """Every record under `path`."""
  return [json.loads(line) for log in sorted(path.glob("*.jsonl"))
          for line in log.read_text().splitlines() if line.strip()]


if __name__ == "__main__":
  found = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else directory()
  records = read(found)
  if not records:
    sys.exit(f"No records in {found}: run pytest with -p tests.compile_profile first.")
  print(table(records))
