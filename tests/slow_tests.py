"""The test suite's slow tier: `slow_tests.txt` lists the tests that take 0.5 s or more on 2 CPU
cores (a phase's duration: setup, call or teardown), but the quickest of each file, and
conftest.py marks them `slow`, so `pytest -m "not slow"` is the fast tier. Regenerate the
list from a full run's durations:

  python -m pytest -q -n 2 --dist loadfile tests --durations=0 > durations.log
  python -m pytest -q -n 2 --dist loadfile tests -m "not slow" --durations=0 > fast.log
  python -m tests.slow_tests durations.log fast.log
"""

import collections
import pathlib
import re
import sys

LIST = pathlib.Path(__file__).with_name("slow_tests.txt")
SECONDS = 0.5
_DURATION = re.compile(r"^([0-9.]+)s (?:call|setup|teardown)\s+(\S.*?)\s*$")


def slow_ids(log: str, seconds: float = SECONDS) -> list[str]:
  """The test ids in a `--durations=0` report with a phase of `seconds` or more, less the
  quickest test of each file whose tests would all be slow (the fast tier runs every file)."""
  totals, slow = collections.Counter(), set()
  for m in filter(None, map(_DURATION.match, log.splitlines())):
    totals[m.group(2)] += float(m.group(1))
    if float(m.group(1)) >= seconds:
      slow.add(m.group(2))
  by_file = collections.defaultdict(list)
  for test in totals:
    by_file[test.split("::")[0]].append(test)
  for tests in by_file.values():
    if slow.issuperset(tests):
      slow.discard(min(tests, key=totals.__getitem__))
  return sorted(slow)


def read() -> frozenset[str]:
  return frozenset(LIST.read_text().splitlines()) if LIST.exists() else frozenset()


if __name__ == "__main__":  # one or more logs: a full run's, and the fast tier's own
  logs = "\n".join(pathlib.Path(path).read_text() for path in sys.argv[1:])
  LIST.write_text("\n".join(slow_ids(logs)) + "\n")
