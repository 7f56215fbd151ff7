"""Pusher: a blessed export copied into a TF Serving base path as its next integer version.

::

    Pusher/
      manifest.json         ... and ``pushed`` (true/false), ``pushed_version``, ``pushed_to``
      pushed.json           the same, and why a model was not pushed

The copy goes into a hidden ``BASE/.tmp-VERSION-PID-XXXX`` directory (a server
polling ``BASE`` ignores names that are not integers) and is renamed to
``BASE/VERSION`` when complete, so a server never sees half a version; if another
process took ``VERSION`` meanwhile, the next free number is used. Temporaries of
pushes that died are removed first. A model the Evaluator did not bless is not
pushed: the artifact records ``pushed: false`` and the reason, and ``BASE`` is
left alone. A push is current while its version directory still exists.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
from typing import Optional

from tfrs_logq._util.atomic import publish_directory, staging_directory
from tfrs_logq.pipelines.beam.artifacts import artifact_input, remove_stale, verified_manifest
from tfrs_logq.pipelines.beam.exporter import saved_model_dir

NAME = "Pusher"
VERSION = 1
RECORD = "pushed.json"


def next_version(base: str) -> int:
    """One more than the largest integer version in ``base`` (1 when there is none)."""
    versions = [int(d) for d in os.listdir(base) if d.isdigit()] if os.path.isdir(base) else []
    return max(versions, default=0) + 1


def push_version(saved_model: str, base: str) -> str:
    """Copies the SavedModel directory ``saved_model`` to ``base/VERSION`` atomically
    (the next free version); returns that path."""
    os.makedirs(base, exist_ok=True)
    remove_stale(base)  # .tmp-VERSION-PID-XXXX of pushes (or exports) that died
    version = next_version(base)
    with staging_directory(base, f".tmp-{version}-{os.getpid()}-") as tmp:
        shutil.copytree(saved_model, tmp, dirs_exist_ok=True)
        umask = os.umask(0)
        os.umask(umask)
        for parent, dirs, _ in os.walk(tmp):  # readable by a server running as another user
            for path in [parent, *(os.path.join(parent, d) for d in dirs)]:
                os.chmod(path, 0o777 & ~umask)
        while True:
            final = os.path.join(base, str(version))
            try:
                publish_directory(tmp, final, replace=False)
                return final
            except OSError as exc:  # taken before, or between the check and the rename
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
            version = max(version + 1, next_version(base))


@dataclasses.dataclass
class Pusher:
    """Pushes the Exporter's model to ``serving_base_path`` if the Evaluator blessed it.

    Args:
      exporter_dir: str. The Exporter artifact.
      evaluator_dir: str. The Evaluator artifact (its ``blessed``).
      serving_base_path: str. TF Serving's ``--model_base_path`` (the directory of
        integer versions ``tfrs-logq serve`` polls).
    """

    exporter_dir: str
    evaluator_dir: str
    serving_base_path: str

    name = NAME
    version = VERSION
    USES_BEAM = False  # runs in the pipeline's process
    OUTCOME_FIELDS = ("pushed", "pushed_version", "pushed_to")

    def inputs(self, root: str) -> dict:
        evaluation = verified_manifest(self.evaluator_dir, "Evaluator")
        return {"model": artifact_input(self.exporter_dir, "Exporter"),
                "evaluation": {**artifact_input(self.evaluator_dir, "Evaluator"),
                               "blessed": evaluation["blessed"]}}

    def parameters(self) -> dict:
        return {"serving_base_path": os.path.abspath(self.serving_base_path)}

    def stale_reason(self, manifest: dict) -> Optional[str]:
        """Why a push that is otherwise current must be redone: its version is gone."""
        if manifest.get("pushed") and not os.path.isdir(manifest.get("pushed_to") or ""):
            return f"{manifest.get('pushed_to')}, the version it pushed, is gone"
        return None

    def build(self, root: str, staging: str, run) -> dict:
        from tfrs_logq.pipelines.beam.evaluation import describe_blessing

        evaluation = verified_manifest(self.evaluator_dir, "Evaluator")
        verified_manifest(self.exporter_dir, "Exporter")
        base = os.path.abspath(self.serving_base_path)
        if os.path.exists(base) and not os.path.isdir(base):
            raise NotADirectoryError(f"--model_base_path {base} is a file, not a directory.")
        if evaluation["blessed"]:
            path = push_version(saved_model_dir(os.path.abspath(self.exporter_dir)), base)
            record = {"pushed": True, "pushed_version": int(os.path.basename(path)),
                      "pushed_to": path, "reason": describe_blessing(evaluation["blessing"])}
        else:
            record = {"pushed": False, "pushed_version": None, "pushed_to": None,
                      "reason": "the model is " + describe_blessing(evaluation["blessing"])}
        with open(os.path.join(staging, RECORD), "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")
        return record
