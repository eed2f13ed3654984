"""No module of the package grows past about 400 lines: a longer one is cut where its parts
separate."""

import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "jaxcredit"
MOST_LINES = 410


def test_every_package_module_is_at_most_about_400_lines():
  sizes = {path.relative_to(PACKAGE.parent).as_posix(): len(path.read_text().splitlines())
           for path in PACKAGE.rglob("*.py")}
  assert len(sizes) > 100
  longer = {path: lines for path, lines in sizes.items() if lines > MOST_LINES}
  assert not longer, f"modules over {MOST_LINES} lines: {longer}"
