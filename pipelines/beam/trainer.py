"""Trainer: `tfrs_logq.sasrec.training.train` on the ExampleGen artifact, into a model directory.

::

    Trainer/
      manifest.json         inputs (ExampleGen's and Statistics' files by sha256), parameters
                            (the training config), counts (epochs, best epoch, test metrics)
      config.json, vocabulary.json, best.weights.*, epochs.json, metrics.json, logs/

The directory is what ``tfrs-logq train --examples ROOT/ExampleGen --log-q
ROOT/Statistics --model-dir DIR`` writes (``export``, ``evaluate --model-dir`` and
``diagnose --model-dir`` read it): the split comes from the records (`read_split`,
equal to the in-memory ``load_split``, so the same seed trains the same model) and
``log Q`` from the Statistics counts. Training runs in the pipeline's own process
(as TFX's Trainer runs its ``run_fn``), into the staging directory, so an
interrupted Trainer starts over on the next run rather than resuming.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

from tfrs_logq.pipelines.beam.artifacts import artifact_input

NAME = "Trainer"
VERSION = 1
# Config fields that say where the inputs lie: the manifest's inputs identify them
# by content instead, so a moved pipeline root is still current.
_LOCATION_FIELDS = ("examples", "log_q", "data_dir")


@dataclasses.dataclass
class Trainer:
    """Trains SASRec on the ExampleGen artifact into the Trainer artifact.

    Args:
      examples_dir: str. The ExampleGen artifact (``PIPELINE_ROOT/ExampleGen``).
      statistics_dir: str. The Statistics artifact, whose counts give ``log Q``; None
        counts them from the split (the same numbers). Defaults to None.
      preset: str. A `tfrs_logq.sasrec.config.PRESETS` name. Defaults to ``"smoke"`` (about a
        minute on 2 CPU cores, a plumbing check; ``cpu`` or ``long`` train a usable model).
      overrides: dict. Other `TrainConfig` fields (``loss``, ``seed``, ...). Defaults
        to none.
      verbose: int or str. Keras ``fit``'s verbosity. Defaults to 0.
    """

    examples_dir: str
    statistics_dir: Optional[str] = None
    preset: Optional[str] = "smoke"
    overrides: dict = dataclasses.field(default_factory=dict)
    verbose: object = 0

    name = NAME
    version = VERSION
    USES_BEAM = False  # runs in the pipeline's process

    def __post_init__(self) -> None:
        from tfrs_logq.sasrec.config import resolve_config

        unknown = set(self.overrides) & {"examples", "log_q"}
        if unknown:
            raise ValueError(f"`overrides` must not set {sorted(unknown)}: the Trainer's "
                             "inputs are `examples_dir` and `statistics_dir`.")
        resolve_config(self.preset, **self.overrides)  # bad options fail now, not after Beam

    def config(self):
        """The run's `TrainConfig`: the preset and overrides, the artifact's data fields."""
        from tfrs_logq.sasrec.config import examples_config, resolve_config

        config = resolve_config(
            self.preset, **self.overrides, examples=os.path.abspath(self.examples_dir),
            log_q=os.path.abspath(self.statistics_dir) if self.statistics_dir else None)
        return examples_config(config, explicit=set(self.overrides))

    def inputs(self, root: str) -> dict:
        found = {"examples": artifact_input(self.examples_dir, "ExampleGen")}
        if self.statistics_dir:
            found["statistics"] = artifact_input(self.statistics_dir, "Statistics")
        return found

    def parameters(self) -> dict:
        config = dataclasses.asdict(self.config())
        return {k: v for k, v in config.items() if k not in _LOCATION_FIELDS}

    def build(self, root: str, staging: str, run) -> dict:
        """Trains into ``staging`` (no Beam job); returns the run's summary."""
        from tfrs_logq.sasrec.training import train

        result = train(self.config(), staging, verbose=self.verbose)
        return {"epochs": result["epochs"], "steps": result["steps"],
                "best_epoch": result["best_epoch"], "train_seconds": result["train_seconds"],
                "validation": result["validation"], "test": result["test"]}
