"""The wall-times table of the credit study's results: every piece, run and write counted."""

import json
import subprocess

from studies.credit_study import wall_times


def _piece(arms: dict, spans: list, writers: list | None = None, **signature) -> dict:
  piece = {"signature": signature, "arms": arms, "spans": spans,
           "seconds": float(sum(end - start for start, end in spans)), "compile_seconds": 7.0}
  return piece if writers is None else {**piece, "writers": writers}


def test_every_piece_trainer_run_and_forecast_cell_is_timed(tmp_path):
  cells = tmp_path / "cells" / "peaked"
  cells.mkdir(parents=True)
  curves = lambda seeds: {"curves": {str(s): {} for s in seeds}, "learning_rate": 1e-3}
  # Three writes, the last two recorded: the first is the oldest, so it is the unrecorded one.
  (cells / "G8.json").write_text(json.dumps(_piece(
      {"grpo": curves(range(20)), "oracle": curves(range(10))},
      [[0, 600], [86_400, 87_000], [90_000, 90_300]],
      [{"preset": "primary", "compile_seconds": 3.0},
       {"preset": "entropy", "compile_seconds": 4.0}], seeds=list(range(20)))))
  (cells / "tuning.json").write_text(json.dumps(_piece(
      {"grpo": {"tuning_auc": {"0.001": 0.5, "0.01": 0.4}}, "fixed": {"tuning_auc": {}}},
      [[0, 120]], seeds=[100, 101, 102], learning_rates=[1e-3, 1e-2])))
  (tmp_path / "sweep_config.json").write_text(json.dumps({"preset": "small"}))
  (tmp_path / "primary").mkdir()
  (tmp_path / "primary" / "sweep_config.json").write_text(json.dumps({"preset": "primary"}))
  own = tmp_path / "stalls" / "cells" / "peaked"
  own.mkdir(parents=True)
  (own / "G8.json").write_text(json.dumps(_piece({"grpo": curves(range(40))}, [[0, 400]])))
  (tmp_path / "stalls" / "sweep_config.json").write_text(json.dumps({"preset": "stalls"}))
  (tmp_path / "trainers").mkdir()
  (tmp_path / "trainers" / "trainer_curves.json").write_text(json.dumps({"runs": {
      "32": {"grpo": {"0": {"seconds": 100.0}, "1": {"seconds": 140.0}}},
      "8": {"grpo": {"0": {"seconds": 50.0}}}}}))
  (tmp_path / "forecast" / "runs").mkdir(parents=True)
  (tmp_path / "forecast" / "runs" / "a_G4.json").write_text(json.dumps(
      {"curves": {"grpo": {"0": {}, "1": {}}, "oracle": {"0": {}, "1": {}}}, "seconds": 80.0}))

  out = tmp_path / "wall_times.md"
  wall_times.write(tmp_path, out)
  lines = out.read_text().splitlines()
  # 30 runs in 1,500 s: 50 s a run; the tuning's one tuned arm x 2 rates x 3 seeds.
  assert "| (results) | peaked | G8 | 2 | 30 | 3 | 1500 | 7 | 50.0 |" in lines
  assert "| (results) | peaked | tuning | 2 | 6 | 1 | 120 | 7 | 20.0 |" in lines
  assert "| stalls | peaked | G8 | 1 | 40 | 1 | 400 | 7 | 10.0 |" in lines
  write_line = next(line for line in lines if line.startswith("- (results)/cells/peaked/G8"))
  assert write_line.endswith("unrecorded 01-01 00:00 10.0 min; primary 01-02 00:00 10.0 min; "
                             "entropy 01-02 01:00 5.0 min")
  # Per folder: the runs, the summed seconds, the minutes while pieces ran (the union of spans).
  assert "| (results) | 36 | 1620 | 25 |" in lines and "| all | 76 | 2020 | |" in lines
  assert "`small`, `primary`" in out.read_text() and "`stalls`" not in out.read_text()
  assert lines.index("| 8 | grpo | 1 | 50 | 50 (50–50) |") < lines.index(
      "| 32 | grpo | 2 | 240 | 120 (100–140) |")
  assert "| held-out cells trained | 1 | 4 | 80 | 20.0 |" in lines


def test_writes_that_did_not_record_their_preset_are_split_by_the_commits_that_made_them(
    tmp_path):
  git = lambda *args: subprocess.run(["git", "-C", str(tmp_path), *args], check=True,
                                     capture_output=True)
  git("init", "-q")
  git("config", "user.email", "a@b.c")
  git("config", "user.name", "a")
  old = tmp_path / "old" / "G8.json"
  old.parent.mkdir()
  curves = lambda seeds: {"curves": {str(s): {} for s in seeds}, "learning_rate": 1e-3}
  versions = [  # (arms, spans, the commit's subject)
      ({"grpo": curves(range(10))}, [[0, 600]], "small preset"),
      ({"grpo": curves(range(20)), "prime": curves(range(10))}, [[0, 600], [86_400, 87_000],
                                                                 [90_000, 90_300]],
       "primary preset and ktae_prime"),
      ({"grpo": curves(range(20)), "prime_1e-3": curves(range(10))},
       [[0, 600], [86_400, 87_000], [90_000, 90_300]], "the prime arm renamed " + "x" * 200)]
  for i, (arms, spans, subject) in enumerate(versions):
    if i == 2:  # moved, as results moved into studies/
      git("mv", "old", "new")
      old = tmp_path / "new" / "G8.json"
    old.write_text(json.dumps(_piece(arms, spans)))
    git("add", "-A")
    git("commit", "-q", "-m", subject)
  lines = wall_times.committed_writes(old)
  assert lines[:2] == [
      '  - ' + lines[0][4:11] + ' (01-01 00:00, 10.0 min in 1 write): added grpo (0–9). '
      'Commit: "small preset"',
      '  - ' + lines[1][4:11] + ' (01-02 00:00, 15.0 min in 2 writes): added grpo (10–19), '
      'prime (0–9). Commit: "primary preset and ktae_prime"']
  assert lines[2].endswith('(time not recorded): added prime_1e-3 (0–9); removed prime. '
                           'Commit: "the prime arm renamed ' + "x" * 138 + '…"')
  assert len(lines) == 3
  # Outside a repository there is no history to read.
  outside = tmp_path.parent / f"{tmp_path.name}_outside.json"
  outside.write_text(old.read_text())
  assert wall_times.committed_writes(outside) == []
