"""Imported at the start of every Python process a test run starts: tests/conftest.py puts
this directory first on PYTHONPATH, so the xdist workers, the CLI runs, the study workers and
the docs build's kernels all read it (Python imports `sitecustomize` at startup).

It collects garbage less often (`GC_THRESHOLDS`): tracing and lowering allocate millions of
short-lived objects, and each of CPython's default collections (every 700 allocations) scans
them; with fewer, larger young generations, test_batched spends 4.0 s collecting instead of
11.1 s (6,006 collections down to 310), at the same peak memory (2.9 GiB), and a CLI run that
reads its programs from the cache 0.17 s instead of 0.58 s (682 collections down to 44).
The files whose work is in subprocesses (the docs build, the multi-process, CLI-fault,
overlap and sharding tests), with these thresholds in their subprocesses too against in the
test process alone, side by side on a core each and then with the cores swapped: 434.5 and
406.1 s against 446.1 and 430.5 s.

It makes JAX lower up to LOWERINGS_PER_CONTEXT programs in one MLIR context (one per thread)
where JAX builds a fresh one for every program: a test process lowers thousands of small
programs, and building a context (loading JAX's dialects into it) is about a quarter of each
one's lowering (test_conformance, test_api_docs, test_attention and test_batched on one core
each, side by side: 505 s against 650 s; test_returns and test_key_turns, one after the other:
80 and 117 s against 93 and 136 s). The modules are the same; a context is renewed after
LOWERINGS_PER_CONTEXT programs, so what it interns (types, attributes, constants) is freed with
the modules that use it. The change is made when JAX's lowering module is first imported, so a
process that never imports JAX pays nothing.
"""

import gc
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading

GC_THRESHOLDS = (10_000, 10, 10)
LOWERINGS_PER_CONTEXT = 128
MLIR = "jax._src.interpreters.mlir"


def share_contexts(mlir) -> None:
  """Replaces `mlir.make_ir_context` (JAX's lowering module, imported) by one that hands out a
  context per thread, renewed every LOWERINGS_PER_CONTEXT calls; once per process."""
  fresh = mlir.make_ir_context
  if getattr(fresh, "shared", False):
    return
  local = threading.local()

  def make_ir_context():
    if getattr(local, "lowerings", LOWERINGS_PER_CONTEXT) >= LOWERINGS_PER_CONTEXT:
      local.context, local.lowerings = fresh(), 0
    local.lowerings += 1
    return local.context

  make_ir_context.shared = True
  mlir.make_ir_context = make_ir_context


class _ShareContextsOnImport(importlib.abc.MetaPathFinder):
  """Finds JAX's lowering module as the import system would, and changes it once executed."""

  def find_spec(self, name, path=None, target=None):
    if name != MLIR:
      return None
    sys.meta_path.remove(self)
    spec = importlib.machinery.PathFinder.find_spec(name, path, target)
    if spec is None or spec.loader is None:
      return spec
    execute = spec.loader.exec_module

    def exec_module(module):
      execute(module)
      share_contexts(module)

    spec.loader.exec_module = exec_module
    return spec


def install() -> None:
  """GC_THRESHOLDS, and share_contexts now if JAX's lowering module is imported, else when it
  is."""
  gc.set_threshold(*GC_THRESHOLDS)
  if MLIR in sys.modules:
    share_contexts(sys.modules[MLIR])
  elif not any(isinstance(f, _ShareContextsOnImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _ShareContextsOnImport())


def _run_the_sitecustomize_this_one_shadows() -> None:
  here = os.path.dirname(os.path.abspath(__file__))
  others = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
  spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
  if spec is not None and spec.loader is not None:
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


if __name__ == "sitecustomize":
  install()
  _run_the_sitecustomize_this_one_shadows()
