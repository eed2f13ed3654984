"""Every line of the package fits in 100 columns (characters, not bytes)."""

import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "jaxcredit"
MAX_COLUMNS = 100


def _long_lines(package: pathlib.Path = PACKAGE) -> list[str]:
  return [f"{path.relative_to(package.parent)}:{number} ({len(line)} columns)"
          for path in sorted(package.rglob("*.py"))
          for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
          if len(line) > MAX_COLUMNS]


def test_package_lines_fit_in_100_columns():
  assert _long_lines() == []


def test_the_check_sees_a_long_line(tmp_path):
  (tmp_path / "jaxcredit").mkdir()
  (tmp_path / "jaxcredit" / "wide.py").write_text("x = 1\ny = '" + "é" * 98 + "'\n", encoding="utf-8")
  assert _long_lines(tmp_path / "jaxcredit") == ["jaxcredit/wide.py:2 (104 columns)"]
