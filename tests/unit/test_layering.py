"""Imports only point down the package's layers, and the package never imports the studies
built on it: read every module's imports with `ast`."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "jaxcredit"

# The layers, bottom (0) to top; a module may import its own layer and those below.
LAYERS = [
  "rollout",
  "logprobs",
  "estimators",
  "losses",
  "models",
  "sampling",
  "rollout_sources",
  "forward",
  "tasks",
  "credit",
  "train",
  "lab",
  "view",
]
# Helpers outside the stack: the leaf utilities sit below everything; the rest (CLI tools, the
# test kit, the package facade) sit above the pure layers and below training.
LEVELS = {
  **{name: level for level, name in enumerate(LAYERS)},
  "_checks": -1,
  "atomic": -1,
  "_masking": -1,
  "registry": -1,
  "__init__": LAYERS.index("losses"),
  "demo": LAYERS.index("losses"),
  "testing": LAYERS.index("losses"),
  "plot": LAYERS.index("train"),
}


def _unit(module: str) -> str:
  """The layer unit of a dotted jaxcredit module name: its first component below jaxcredit."""
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: pathlib.Path, top: str = "jaxcredit") -> list[tuple[int, str]]:
  """(line, module) of every import of package `top` in a file, `from top import x` resolved
  to top.x."""
  found = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      found += [(node.lineno, alias.name) for alias in node.names
                if alias.name == top or alias.name.startswith(f"{top}.")]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      if node.module == top:
        found += [(node.lineno, f"{top}.{alias.name}") for alias in node.names]
      elif node.module.startswith(f"{top}."):
        found.append((node.lineno, node.module))
  return found


def _modules(package: pathlib.Path = PACKAGE):
  for path in sorted(package.rglob("*.py")):
    relative = path.relative_to(package.parent).with_suffix("")
    yield path, ".".join(relative.parts)


def _violations(package: pathlib.Path = PACKAGE) -> list[str]:
  problems = []
  for path, module in _modules(package):
    own = _unit(module)
    problems += [f"{path.relative_to(package.parent)}:{line} ({own}) imports {imported} (studies)"
                 for line, imported in _imports(path, "studies")]
    for line, imported in _imports(path):
      target = _unit(imported)
      if target in LEVELS and LEVELS[target] > LEVELS[own]:
        problems.append(
          f"{path.relative_to(package.parent)}:{line} ({own}) imports {imported} ({target})"
        )
  return problems


def test_every_package_unit_has_a_layer():
  units = {_unit(module) for _, module in _modules()}
  assert units <= set(LEVELS), sorted(units - set(LEVELS))


def test_no_module_imports_from_a_higher_layer():
  assert _violations() == []


def test_the_check_sees_an_upward_import(tmp_path):
  """The check itself can fail: an estimator importing the trainer or the lab, and the lab
  importing a study, are reported."""
  (tmp_path / "jaxcredit" / "estimators").mkdir(parents=True)
  (tmp_path / "jaxcredit" / "estimators" / "bad.py").write_text(
    "from jaxcredit.train import loop\nfrom jaxcredit import lab\nfrom jaxcredit import rollout\n"
  )
  (tmp_path / "jaxcredit" / "lab").mkdir()
  (tmp_path / "jaxcredit" / "lab" / "bad.py").write_text("from studies.credit_study import sweep\n")
  assert _violations(tmp_path / "jaxcredit") == [
    "jaxcredit/estimators/bad.py:1 (estimators) imports jaxcredit.train (train)",
    "jaxcredit/estimators/bad.py:2 (estimators) imports jaxcredit.lab (lab)",
    "jaxcredit/lab/bad.py:1 (lab) imports studies.credit_study (studies)",
  ]
