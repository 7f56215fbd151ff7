"""MLflow runs of `train two-tower` and `compare`, optional (the ``mlflow`` extra,
``mlflow-skinny``): `tracking(flag)` returns a `Tracking` when ``--mlflow`` is given or
``MLFLOW_TRACKING_URI`` is set, None otherwise.

A training is one MLflow run: its settings as params, every evaluation's metrics at its
step, its ``config.json`` (and ``metrics.json``) as artifacts. A comparison is a parent run
(the plan's settings, its losses and seeds; report.md, plan.json, results.csv and the
charts as artifacts once the report is written) with a child run a loss and seed (the
run's settings, its evaluations, its result: results.csv's row as ``result.*``). MLflow's
metric names take no ``@`` or ``:``: ``recall@10`` is logged as ``recall_at_10`` and a
band's ``head:recall@10`` as ``head/recall_at_10``.

Runs are written through `mlflow.tracking.MlflowClient` (no global active run), to
``MLFLOW_TRACKING_URI``: a tracking server (``http://...``), Databricks, or a local folder
(``file:/path``, which MLflow 3 serves only with ``MLFLOW_ALLOW_FILE_STORE=true``).
"""

from __future__ import annotations

import math
import os
from typing import Mapping, Optional

EXTRA = 'pip install -e ".[mlflow]"'
DEFAULT_EXPERIMENT = "tfrs-logq"


def metric_key(name: str) -> Optional[str]:
    """MLflow's name of an evaluation column: ``recall@10`` -> ``recall_at_10``,
    ``head:recall@10`` -> ``head/recall_at_10``, ``train_loss`` as is; None for a column
    that is no metric."""
    base = name.split(":", 1)[-1]
    if base.startswith(("recall@", "ndcg@")):
        return name.replace(":", "/", 1).replace("@", "_at_")
    if name in ("train_loss", "seconds_per_step", "validation_monitor"):
        return name
    return None


def _params(values: Mapping, prefix: str = "") -> dict:
    """Flat ``{name: str}`` params of a (nested) mapping; None and empty values left out."""
    out = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_params(value, f"{name}."))
        elif value is not None and value != "":
            out[name] = str(value)[:500]  # MLflow's param length limit
    return out


class Tracking:
    """Writes runs to one MLflow experiment (``MLFLOW_EXPERIMENT_NAME``, else
    ``experiment``)."""

    def __init__(self, experiment: str = DEFAULT_EXPERIMENT) -> None:
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        self.client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or experiment
        found = self.client.get_experiment_by_name(name)
        self.experiment_id = (found.experiment_id if found is not None
                              else self.client.create_experiment(name))

    def start(self, name: str, params: Mapping, parent: Optional[str] = None,
              tags: Optional[Mapping[str, str]] = None) -> str:
        """A new run named ``name`` with ``params`` (nested mappings flattened with dots),
        a child of ``parent`` when given; returns its id."""
        all_tags = dict(tags or {})
        if parent is not None:
            all_tags["mlflow.parentRunId"] = parent
        run = self.client.create_run(self.experiment_id, run_name=name, tags=all_tags)
        run_id = run.info.run_id
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in _params(params).items()]
        for start in range(0, len(params), 100):  # MLflow takes 100 params a batch
            self.client.log_batch(run_id, params=params[start:start + 100])
        return run_id

    def evaluation(self, run_id: str, row: Mapping, step: Optional[int] = None,
                   prefix: str = "") -> None:
        """The metrics of an evaluation row (`metric_key`'s columns), at ``step`` (the row's
        ``steps`` by default)."""
        from mlflow.entities import Metric

        step = int(row["steps"] if step is None else step)
        now = _now_ms()
        metrics = []
        for name, value in row.items():
            key = metric_key(name)
            try:
                value = float(value)
            except (TypeError, ValueError):
                continue
            if key and math.isfinite(value):
                metrics.append(Metric(prefix + key, value, now, step))
        for start in range(0, len(metrics), 1000):
            self.client.log_batch(run_id, metrics=metrics[start:start + 1000])

    def artifacts(self, run_id: str, paths) -> None:
        for path in paths:
            if os.path.isfile(path):
                self.client.log_artifact(run_id, path)

    def end(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status)


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)


def tracking(flag: bool = False, experiment: str = DEFAULT_EXPERIMENT) -> Optional[Tracking]:
    """A `Tracking` when ``flag`` (``--mlflow``) or ``MLFLOW_TRACKING_URI`` asks for one,
    else None. Refused in one line, before any work: MLflow not installed (names the
    extra), ``--mlflow`` without a ``MLFLOW_TRACKING_URI`` to write to."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if not flag and not uri:
        return None
    try:
        import mlflow  # noqa: F401
    except ImportError:
        raise ValueError(f"--mlflow (or MLFLOW_TRACKING_URI) needs MLflow, which is not "
                         f"installed: {EXTRA}.") from None
    if not uri:
        raise ValueError("--mlflow needs MLFLOW_TRACKING_URI: your tracking server "
                         "(http://HOST:5000), databricks, or file:/PATH with "
                         "MLFLOW_ALLOW_FILE_STORE=true.")
    return Tracking(experiment)


__all__ = ["EXTRA", "Tracking", "metric_key", "tracking"]
