"""The slow tier's list (tests/slow_tests.py) and the backend-level list (tests/backend_level.py)
from `--durations=0` reports."""

import os

from tests import backend_level, slow_tests

FULL = """
0.80s call     tests/a.py::test_slow
0.10s setup    tests/a.py::test_quick
0.60s call     tests/b.py::test_one
0.70s call     tests/b.py::test_two
9.00s setup    tests/c.py::test_fixture_user
6.00s call     tests/c.py::test_other
(12 durations < 0.005s hidden.)
"""
FAST = """
0.40s setup    tests/a.py::test_quick
0.30s call     tests/a.py::test_quick
"""


def test_a_phase_of_half_a_second_in_any_run_is_slow_but_each_file_keeps_its_quickest_test():
  assert slow_tests.slow_ids([FULL]) == ["tests/a.py::test_slow", "tests/b.py::test_two",
                                         "tests/c.py::test_fixture_user", "tests/c.py::test_other"]
  # Quick after its file's slow tests, 0.7 s alone: slow too (0.4 s and 0.3 s phases are not,
  # their 0.7 s total decides which of a file's tests is quickest).
  assert "tests/a.py::test_quick" not in slow_tests.slow_ids([FULL, FAST])
  # At 0.6 s it is slow, and the quickest of its file's tests (0.8 s against 0.9 s) is kept.
  slow = slow_tests.slow_ids([FULL, FAST.replace("0.40s", "0.60s")])
  assert "tests/a.py::test_quick" in slow and "tests/a.py::test_slow" not in slow


def test_a_file_whose_quickest_test_takes_5_s_or_more_leaves_the_fast_tier():
  assert "tests/c.py::test_other" in slow_tests.slow_ids([FULL])
  assert "tests/c.py::test_other" not in slow_tests.slow_ids([FULL], keep=7.0)


def test_file_seconds_are_each_files_tests_summed_the_most_of_any_run():
  assert slow_tests.file_seconds([FULL, FAST]) == {"tests/a.py": 0.9, "tests/b.py": 1.3,
                                                  "tests/c.py": 15.0}


def test_tests_faster_by_15_percent_and_a_second_at_level_1_compile_there():
  level_1 = FULL.replace("0.80s", "0.60s").replace("9.00s", "7.50s").replace("6.00s", "5.50s")
  # a: 0.8 -> 0.6 s is under a second; c's fixture user 9 -> 7.5 s is 1.5 s and 17%; c's
  # other test 6 -> 5.5 s is 8%.
  assert backend_level.faster_at_level_1(FULL, level_1) == ["tests/c.py::test_fixture_user"]


def test_compiling_at_sets_the_backend_level_here_and_for_started_processes(monkeypatch):
  from jax._src import compiler

  def level():
    options = compiler.get_compile_options(num_replicas=1, num_partitions=1)
    return options.executable_build_options.debug_options.xla_backend_optimization_level

  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_fusion_emitters=false")
  before = level()  # as XLA read XLA_FLAGS at the process's start
  with backend_level.compiling_at(1):
    assert level() == 1
    assert os.environ["XLA_FLAGS"] == ("--xla_cpu_use_fusion_emitters=false "
                                       "--xla_backend_optimization_level=1")
    with backend_level.compiling_at(2):
      assert level() == 2
    assert level() == 1
  assert level() == before
  assert os.environ["XLA_FLAGS"] == "--xla_cpu_use_fusion_emitters=false"
