"""python -m jaxcredit.view WORKDIR [--out FILE] [--serve [--port N]]"""

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
  try:
    path, problems = page.write(args.workdir, args.out)
  except export_reader.NoExport as error:
    print(error, file=sys.stderr)
    return 1
  for problem in problems:
    print(problem, file=sys.stderr)
  print(f"Wrote {path}")
  if args.serve:
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
