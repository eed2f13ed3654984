"""python -m jaxcredit.train --config experiments/quickstart.py [--config.key=value ...] --workdir DIR"""

from absl import app, flags, logging
from ml_collections import config_flags

from jaxcredit.lab import hooks
from jaxcredit.train import loop

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (experiments/*.py).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for metrics.jsonl, config.json and data.")
flags.mark_flags_as_required(["config", "workdir"])


def _hook(config):
  """Estimators that need rollouts or an oracle (vineppo, oracle) get them from the lab."""
  advantage = config.advantage.to_dict() if hasattr(config.advantage, "to_dict") else config.advantage
  return hooks.credit_hook(advantage, temperature=config.rl.temperature)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # keep orbax's per-save INFO lines out of the console
  try:
    final = loop.run(_CONFIG.value, _WORKDIR.value, rollout_hook=_hook(_CONFIG.value))
  except FloatingPointError as error:
    raise SystemExit(f"Stopped: {error}") from error
  print(f"final: {final}")


if __name__ == "__main__":
  app.run(main)
