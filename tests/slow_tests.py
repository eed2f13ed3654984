"""The test suite's slow tier: `slow_tests.txt` lists the tests that take 0.5 s or more on 2 CPU
cores (a phase's duration: setup, call or teardown) in any of the runs given, but the quickest
of each file where it takes under 5 s, and conftest.py marks them `slow`, so
`pytest -m "not slow"` is the fast tier. A test quick after its file's slow tests (their
compilations shared) may be slow without them, so the fast tier's own durations are read too.
`file_seconds.txt` holds each test file's seconds in those runs (the most of any run):
conftest.py runs the files longest first, so that under `--dist loadfile` no long file is
left to run alone at the end. Regenerate both:

  python -m pytest -q -n 2 --dist loadfile tests --durations=0 > durations.log
  python -m pytest -q -n 2 --dist loadfile tests -m "not slow" --durations=0 > fast.log
  python -m tests.slow_tests durations.log fast.log
"""

import collections
import pathlib
import re
import sys

LIST = pathlib.Path(__file__).with_name("slow_tests.txt")
FILE_SECONDS = pathlib.Path(__file__).with_name("file_seconds.txt")
SECONDS = 0.5
KEEP_SECONDS = 5.0
_DURATION = re.compile(r"^([0-9.]+)s (?:call|setup|teardown)\s+(\S.*?)\s*$")


def durations(logs: list[str]) -> tuple[collections.Counter, set[str]]:
  """Each test's seconds (its phases summed, the most of any log) and the tests with a phase
  of `SECONDS` or more."""
  longest, slow = collections.Counter(), set()
  for log in logs:
    totals = collections.Counter()
    for m in filter(None, map(_DURATION.match, log.splitlines())):
      totals[m.group(2)] += float(m.group(1))
      if float(m.group(1)) >= SECONDS:
        slow.add(m.group(2))
    for test, total in totals.items():
      longest[test] = max(longest[test], total)
  return longest, slow


def slow_ids(logs: list[str], keep: float = KEEP_SECONDS) -> list[str]:
  """The test ids with a phase of `SECONDS` or more in any `--durations=0` report of `logs`,
  less the quickest test of each file whose tests would all be slow, where that test takes
  under `keep` seconds (a file whose every test needs a costly fixture stays out of the fast
  tier)."""
  longest, slow = durations(logs)
  by_file = collections.defaultdict(list)
  for test in longest:
    by_file[test.split("::")[0]].append(test)
  for tests in by_file.values():
    quickest = min(tests, key=longest.__getitem__)
    if slow.issuperset(tests) and longest[quickest] < keep:
      slow.discard(quickest)
  return sorted(slow)


def file_seconds(logs: list[str]) -> dict[str, float]:
  """{test file: seconds} in `logs` (per log, its tests' seconds summed; the most of any)."""
  seconds = collections.Counter()
  for log in logs:
    per_file = collections.Counter()
    for test, total in durations([log])[0].items():
      per_file[test.split("::")[0]] += total
    for path, total in per_file.items():
      seconds[path] = max(seconds[path], round(total, 1))
  return dict(sorted(seconds.items()))


def read(path: pathlib.Path = LIST) -> frozenset[str]:
  """The test ids a list file (`slow_tests.txt` by default) holds, one a line (none if absent)."""
  return frozenset(path.read_text().splitlines()) if path.exists() else frozenset()


def read_file_seconds() -> dict[str, float]:
  """{test file: seconds} of `file_seconds.txt` (empty if absent)."""
  if not FILE_SECONDS.exists():
    return {}
  return {path: float(seconds) for seconds, path in
          (line.split(maxsplit=1) for line in FILE_SECONDS.read_text().splitlines())}


if __name__ == "__main__":  # one or more logs: a full run's, and the fast tier's own
  logs = [pathlib.Path(path).read_text() for path in sys.argv[1:]]
  LIST.write_text("\n".join(slow_ids(logs)) + "\n")
  FILE_SECONDS.write_text("".join(f"{seconds} {path}\n"
                                  for path, seconds in file_seconds(logs).items()))
