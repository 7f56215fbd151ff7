"""`tfrs_logq.compare_model` refusing what would train silently wrong or end in a traceback:
a directory of a comparison whose model changed (``plan.json`` pins the model's source and
built architecture), ``candidate_ids`` that are not the candidates', a ``model_fn`` that
raises or takes other arguments, settings given in the wrong form. Each refusal is one
line, before any training."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import tensorflow as tf
from test_model_fn import TITLES, USERS, MovielensModel, _compare, build, movielens

from tfrs_logq.studies.compare.plan import CompareError

__all__ = ["movielens"]  # the fixture, shared with test_model_fn

# A user's module, edited between runs: the query tower's extra layer, the query's scale,
# a comment, and the embedding width read from a file beside it (an architecture change
# the module's source does not show).
MODULE = '''
import json
import os

import tensorflow as tf
import tensorflow_recommenders as tfrs

USERS = [f"u{{u}}" for u in range(80)]
TITLES = [f"Movie {{i}} (1999)" for i in range(120)]
with open(os.path.join(os.path.dirname(__file__), "width.json")) as f:
    WIDTH = json.load(f)


class Model(tfrs.Model):
    def __init__(self, task):
        super().__init__()
        self.query_model = tf.keras.Sequential([
            tf.keras.layers.StringLookup(vocabulary=USERS, mask_token=None),
            tf.keras.layers.Embedding(len(USERS) + 1, WIDTH){extra}])
        self.candidate_model = tf.keras.Sequential([
            tf.keras.layers.StringLookup(vocabulary=TITLES, mask_token=None),
            tf.keras.layers.Embedding(len(TITLES) + 1, WIDTH)])
        self.task = task

    def compute_loss(self, features, training=False):
        return self.task({scale}self.query_model(features["user_id"]),
                         self.candidate_model(features["movie_title"]),
                         candidate_ids=features["movie_title"])

{comment}
def build(task):
    model = Model(task)
    model.compile(optimizer=tf.keras.optimizers.Adagrad(0.1))
    return model
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """``write(width=8, extra="", scale="", comment="")``: (re)writes ``edited_model.py``
    and ``width.json`` in the current directory (tmp_path), the module imported afresh by
    the next comparison (as by a new process)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)

    def write(width=8, extra="", scale="", comment=""):
        sys.modules.pop("edited_model", None)
        (tmp_path / "width.json").write_text(json.dumps(width))
        (tmp_path / "edited_model.py").write_text(
            MODULE.format(extra=extra, scale=scale, comment=comment))

    yield write
    sys.modules.pop("edited_model", None)


def test_a_rerun_with_an_edited_model_is_refused_naming_what_changed(movielens, tmp_path,
                                                                     user_module):
    out = tmp_path / "cmp"
    user_module()
    rows = _compare(movielens, out, model_fn="edited_model:build", steps=2, eval_every=2,
                    window=1)
    assert len(rows) == 2
    config = json.loads((out / "plan.json").read_text())["fixed"]["config"]
    assert config["model_source"].startswith("edited_model.py ")
    assert config["architecture"].startswith("8 layers, 1,616 parameters, ")

    def rerun():
        return _compare(movielens, out, model_fn="edited_model:build", steps=2, eval_every=2,
                        window=1, seeds=(0, 1), max_runs=0)

    # Comments and blank lines change nothing that runs: the same model, more seeds.
    user_module(comment="# builds the model\n\n# (the task is the loss's)\n")
    rerun()
    assert json.loads((out / "plan.json").read_text())["seeds"] == [0, 1]
    for edit, changed, unchanged in (
            (dict(extra=", tf.keras.layers.Dense(WIDTH)"), "source and architecture", None),
            (dict(scale="2.0 * "), "source", "architecture"),
            (dict(width=16), "architecture", "source")):
        user_module(**edit)
        with pytest.raises(CompareError) as error:
            rerun()
        message = str(error.value)
        assert "\n" not in message and f"'s {changed} changed" in message, message
        assert "new output_dir=" in message, message
        if unchanged:
            assert unchanged not in message, message
    user_module()  # the model it ran, restored: the directory goes on
    rerun()
    # A plan written before plans pinned the model cannot vouch for its runs.
    saved = json.loads((out / "plan.json").read_text())
    for key in ("model_source", "architecture"):
        del saved["fixed"]["config"][key]
    (out / "plan.json").write_text(json.dumps(saved))
    with pytest.raises(CompareError, match="does not pin its model's source and architecture"):
        rerun()


def test_the_pins_are_deterministic_and_ignore_comments(tmp_path):
    """One model built twice in a process (Keras numbering its layers' names anew) has one
    architecture; another width has another; the source's digest ignores comments and
    blank lines, not code."""
    from tfrs_logq.frequency import ExactFrequency
    from tfrs_logq.studies.compare.model_fn import (
        ComparedTask,
        architecture,
        code_fingerprint,
        model_source,
    )

    frequency = ExactFrequency.from_counts(np.ones(2), ids=np.array([b"a", b"b"]))

    def built(correction, width=8):
        task = ComparedTask(correction, frequency)
        model = MovielensModel(task)
        if width != 8:
            model.candidate_model.add(tf.keras.layers.Dense(width))
        model.compile(optimizer=tf.keras.optimizers.Adagrad(0.1))
        model.query_model(tf.constant(USERS[:2]))
        model.candidate_model(tf.constant(TITLES[:3]))
        return architecture(model, task)

    first = built("none")
    assert built("corrected") == first  # the task (the loss) is not the architecture
    assert built("none", width=4) != first
    path = tmp_path / "m.py"
    path.write_text("def f(task):\n    return task\n")
    code = code_fingerprint(str(path))
    path.write_text("# a comment\n\ndef f(task):  # another\n\n    return task\n")
    assert code_fingerprint(str(path)) == code
    path.write_text("def f(task):\n    return [task]\n")
    assert code_fingerprint(str(path)) != code
    assert model_source(build).startswith("test_model_fn.py ")


