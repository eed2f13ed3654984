"""The wall time of every run the credit study's committed results hold, on the CPU that
trained them:

  python -m studies.credit_study.wall_times studies/credit_study/results \\
      --out studies/credit_study/results/wall_times.md

reads, under the results folder,
  <dir>/cells/<regime>/{tuning,G<g>}.json   the sweep's pieces: the runs of a piece share
                                            one compiled program (vmapped), so a run's time
                                            is the piece's seconds over its runs
  trainers/trainer_curves.json              jaxcredit.train's runs, one process each
  forecast/points/*/G<g>.json, runs/*.json  the forecast's measurements and its trained cells

A piece that several presets extended (the G = 8 cells of `cells/`) lists each write's
minutes; a write records the preset that made it (`sweep`'s "writers"). Writes made before
that was recorded are split by the repository's history instead: each commit that changed
the piece, with the spans and the runs it added and its subject, which names the preset.
"""

import argparse
import datetime
import json
import pathlib
import subprocess

from studies.credit_study import tables


def piece_runs(piece: dict) -> int:
  """The runs a sweep piece holds: a cell's curves, or a tuning's arms x rates x seeds."""
  arms = piece["arms"].values()
  if all("curves" in arm for arm in arms):
    return sum(len(arm["curves"]) for arm in arms)
  tuned = sum(1 for arm in arms if arm.get("tuning_auc"))
  return tuned * len(piece["signature"]["learning_rates"]) * len(piece["signature"]["seeds"])


def _utc(seconds: float) -> str:
  """A span's start as "MM-DD HH:MM" (UTC)."""
  return f"{datetime.datetime.fromtimestamp(seconds, datetime.UTC):%m-%d %H:%M}"


def writes(piece: dict) -> list[str]:
  """Each write of a piece: "<preset> <date> <minutes> min" (preset "unrecorded" for writes
  made before the sweep recorded it)."""
  writers = piece.get("writers") or []
  named = ["unrecorded"] * (len(piece["spans"]) - len(writers)) + [w["preset"] for w in writers]
  return [f"{preset} {_utc(start)} {(end - start) / 60:.1f} min"
          for preset, (start, end) in zip(named, piece["spans"])]


def _seed_ranges(seeds) -> str:
  """"0–9, 12" for {0, ..., 9, 12}."""
  ordered, ranges = sorted(seeds), []
  for seed in ordered:
    if ranges and seed == ranges[-1][1] + 1:
      ranges[-1][1] = seed
    else:
      ranges.append([seed, seed])
  return ", ".join(f"{a}–{b}" if b > a else f"{a}" for a, b in ranges)


def _versions(path: pathlib.Path) -> list[tuple[str, str, dict]]:
  """(commit, subject, the piece) for each commit that changed `path`, oldest first,
  following renames; [] where `path` is not in a git repository."""
  try:
    log = subprocess.run(
        ["git", "-c", "diff.renameLimit=1000000", "log", "--follow", "--format=%x00%H%x09%s",
         "--name-only", "--", path.name],  # newest first: --reverse does not --follow
        cwd=path.parent, capture_output=True, text=True, check=True).stdout
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=path.parent,
                         capture_output=True, text=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return []
  versions = []
  for entry in reversed(list(filter(None, log.split("\0")))):
    header, *names = [line for line in entry.splitlines() if line]
    commit, _, subject = header.partition("\t")
    shown = subprocess.run(["git", "show", f"{commit}:{names[-1]}"], cwd=top,
                           capture_output=True, text=True, check=False)
    if shown.returncode == 0:
      versions.append((commit, subject, json.loads(shown.stdout)))
  return versions


SUBJECT = 160  # characters of a commit's subject quoted


def committed_writes(path: pathlib.Path) -> list[str]:
  """A piece's writes by commit: for each commit that added runs or spans to it, the date
  and minutes of those spans, the runs it added (arm: seeds) and the commit's subject."""
  lines, before = [], {}
  for commit, subject, piece in _versions(path):
    spans = piece.get("spans", [])[len(before.get("spans", [])):]
    added, earlier = [], before.get("arms", {})
    for arm, result in piece.get("arms", {}).items():
      seeds = set(map(int, result.get("curves", {}))) - set(
          map(int, earlier.get(arm, {}).get("curves", {})))
      if seeds:
        added.append(f"{arm} ({_seed_ranges(seeds)})")
      elif arm not in earlier:
        added.append(arm)  # a tuning's arm
    removed = [arm for arm in earlier if arm not in piece.get("arms", {})]
    if spans or added or removed:
      when = "time not recorded"
      if spans:
        minutes = sum(end - begin for begin, end in spans) / 60
        when = f"{_utc(spans[0][0])}, {minutes:.1f} min in {len(spans)} write" + "s" * (
            len(spans) > 1)
      lines.append(f"  - {commit[:7]} ({when}): added {', '.join(added) or 'no runs'}"
                   + (f"; removed {', '.join(removed)}" if removed else "")
                   + f". Commit: \"{subject[:SUBJECT] + '…' * (len(subject) > SUBJECT)}\"")
    before = piece
  return lines


