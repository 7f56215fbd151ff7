"""TensorBoard event files of a training run and the HParams plugin's data of a comparison:
one writer for `train two-tower`, `compare`'s runs and `compare_model`'s runs.

A run's evaluations go to ``LOGDIR/train`` (``loss``: the step's training loss,
``learning_rate``, ``steps_per_second``), ``LOGDIR/test`` (``recall@k``, ``ndcg@k``; a
popularity band's as ``head/recall@10``) and ``LOGDIR/validation`` (SASRec's
``validation_monitor``), at the evaluation's step. A comparison's run also gets one HParams
trial (`write_trial`: its loss, seed and the plan's settings as hparams; its result, the
window's means, under ``LOGDIR/result``) and the comparison one experiment
(`write_experiment`, at the logs' root), so that ``tensorboard --logdir OUTPUT_DIR/logs``
shows it as a table and parallel coordinates. Writers are opened at the first write and
flushed after each: a run killed between its evaluation's row and its event loses that
event and never writes a step twice on resume (the rows are written first).
"""

from __future__ import annotations

import math
import os
from typing import Mapping, Optional, Sequence

_METRIC_PREFIXES = ("recall@", "ndcg@")
RESULT_GROUP = "result"


def _finite(value) -> Optional[float]:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _test_tag(name: str) -> Optional[str]:
    """``recall@10`` as is, a band's ``head:recall@10`` as ``head/recall@10``; None for
    any other column."""
    base = name.split(":", 1)[-1]
    if not base.startswith(_METRIC_PREFIXES):
        return None
    return name.replace(":", "/", 1)


class EventBoard:
    """The event files of one run under ``logdir``; `write` takes an evaluation row
    (``{"steps", "recall@10", ..., "train_loss", "seconds_per_step",
    "validation_monitor"}``, any of them missing)."""

    def __init__(self, logdir: str, learning_rate: Optional[float] = None) -> None:
        self.logdir = logdir
        self.learning_rate = None if learning_rate is None else float(learning_rate)
        self._writers: dict = {}

    def _writer(self, group: str):
        import tensorflow as tf

        if group not in self._writers:
            self._writers[group] = tf.summary.create_file_writer(
                os.path.join(self.logdir, group))
        return self._writers[group]

    def _scalars(self, group: str, values: Mapping[str, Optional[float]], step: int) -> None:
        import tensorflow as tf

        values = {tag: v for tag, v in values.items() if v is not None}
        if not values:
            return
        writer = self._writer(group)
        with writer.as_default():
            for tag, value in values.items():
                tf.summary.scalar(tag, value, step=step)
        writer.flush()

    def write(self, row: Mapping) -> None:
        step = int(row["steps"])
        per_step = _finite(row.get("seconds_per_step"))
        self._scalars("train", {
            "loss": _finite(row.get("train_loss")),
            "learning_rate": self.learning_rate,
            "steps_per_second": 1.0 / per_step if per_step else None}, step)
        self._scalars("test", {tag: _finite(value) for tag, value in
                               ((_test_tag(k), v) for k, v in row.items()) if tag}, step)
        self._scalars("validation", {
            "validation_monitor": _finite(row.get("validation_monitor"))}, step)

    def write_trial(self, hparams: Mapping, result: Mapping, trial_id: str) -> None:
        """The run's HParams trial: ``hparams`` (str, int, float or bool values) and
        ``result``'s metrics (results.csv's row: the window's means) at its ``steps``,
        under ``logdir/result``."""
        from tensorboard.plugins.hparams import api as hp

        trial = self._writer("")  # the trial is the run's folder; metrics in a group
        with trial.as_default():
            hp.hparams(dict(hparams), trial_id=trial_id)
        trial.flush()
        step = int(result.get("steps") or 0)
        self._scalars(RESULT_GROUP, {tag: _finite(value) for tag, value in
                                     ((_test_tag(k), v) for k, v in result.items()) if tag},
                      step)


def write_experiment(logdir: str, hparams: Mapping[str, Sequence], metrics: Sequence[str],
                     ) -> None:
    """The comparison's HParams experiment at ``logdir`` (the root of its runs' logdirs):
    each hparam with the values it takes (``{"loss": [...], "seed": [...]}``; a constant
    setting with its one value) and the metrics, read from each trial's ``result``
    group."""
    import tensorflow as tf
    from tensorboard.plugins.hparams import api as hp

    def domain(values):
        values = sorted(set(values), key=str)
        if all(isinstance(v, bool) for v in values):
            return hp.Discrete([bool(v) for v in values])
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            return hp.Discrete(values)
        return hp.Discrete([str(v) for v in values])

    writer = tf.summary.create_file_writer(logdir)
    with writer.as_default():
        hp.hparams_config(
            hparams=[hp.HParam(name, domain(values)) for name, values in hparams.items()],
            metrics=[hp.Metric(name, group=RESULT_GROUP, display_name=name)
                     for name in metrics])
    writer.flush()
    writer.close()


__all__ = ["EventBoard", "RESULT_GROUP", "write_experiment"]
