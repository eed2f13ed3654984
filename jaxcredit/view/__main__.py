"""python -m jaxcredit.view WORKDIR [--out FILE] [--serve [--port N]]

WORKDIR is a training run's (its export in WORKDIR/tokens), or a directory of runs, such as
a study's: then every run below it with an export gets its own RUN/credit.html."""

import argparse
import functools
import http.server
import pathlib
import sys

from jaxcredit.view import export_reader, page


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m jaxcredit.view",
      description="Writes WORKDIR/credit.html: the run's per-token export, coloured by credit.")
  parser.add_argument("workdir", type=pathlib.Path)
  parser.add_argument("--out", type=pathlib.Path, help="the page's path (default WORKDIR/"
                      f"{page.PAGE})")
  parser.add_argument("--serve", action="store_true", help="serve the page on localhost")
  parser.add_argument("--port", type=int, default=8000)
  args = parser.parse_args(argv)
  runs = ([args.workdir] if (args.workdir / export_reader.DIRECTORY).is_dir()
          else export_reader.runs_with_exports(args.workdir))
  if not runs:
    print(f"No per-token export in {args.workdir / export_reader.DIRECTORY} or below "
          f"{args.workdir}: train with --config.export.every=N (N > 0) to write one.",
          file=sys.stderr)
    return 1
  if len(runs) > 1 and args.out:
    parser.error(f"--out names one page; {args.workdir} holds {len(runs)} runs with exports.")
  for run in runs:
    try:
      path, problems = page.write(run, args.out)
    except export_reader.NoExport as error:
      print(error, file=sys.stderr)
      return 1
    for problem in problems:
      print(problem, file=sys.stderr)
    print(f"Wrote {path}")
  if args.serve:
    if len(runs) > 1:
      parser.error("--serve serves one run's page; name the run's directory.")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler,
                                directory=str(path.parent.resolve()))
    with http.server.ThreadingHTTPServer(("127.0.0.1", args.port), handler) as server:
      print(f"Serving http://127.0.0.1:{server.server_address[1]}/{path.name} (Ctrl-C stops).")
      try:
        server.serve_forever()
      except KeyboardInterrupt:
        pass
  return 0


if __name__ == "__main__":
  sys.exit(main())
