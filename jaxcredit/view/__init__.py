"""The credit viewer: a run's per-token export as one self-contained HTML page. ::

  python -m jaxcredit.view WORKDIR            # writes WORKDIR/credit.html
  python -m jaxcredit.view WORKDIR --serve    # and serves it on http://127.0.0.1:PORT/

`export_reader` reads `WORKDIR/tokens/*.parquet` (written by `jaxcredit.train.export`);
`page` renders them with `template.html` and `viewer.js` inlined.
"""

from jaxcredit.view.export_reader import NoExport, Step, read_export, read_step
from jaxcredit.view.page import render, write

__all__ = ["NoExport", "Step", "read_export", "read_step", "render", "write"]