class UserIdsModel(MovielensModel):
    """Passes the users' ids as the candidates' (the wrong feature)."""

    def compute_loss(self, features, training=False):
        return self.task(self.query_model(features["user_id"]),
                         self.candidate_model(features["movie_title"]),
                         candidate_ids=features["user_id"])


class HalfUnknownIdsModel(MovielensModel):
    """Passes ids half of which the training set never holds."""

    def compute_loss(self, features, training=False):
        titles = features["movie_title"]
        ids = tf.where(tf.range(tf.size(titles)) % 2 == 0, titles, "Not a movie")
        return self.task(self.query_model(features["user_id"]),
                         self.candidate_model(titles), candidate_ids=ids)


def _compiled(cls):
    def model_fn(task):
        model = cls(task)
        model.compile(optimizer=tf.keras.optimizers.Adagrad(0.1))
        return model
    return model_fn


def test_candidate_ids_that_are_not_candidates_are_refused_and_unknown_ones_warned(
        movielens, tmp_path):
    out = tmp_path / "users"
    with pytest.raises(CompareError) as error:
        _compare(movielens, out, model_fn=_compiled(UserIdsModel))
    message = str(error.value)
    assert "\n" not in message and "no candidate's" in message, message
    assert "candidate_ids=features['movie_title']" in message and "np." not in message
    assert not out.exists()
    said: list = []
    _compare(movielens, tmp_path / "half", model_fn=_compiled(HalfUnknownIdsModel),
             max_runs=0, say=said.append)
    warnings = [line for line in said if "warning" in line]
    assert len(warnings) == 1 and "not in train's 'movie_title'" in warnings[0], said
    said.clear()
    _compare(movielens, tmp_path / "right", max_runs=0, say=said.append)
    assert not [line for line in said if "warning" in line], said


class RaisingModel(MovielensModel):
    def __init__(self, task):
        raise RuntimeError("the towers are not ready")


class WideQueries(MovielensModel):
    """A query tower of 16 dimensions against a candidate tower of 8."""

    def __init__(self, task):
        super().__init__(task)
        self.query_model.add(tf.keras.layers.Dense(16))


def _takes_two(task, vocabulary):
    return build(task)


def _takes_none():
    return build(None)


@pytest.mark.parametrize("model_fn, named", [
    (_compiled(RaisingModel), "raised RuntimeError: the towers are not ready"),
    (_takes_two, "takes (task, vocabulary): it must take one argument, the task"),
    (_takes_none, "takes no arguments: it must take one argument, the task"),
    (_compiled(WideQueries), "query tower's embeddings have 16 dimensions and the candidate "
                             "tower's 8"),
])
def test_a_model_fn_that_fails_is_one_line_with_its_error_as_the_cause(movielens, tmp_path,
                                                                       model_fn, named):
    out = tmp_path / "out"
    with pytest.raises(CompareError) as error:
        _compare(movielens, out, model_fn=model_fn)
    assert "\n" not in str(error.value) and named in str(error.value), str(error.value)
    if "raised" in named:
        assert isinstance(error.value.__cause__, RuntimeError)  # --verbose: the traceback
    assert not out.exists()


@pytest.mark.parametrize("given, named", [
    (dict(seeds=(0, 0)), "`seeds` names 0 twice"),
    (dict(seeds=(0.5, 1)), "`seeds` must be integers, received 0.5"),
    (dict(seeds=(True, False)), "`seeds` must be integers, received True"),
    (dict(seeds="01"), "`seeds` must be a list, received the string '01'"),
    (dict(seeds=3), "`seeds` must be a list, received 3"),
    (dict(losses="inbatch-corrected"), "`losses` must be a list, received the string "
                                       "'inbatch-corrected'"),
    (dict(losses=("inbatch-corrected", "inbatch-corrected")),
     "`losses` names 'inbatch-corrected' twice"),
])
def test_seeds_and_losses_in_the_wrong_form_are_refused_before_the_data_is_read(
        tmp_path, given, named):
    out = tmp_path / "out"
    with pytest.raises(CompareError) as error:  # no data: refused before it is read
        _compare((None, None, None), out, **given)
    assert named in str(error.value) and "\n" not in str(error.value), str(error.value)
    assert not out.exists()


def test_ids_in_messages_are_shown_as_the_user_wrote_them(movielens, tmp_path):
    train, test, _ = movielens
    twice = tf.data.Dataset.from_tensor_slices((TITLES + TITLES[:1], TITLES + TITLES[:1]))
    with pytest.raises(CompareError, match=r"the id 'Movie 0 \(1999\)' 2 times"):
        _compare((train, test, twice), tmp_path / "a")
    numbers = tf.data.Dataset.from_tensor_slices(([3] + list(range(120)), [3] + list(range(120))))
    with pytest.raises(CompareError, match="the id 3 2 times") as error:
        _compare((train, test, numbers), tmp_path / "b")
    assert "np." not in str(error.value)