def sweep_rows(root: pathlib.Path) -> tuple[list[str], dict]:
  """The table of sweep pieces under `root` and {folder: (runs, seconds, busy seconds)}."""
  lines = ["| folder | regime | piece | arms | runs | writes | seconds | compiling | s a run |",
           "|---|---|---|---|---|---|---|---|---|"]
  folders, multi = {}, []
  for path in sorted(root.glob("**/cells/*/*.json")):
    folder = path.parent.parent.parent.relative_to(root).as_posix()
    folder = "(results)" if folder == "." else folder
    piece = json.loads(path.read_text())
    runs = piece_runs(piece)
    if not runs:
      continue
    seconds = piece["seconds"]
    lines.append(f"| {folder} | {path.parent.name} | {path.stem} | {len(piece['arms'])} | "
                 f"{runs} | {len(piece['spans'])} | {seconds:.0f} | "
                 f"{piece['compile_seconds']:.0f} | {seconds / runs:.1f} |")
    total = folders.setdefault(folder, {"runs": 0, "seconds": 0.0, "spans": []})
    total["runs"] += runs
    total["seconds"] += seconds
    total["spans"] += piece["spans"]
    if len(piece["spans"]) > 1:
      multi.append(f"- {folder}/cells/{path.parent.name}/{path.name}: " + "; ".join(writes(piece)))
      if len(piece["spans"]) > len(piece.get("writers") or []):
        multi += committed_writes(path)
  return lines + ["", "Pieces written more than once (each write, UTC, its minutes; where a "
                  "write did not record its preset, each commit that wrote the piece: the "
                  "runs it added, arm (seeds), and its subject, which names the preset):", "",
                  *multi], folders


def trainer_rows(root: pathlib.Path) -> list[str]:
  """A row per (G, arm) of jaxcredit.train's runs in trainers/trainer_curves.json."""
  path = root / "trainers" / "trainer_curves.json"
  if not path.exists():
    return []
  lines = ["| G | arm | runs | seconds | s a run (min–max) |", "|---|---|---|---|---|"]
  for g, by_arm in sorted(json.loads(path.read_text())["runs"].items(), key=lambda i: int(i[0])):
    for arm, runs in by_arm.items():
      seconds = [run["seconds"] for run in runs.values()]
      lines.append(f"| {g} | {arm} | {len(seconds)} | {sum(seconds):.0f} | "
                   f"{sum(seconds) / len(seconds):.0f} ({min(seconds):.0f}–{max(seconds):.0f}) |")
  return lines


def forecast_rows(root: pathlib.Path) -> list[str]:
  """Rows for the forecast's measurement pieces and its trained cells (one row per kind)."""
  points = [json.loads(p.read_text()) for p in sorted(root.glob("forecast/points/*/G*.json"))]
  cells = [json.loads(p.read_text()) for p in sorted(root.glob("forecast/runs/*.json"))]
  lines = ["| what | pieces | runs | seconds | s a run |", "|---|---|---|---|---|"]
  if points:
    seconds = sum(p["seconds"] for p in points)
    lines.append(f"| measurements (no training) | {len(points)} |  | {seconds:.0f} |  |")
  if cells:
    runs = sum(len(seeds) for cell in cells for seeds in cell["curves"].values())
    seconds = sum(cell["seconds"] for cell in cells)
    lines.append(f"| held-out cells trained | {len(cells)} | {runs} | {seconds:.0f} | "
                 f"{seconds / runs:.1f} |")
  return lines if len(lines) > 2 else []


def sharing_presets(root: pathlib.Path) -> list[str]:
  """The presets whose sweeps wrote into ROOT/cells: ROOT's own and those of the folders
  that hold a sweep_config.json but no cells of their own (their pieces are ROOT's)."""
  configs = [root / "sweep_config.json", *sorted(root.glob("*/sweep_config.json"))]
  return [json.loads(c.read_text())["preset"] for c in configs
          if c.exists() and (c.parent == root or not (c.parent / "cells").exists())]


def write(root: pathlib.Path, out: pathlib.Path) -> None:
  """OUT (markdown) from the results under ROOT."""
  sweep_lines, folders = sweep_rows(root)
  shared = sharing_presets(root)
  total = ["| folder | runs | seconds summed | minutes while pieces ran |", "|---|---|---|---|",
           *[f"| {folder} | {t['runs']} | {t['seconds']:.0f} | "
             f"{tables.busy_seconds(t['spans']) / 60:.0f} |" for folder, t in folders.items()],
           f"| all | {sum(t['runs'] for t in folders.values())} | "
           f"{sum(t['seconds'] for t in folders.values()):.0f} | |"]
  lines = [
      "# Wall times of the credit study's runs",
      "",
      "Every run behind the committed results, on the machine each report's header names "
      "(a 2-core x86_64 CPU). A sweep piece's runs share one compiled program, vmapped over "
      "the runs, so its seconds (compiling included) are shared: a run's time is the "
      "piece's over its runs. Where a preset ran two pieces at a time "
      "(`workers = 2`), each piece's seconds were spent on one of the two cores.",
      "",
      "## Sweep pieces, per folder", "",
      "(results) is the folder's own cells/, which the presets "
      + ", ".join(f"`{p}`" for p in shared) + " wrote into and read back from; the minutes "
      "while its pieces ran are theirs together.", "", *total, "",
      "## Sweep pieces", "", *sweep_lines, ""]
  if trainer := trainer_rows(root):
    lines += ["## jaxcredit.train runs (trainers/)", "",
              "One process per run, compiling included.", "", *trainer, ""]
  if forecast := forecast_rows(root):
    lines += ["## The forecast (forecast/)", "", *forecast, ""]
  out.write_text("\n".join(lines))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("root", type=pathlib.Path, help="The study's results folder.")
  parser.add_argument("--out", type=pathlib.Path, required=True, help="The markdown to write.")
  args = parser.parse_args()
  write(args.root, args.out)
  print(f"[wall_times] wrote {args.out}")


if __name__ == "__main__":
  main()
