"""The credit viewer's page: one self-contained HTML file (no server, no CDN, works offline).

  path = page.write(workdir)            # WORKDIR/credit.html
  html = page.render(steps, problems)   # the page's text

The exported columns travel inside the page as base64 little-endian typed arrays (float32
values, int32 ids) and one table of distinct token texts, so 2,000 responses of 1,000 tokens
load in a few seconds; the page's script (`viewer.js`, inlined) builds only the responses of
the page in view. Token texts reach the page as JSON and the DOM as text nodes: a response
containing `<script>` is shown, never run.
"""

import base64
import json
import pathlib
from importlib import resources

import numpy as np

from jaxcredit.view import export_reader

FLOATS = {"reward": "reward", "behaviour_logprob": "blp", "logprob": "lp", "entropy": "ent",
          "ratio": "ratio"}
INTS = {"group": "group", "sample": "sample", "position": "pos", "token_id": "id"}
PAGE = "credit.html"


def _b64(values: np.ndarray, dtype) -> str:
  return base64.b64encode(np.ascontiguousarray(values, dtype=np.dtype(dtype).newbyteorder("<"))
                          .tobytes()).decode("ascii")


def _credit_label(column: str, estimator: str) -> str:
  return estimator if column == "advantage" else column.removeprefix("advantage.")


def page_data(steps: list[export_reader.Step], problems: list[str], *, title: str) -> dict:
  """The JSON the page's script reads: token texts once, then each step's columns.

  Args:
    steps: the exported steps (`export_reader.read_export`).
    problems: messages for the files skipped.
    title: the page's title.

  Returns:
    a JSON-serialisable dict.
  """
  texts = sorted({text for step in steps for text in step.columns["token"]})
  index = {text: i for i, text in enumerate(texts)}
  encoded = []
  for step in steps:
    columns = step.columns
    credits = {_credit_label(c, step.estimator): _b64(columns[c], "<f4")
               for c in step.credit_columns}
    encoded.append({
        "step": step.step, "rl_step": step.rl_step, "file": step.path.name,
        "estimator": step.estimator, "tokens": len(columns["token"]),
        **{key: _b64(columns[name], "<f4") for name, key in FLOATS.items()},
        **{key: _b64(columns[name], "<i4") for name, key in INTS.items()},
        "act": _b64(columns["is_action"], "<i4"),
        "text": _b64([index[t] for t in columns["token"]], "<i4"),
        "credits": credits,
    })
  return {"title": title, "texts": texts, "steps": encoded, "problems": problems}


def render(steps: list[export_reader.Step], problems: list[str], *, title: str) -> str:
  """The viewer page's HTML with the data and the script inlined.

  Args:
    steps: the exported steps (`export_reader.read_export`).
    problems: messages for the files skipped.
    title: the page's title.

  Returns:
    the HTML text.
  """
  assets = resources.files("jaxcredit.view")
  template = (assets / "template.html").read_text(encoding="utf-8")
  script = (assets / "viewer.js").read_text(encoding="utf-8")
  data = json.dumps(page_data(steps, problems, title=title), separators=(",", ":"))
  # Inside <script type="application/json">: no "</script>" or "<!--" can end it early.
  data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
  return (template.replace("{{TITLE}}", _escape(title)).replace("{{DATA}}", data)
          .replace("{{SCRIPT}}", script))


def _escape(text: str) -> str:
  return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
          .replace('"', "&quot;"))


def write(workdir: pathlib.Path, out: pathlib.Path | None = None) -> tuple[pathlib.Path, list[str]]:
  """Writes the credit viewer of a run's export.

  Args:
    workdir: the run's directory.
    out: the page's path; None for WORKDIR/credit.html.

  Returns:
    ``(path, problems)``: the page written and the problems met (files skipped).

  Raises:
    export_reader.NoExport: without an export.
  """
  workdir = pathlib.Path(workdir)
  steps, problems = export_reader.read_export(workdir)
  out = pathlib.Path(out) if out is not None else workdir / PAGE
  out.write_text(render(steps, problems, title=f"jaxcredit credit: {workdir.resolve().name}"),
                 encoding="utf-8")
  return out, problems
