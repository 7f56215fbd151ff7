"""`compare_model`: the corrected loss against the standard ones on *your* TFRS model.

`tfrs-logq compare` (`tfrs_logq.studies.compare`) trains the built-in models; this module
trains a user's own `tfrs.Model`, written as TFRS's tutorials write it, with two changes:
the model is built around the task it is given, and passes ``candidate_ids`` to it::

    class MovielensModel(tfrs.Model):
        def __init__(self, task):                  # 1. was tfrs.tasks.Retrieval(...) inside
            super().__init__()
            self.query_model = ...                 # StringLookup + Embedding over user ids
            self.candidate_model = ...             # StringLookup + Embedding over titles
            self.task = task

        def compute_loss(self, features, training=False):
            return self.task(self.query_model(features["user_id"]),
                             self.candidate_model(features["movie_title"]),
                             candidate_ids=features["movie_title"])   # 2. the ids

    def model_fn(task):
        model = MovielensModel(task)
        model.compile(optimizer=tf.keras.optimizers.Adagrad(0.1))
        return model

For every loss and seed of the plan, `compare_model`:

- builds the task: `tfrs_logq.CorrectedRetrieval` with the loss's correction, accidental
  hits masked for every loss (the losses differ in the correction alone), which looks
  ``log Q(d)`` up by the ``candidate_ids`` it is passed: ``Q`` is the candidates'
  frequency in the training set (`tfrs_logq.ExactFrequency` of the ids under
  ``candidate_id``), the proposal of in-batch negatives. A ``candidate_sampling_probability``
  passed by the model is used instead;
- trains with common random numbers: `tf.keras.utils.set_random_seed` before ``model_fn``
  (the initial weights), the batches a function of the seed alone (the training set
  shuffled with the seed, batched with ``drop_remainder``), and Keras' random layers
  (Dropout, ...) drawing from `tf.random.Generator`s seeded in the same order: two losses
  of one seed share their batches, initial weights and dropout masks;
- trains through ``model.fit`` for a fixed number of steps, checkpointing the model, its
  optimizer, those generators and the step (`StepCheckpoint`); the step is the dataset's
  position (the batches are a function of the seed and the step), so a killed run goes on
  from its last checkpoint and ends as the uninterrupted run would;
- evaluates as the model will be served: every candidate embedded by the model's own
  candidate tower, the test queries by its query tower, exact top-k over all candidates,
  the query's history left out when the test set gives one (`tfrs_logq.metrics.target_ranks`,
  the served policy), Recall/NDCG at 10, 100 and 1000 below the catalog's size;
- writes what ``tfrs-logq compare`` writes (`tfrs_logq.studies.compare.runner.run_plan`: the same
  ``plan.json``, run directories, lock, ``results.csv``, ``curves.csv``, hits per test
  query at the last evaluation, a test user being a distinct query, and report).

Bad input is refused in one line naming the fix, before the output directory is made and
before any training: a ``model_fn`` that cannot be imported (its module missing, failing
to import or with a syntax error), does not take the task as its one argument, raises, or
does not return a compiled `tfrs.Model`; a model whose ``compute_loss`` never calls the
task it was given, or passes ``candidate_ids`` none of which is a candidate (a share of
them unknown to the training frequencies is a warning); candidates without ids, test
targets that are not candidates, training examples already batched; losses or seeds
given as one string, seeds that are not distinct integers. The user's own error is kept as
the refusal's cause (``raise ... from``): ``tfrs-logq --verbose`` prints its traceback.

``plan.json`` pins the model as well as the settings (`ModelFnConfig`): its source (the
code of the file that defines ``model_fn``, `model_source`) and its built architecture
(`architecture`); a rerun into the directory of a comparison whose model changed is
refused, naming which, rather than pooling two models' seeds in one verdict.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import inspect
import io
import json
import logging
import os
import sys
import time
import tokenize
import traceback
import types
from collections.abc import Mapping
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import tensorflow as tf
import tensorflow_recommenders as tfrs

from tfrs_logq._util.step_checkpoint import StepCheckpoint
from tfrs_logq.corrections import parse_loss_name
from tfrs_logq.frequency import ExactFrequency
from tfrs_logq.metrics import (
    popularity_bands,
    recall_ndcg_by_band,
    recall_ndcg_from_ranks,
    target_ranks,
)
from tfrs_logq.pipelines.splits import (
    MIN_RANKED_ITEMS,
    MIN_TEST_USERS,
    Split,
    check_evaluable,
    target_facts,
)
from tfrs_logq.proposal import standard_positive_share
from tfrs_logq.studies._grid import (
    check_output_dir,
)
from tfrs_logq.studies.compare.plan import (
    DEFAULT_SHUFFLE_BUFFER,
    CompareError,
    ModelFnConfig,
    Plan,
    read_plan_json,
)
from tfrs_logq.studies.compare.report import Margin, reporter
from tfrs_logq.studies.compare.runner import (
    FINAL_EMBEDDINGS,
    FINAL_RANKS,
    ServedIndex,
    Trainer,
    _duplicates,
    run_plan,
    window_row,
)
from tfrs_logq.tasks import CorrectedRetrieval
from tfrs_logq.towers.loop import checkpoint_key
from tfrs_logq.towers.training import _ks as cutoffs

EVAL_BATCH = 1024
Embedder = Union[str, Callable[[Any, Any], Any]]


# ---------------------------------------------------------------------------- the task

class ComparedTask(CorrectedRetrieval):
    """The task `compare_model` hands ``model_fn``: `CorrectedRetrieval` with one loss's
    correction and accidental hits masked (every loss alike), which takes ``log Q(d)``
    from ``frequency`` (the training set's `ExactFrequency`, keyed by the candidates' ids)
    of the ``candidate_ids`` it is passed, unless the model passes a sampling probability;
    it counts its calls (``calls``), so that a model that never calls it is refused before
    training."""

    def __init__(self, correction: str, frequency: ExactFrequency,
                 name: Optional[str] = None) -> None:
        super().__init__(correction=correction, remove_accidental_hits=True, name=name)
        self.calls = 0
        self.frequency = frequency
        self.recorded_ids: Optional[list] = None
        """a list while `compare_model` checks the model: the ids of each eager call"""

    def __call__(self, *args, **kwargs):
        self.calls += 1
        given = inspect.signature(self.call).bind_partial(*args, **kwargs).arguments
        if given.get("candidate_ids") is None:
            raise CompareError(
                "the model's compute_loss calls its task without candidate_ids: pass the "
                "positives' ids, self.task(query_embeddings, candidate_embeddings, "
                "candidate_ids=features[...]) (the task looks Q up by id and masks "
                "accidental hits).")
        ids = given["candidate_ids"]
        if self.recorded_ids is not None and tf.executing_eagerly():
            try:
                self.recorded_ids.append(np.asarray(tf.convert_to_tensor(ids)).reshape(-1))
            except (TypeError, ValueError):
                pass  # not a dense tensor: the frequency lookup refuses it
        if given.get("candidate_sampling_probability") is None and \
                given.get("candidate_log_sampling_probability") is None:
            kwargs["candidate_log_sampling_probability"] = self.frequency.log_q(
                given["candidate_ids"])
        return super().__call__(*args, **kwargs)


# ---------------------------------------------------------------------------- the data

def _describe(spec) -> str:
    text = " ".join(str(spec).split())
    return text if len(text) <= 160 else text[:157] + "..."


def _id_kind(dtype: tf.DType) -> Optional[str]:
    return "string" if dtype == tf.string else "integer" if dtype.is_integer else None


def _as_numpy_ids(values: np.ndarray) -> np.ndarray:
    """Ids as one numpy kind: bytes (``S``) or int64."""
    values = np.asarray(values)
    return values.astype(np.int64) if values.dtype.kind in "iu" else values.astype("S")


class _Ids:
    """Positions of ids in a vocabulary (sorted search): -1 where an id is not in it."""

    def __init__(self, ids: np.ndarray) -> None:
        self.ids = ids
        self.order = np.argsort(ids, kind="stable")
        self.sorted = ids[self.order]

    def positions(self, values: np.ndarray) -> np.ndarray:
        values = _as_numpy_ids(values)
        if values.dtype.kind != self.ids.dtype.kind:
            return np.full(values.shape, -1, np.int64)
        at = np.searchsorted(self.sorted, values).clip(max=len(self.sorted) - 1)
        found = self.sorted[at] == values
        return np.where(found, self.order[at], -1).astype(np.int64)


@dataclasses.dataclass
class _Data:
    """What `compare_model` reads of its three datasets, once."""

    train: tf.data.Dataset
    probe_batch: Any
    num_examples: int
    candidate_ids: np.ndarray
    candidate_batches: list
    query_batches: list
    targets: np.ndarray
    exclude: Optional[np.ndarray]
    counts: np.ndarray
    frequency: ExactFrequency
    candidate_log_q: np.ndarray
    facts: dict
    identity: dict
    query_users: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    """the index of each test target's query among the distinct queries (its test user)"""
    candidate_feature: str = ""
    """the feature of the training examples holding the positive's id (``candidate_id``)"""
    candidate_index: Optional["_Ids"] = None
    """the candidates' ids, searchable"""


def _read_candidates(candidates) -> tuple[np.ndarray, list]:
    spec = getattr(candidates, "element_spec", None)
    ok = (isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], tf.TensorSpec)
          and spec[0].shape.rank == 0 and _id_kind(spec[0].dtype) is not None)
    if not ok:
        raise CompareError(
            f"candidates must yield (id, features) pairs, the id a string or integer "
            f"scalar, as TFRS's index_from_dataset takes them (e.g. movies.map(lambda "
            f"title: (title, title))); received elements {_describe(spec)}: map each "
            f"candidate to (id, features).")
    ids = [b.numpy() for b in candidates.map(lambda i, f: i).batch(1 << 16)]
    ids = _as_numpy_ids(np.concatenate(ids)) if ids else np.zeros(0, np.int64)
    unique, counts = np.unique(ids, return_counts=True)
    if len(unique) < len(ids):
        raise CompareError(f"candidates hold the id {_shown(unique[counts > 1][0])} "
                           f"{counts.max()} times: give each candidate once.")
    if len(ids) < MIN_RANKED_ITEMS:
        raise CompareError(f"candidates hold {len(ids)} items: Recall@10 is 1.0 for any "
                           f"model below {MIN_RANKED_ITEMS}; give the whole catalog.")
    return ids, list(candidates.map(lambda i, f: f).batch(EVAL_BATCH))


def _read_training_ids(train, candidate_id: str, batch_size: int) -> np.ndarray:
    """The candidate id of every training example, in one pass."""
    spec = getattr(train, "element_spec", None)
    if spec is None:
        raise CompareError(f"train must be a tf.data.Dataset of training examples, "
                           f"received {type(train).__name__}.")
    if not isinstance(spec, dict) or candidate_id not in spec:
        names = sorted(spec) if isinstance(spec, dict) else _describe(spec)
        raise CompareError(
            f"train's examples have no feature {candidate_id!r} (their features: {names}): "
            f"give candidate_id= the feature holding the positive's id (a dict of features "
            f"per example, as TFRS's tutorials read MovieLens).")
    id_spec = spec[candidate_id]
    if not isinstance(id_spec, tf.TensorSpec) or _id_kind(id_spec.dtype) is None:
        raise CompareError(f"train's candidate id {candidate_id!r} must be a string or "
                           f"integer tensor, received {_describe(id_spec)}.")
    if id_spec.shape.rank != 0:
        raise CompareError(
            f"train must yield one example at a time (its candidate id {candidate_id!r} "
            f"has shape {id_spec.shape}): leave out .batch(); compare_model shuffles and "
            f"batches it (batch_size={batch_size}).")
    ids = train.map(lambda example: example[candidate_id], num_parallel_calls=tf.data.AUTOTUNE,
                    deterministic=False).batch(1 << 16).prefetch(2)
    ids = [b.numpy() for b in ids]
    return _as_numpy_ids(np.concatenate(ids)) if ids else np.zeros(0, np.int64)


def _read_test(test, kind: str, candidates: _Ids) -> tuple[list, np.ndarray,
                                                            Optional[np.ndarray], np.ndarray]:
    """``(query batches, target positions, history positions or None, the index of each
    target's query among the distinct queries, in the order they first appear)``."""
    spec = getattr(test, "element_spec", None)
    ok = isinstance(spec, tuple) and len(spec) in (2, 3) and all(
        isinstance(s, (tf.TensorSpec, tf.RaggedTensorSpec)) and _id_kind(s.dtype) == kind
        for s in spec[1:]) and spec[1].shape.rank == 0 and (
        len(spec) == 2 or spec[2].shape.rank == 1)
    if not ok:
        raise CompareError(
            f"test must yield (query features, target id) or (query features, target id, "
            f"history ids), the ids {kind}s like the candidates', the history a vector of "
            f"the ids to leave out of the ranking; received elements {_describe(spec)}.")
    queries = list(test.map(lambda *e: e[0]).batch(EVAL_BATCH))
    raw = [b.numpy() for b in test.map(lambda *e: e[1]).batch(1 << 16)]
    raw = _as_numpy_ids(np.concatenate(raw)) if raw else np.zeros(0, np.int64)
    targets = candidates.positions(raw)
    unknown = int(np.sum(targets < 0))
    if unknown:
        raise CompareError(
            f"{unknown:,} of the {len(targets):,} test targets are not candidates (the "
            f"first: {_shown(raw[targets < 0][0])}): the served index can never return them; "
            f"add them to the candidates or leave those queries out.")
    exclude = None
    if len(spec) == 3:
        parts = []
        for history, length in test.map(lambda *e: (e[2], tf.size(e[2]))).padded_batch(
                1 << 16):
            history, length = history.numpy(), length.numpy()
            at = candidates.positions(history.reshape(-1)).reshape(history.shape)
            parts.append(np.where(np.arange(history.shape[1])[None, :] < length[:, None],
                                  at, -1))
        width = max([p.shape[1] for p in parts] + [1])
        exclude = np.concatenate([np.pad(p, ((0, 0), (0, width - p.shape[1])),
                                         constant_values=-1) for p in parts]) \
            if parts else np.zeros((0, 1), np.int64)
    queries_seen: dict = {}
    query_users = []
    for batch in queries:
        rows = [np.asarray(t.to_list() if isinstance(t, tf.RaggedTensor) else t.numpy(),
                           dtype=object) for t in tf.nest.flatten(batch)]
        for i in range(len(rows[0]) if rows else 0):
            key = repr([r[i].tolist() if hasattr(r[i], "tolist") else r[i] for r in rows])
            query_users.append(queries_seen.setdefault(key, len(queries_seen)))
    return queries, targets, exclude, np.asarray(query_users, np.int64)


def _read_data(train, test, candidates, candidate_id, batch_size: int) -> _Data:
    candidate_ids, candidate_batches = _read_candidates(candidates)
    kind = "integer" if candidate_ids.dtype.kind in "iu" else "string"
    training_ids = _read_training_ids(train, candidate_id, batch_size)
    if len(training_ids) and training_ids.dtype.kind != candidate_ids.dtype.kind:
        raise CompareError(f"train's candidate ids are "
                           f"{'integers' if training_ids.dtype.kind in 'iu' else 'strings'} "
                           f"and the candidates' {kind}s: give both the same ids.")
    if len(training_ids) < batch_size:
        raise CompareError(f"batch_size {batch_size:,} is larger than the "
                           f"{len(training_ids):,} training examples: lower it.")
    seen, seen_counts = np.unique(training_ids, return_counts=True)
    vocabulary = np.unique(np.concatenate([candidate_ids, seen]))
    counts = np.zeros(len(vocabulary), np.float64)
    counts[np.searchsorted(vocabulary, seen)] = seen_counts
    frequency = ExactFrequency.from_counts(counts, ids=vocabulary)  # Q(d) = #d / N
    candidate_counts = counts[np.searchsorted(vocabulary, candidate_ids)]
    candidate_log_q = frequency.log_q(candidate_ids).numpy().astype(np.float64)
    index = _Ids(candidate_ids)
    queries, targets, exclude, query_users = _read_test(test, kind, index)
    num_queries = int(query_users.max()) + 1 if len(query_users) else 0
    if num_queries < MIN_TEST_USERS:
        raise CompareError(f"the test set has {num_queries} distinct query(ies) "
                           f"({len(targets)} targets): a metric over fewer than "
                           f"{MIN_TEST_USERS} measures one person, not the model.")
    cold = candidate_counts[targets] == 0
    if cold.all():
        raise CompareError("every test target is a candidate never seen in training "
                           "(cold): no trained model can rank it; test on items the "
                           "training set holds.")
    facts = {"num_targets": len(targets), "num_users": num_queries,
             "cold_share": float(cold.mean())}
    if exclude is not None:
        share = float(np.mean(np.any(exclude == targets[:, None], axis=1)))
        facts.update(repeat_share=share, sent_repeat_share=share)
    digest = hashlib.sha256()
    for array in (vocabulary, counts, candidate_ids, targets,
                  exclude if exclude is not None else np.zeros(0)):
        digest.update(np.ascontiguousarray(array).tobytes())
    identity = {"train_examples": int(len(training_ids)),
                "candidates": int(len(candidate_ids)), "test_queries": int(len(targets)),
                "digest": digest.hexdigest()[:16]}
    return _Data(train=train, probe_batch=next(iter(train.batch(batch_size))),
                 num_examples=int(len(training_ids)), candidate_ids=candidate_ids,
                 candidate_batches=candidate_batches, query_batches=queries,
                 targets=targets, exclude=exclude, counts=candidate_counts,
                 frequency=frequency, query_users=query_users,
                 candidate_log_q=candidate_log_q, facts=facts, identity=identity,
                 candidate_feature=candidate_id, candidate_index=index)


def training_batches(train: tf.data.Dataset, seed: int, batch_size: int,
                     shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
                     first_step: int = 0) -> tf.data.Dataset:
    """The batches every run of ``seed`` trains on, from ``first_step`` on: ``train``
    shuffled with ``seed`` (reshuffled every pass, repeated), cut into ``batch_size``
    batches (the last partial one of a pass joins the next pass). A function of the seed
    and the step alone: two losses of one seed train on the same batches, and a run
    resumed at step ``s`` reads the batches it would have."""
    return (train.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
            .repeat().batch(batch_size, drop_remainder=True).skip(first_step))


# ---------------------------------------------------------------------------- the model

def _raised(error: BaseException) -> str:
    """``"RuntimeError: text (my_models.py, line 12)"``: an exception of the user's code in
    a few words, where it was raised (its last frame) included."""
    text = " ".join(str(error).split())
    text = f"{type(error).__name__}: {text[:200]}" if text else type(error).__name__
    frames = traceback.extract_tb(error.__traceback__)
    library = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    own = [f for f in frames if "site-packages" not in f.filename
           and not os.path.abspath(f.filename).startswith(library + os.sep)]
    frame = (own or frames or [None])[-1]  # the user's deepest frame, else the last
    if frame is not None:
        text += f" ({os.path.basename(frame.filename)}, line {frame.lineno})"
    return text


def load_model_fn(spec: str, flag: str = "model_fn") -> Callable:
    """The function ``"module:function"`` names (the current directory on the path, as
    ``python -m`` has it), checked to take the task as its one argument, or a one-line
    error naming ``flag``: no such module, a file name given for it (``my_models.py``), a
    syntax error in it, a package it imports missing, an exception while importing it,
    no such function. The user's own error is the refusal's cause (``--verbose``)."""
    module_name, _, name = str(spec).partition(":")
    if not module_name or not name:
        raise CompareError(f"{flag} {spec!r} is not 'module:function' (e.g. my_models:build, "
                           f"with my_models.py in the current directory or installed).")
    if module_name.endswith(".py"):
        module = module_name[:-3].replace(os.sep, ".").replace("/", ".").strip(".")
        raise CompareError(f"{flag} {spec}: name the module, not its file: drop .py "
                           f"({flag} {module}:{name}, run from the directory that holds "
                           f"{module_name}).")
    here = os.getcwd()
    added = here not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, here)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise CompareError(f"{flag} {spec}: no module named {missing!r}; run from the "
                               f"directory that holds {module_name.replace('.', '/')}.py or "
                               f"install it (module:function).") from None
        raise CompareError(  # the module was found: one of its own imports is missing
            f"{flag} {spec}: module {module_name!r} imports {missing or str(error)!r}, which "
            f"is not installed in this environment ({sys.executable}): install it there, "
            f"or import it no more.") from error
    except SyntaxError as error:
        where = f"{os.path.basename(error.filename or module_name)}, line {error.lineno}"
        raise CompareError(f"{flag} {spec}: module {module_name!r} has a syntax error "
                           f"({where}: {error.msg}); fix it and run again.") from error
    except Exception as error:  # the module's own code failed as it was imported
        raise CompareError(f"{flag} {spec}: importing module {module_name!r} raised "
                           f"{_raised(error)}; fix it (--verbose shows the traceback).") \
            from error
    finally:
        if added:
            sys.path.remove(here)
    found = module
    for part in name.split("."):
        found = getattr(found, part, None)
    if not callable(found):
        raise CompareError(f"{flag} {spec}: module {module_name!r} has no function {name!r}; "
                           f"name the function that builds the model (model_fn(task) -> "
                           f"tfrs.Model).")
    check_model_fn_signature(found, spec, flag)
    return found


def check_model_fn_signature(model_fn: Callable, name: str, flag: str = "model_fn") -> None:
    """Refuses, in one line, a ``model_fn`` that cannot be called with the task alone."""
    try:
        signature = inspect.signature(model_fn)
    except (TypeError, ValueError):
        return  # a builtin or a C callable: its call says
    try:
        signature.bind(None)
    except TypeError:
        raise CompareError(
            f"{flag} {name} takes {_shown_signature(signature)}: it must take one argument, "
            f"the task, model_fn(task) -> tfrs.Model (compare builds each run's model "
            f"around the task of its loss).") from None


def _shown_signature(signature: inspect.Signature) -> str:
    text = str(signature)
    if text == "()":
        return "no arguments"
    return text if len(text) <= 80 else text[:77] + "..."


def _name(obj) -> str:
    if isinstance(obj, str):
        return obj
    return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', repr(obj))}"


def _shown(value) -> str:
    """An id or value as a message shows it: text for bytes, a plain number for numpy's."""
    if isinstance(value, (bytes, np.bytes_)):
        value = bytes(value).decode("utf-8", "replace")
    elif isinstance(value, np.generic):
        value = value.item()
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _source_file(model_fn) -> Optional[str]:
    """The file that defines ``model_fn`` (a partial's function, a decorated function's,
    a callable object's class), or None."""
    while isinstance(model_fn, functools.partial):
        model_fn = model_fn.func
    try:
        target = inspect.unwrap(model_fn)
    except ValueError:
        target = model_fn
    if not (inspect.isfunction(target) or inspect.ismethod(target) or inspect.isclass(target)):
        target = type(target)
    try:
        path = inspect.getsourcefile(target)
    except TypeError:
        return None
    return path if path and os.path.isfile(path) else None


def code_fingerprint(path: str) -> str:
    """sha256 of a Python file's tokens, comments and blank lines left out (an edit of a
    comment, or of the space between tokens, changes nothing that runs); a file Python
    cannot tokenize is hashed as it is."""
    with open(path, "rb") as f:
        data = f.read()
    digest = hashlib.sha256()
    skipped = (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING)
    layout = (tokenize.INDENT, tokenize.DEDENT, tokenize.NEWLINE)
    try:
        for token in tokenize.tokenize(io.BytesIO(data).readline):
            if token.type not in skipped:
                text = "" if token.type in layout else token.string
                digest.update(f"{token.type}\x00{text}\x01".encode())
    except (tokenize.TokenError, SyntaxError):
        return hashlib.sha256(data).hexdigest()
    return digest.hexdigest()


def model_source(model_fn) -> str:
    """What ``plan.json`` and the runs' checkpoints pin of ``model_fn``'s source: the file
    defining it and its `code_fingerprint` (``"my_models.py 3f0c..."``), so that the
    classes built there count as well as the function's body; ``"unknown"`` when the
    function has no source file. Comments and blank lines do not count (they change no
    result), every other edit does; code imported from other files is pinned by the model's
    `architecture` alone."""
    path = _source_file(model_fn)
    if path is None:
        return "unknown"
    return f"{os.path.basename(path)} {code_fingerprint(path)[:16]}"


_WIRING = ("inbound_nodes", "input_layers", "output_layers")
_UNPINNED = ("name", "batch_input_shape", "batch_shape", "build_config", "compile_config")


def _canonical(value, names: dict, wiring: bool = False):
    """A layer's or optimizer's configuration as JSON values, deterministically: no
    ``name`` (Keras numbers its names by what the process built before), a functional
    model's wiring by the layers' positions rather than names, no batch shape of the first
    call, arrays and numpy scalars as lists and numbers, any other object by its class."""
    if isinstance(value, Mapping):
        return {str(k): _canonical(v, names, wiring or k in _WIRING)
                for k, v in value.items() if k not in _UNPINNED}
    if isinstance(value, str):
        return f"<layer {names[value]}>" if wiring and value in names else value
    if isinstance(value, (bytes, np.bytes_)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, (bool, int, float)) or value is None:
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return _canonical(value.tolist(), names, wiring)
    if isinstance(value, tf.TensorShape):
        return value.as_list() if value.rank is not None else None
    if isinstance(value, tf.DType):
        return value.name
    if isinstance(value, (tf.Tensor, tf.Variable)) and hasattr(value, "numpy"):
        return _canonical(np.asarray(value.numpy()), names, wiring)
    if isinstance(value, (list, tuple)) or (
            hasattr(value, "__len__") and hasattr(value, "__getitem__")
            and not isinstance(value, tf.Module)):
        try:
            return [_canonical(v, names, wiring) for v in list(value)]
        except TypeError:
            pass
    return f"<{type(value).__qualname__}>"


def _shape(weight) -> Optional[list]:
    shape = tf.TensorShape(weight.shape)
    return shape.as_list() if shape.rank is not None else None


def architecture(model, task=None) -> str:
    """What ``plan.json`` pins of a built model: ``"N layers, P parameters, DIGEST"``, the
    digest a sha256 of every layer's class and configuration (`_canonical`), every
    weight's shape, dtype and trainability, in the model's own order, and its optimizer's
    configuration; ``task`` (the loss's task: the same model under every loss) and what it
    holds left out. Built twice the same, in one process or two, a model has one
    architecture."""
    left_out = set()
    if task is not None:
        left_out = {id(task)} | {id(m) for m in task.submodules}
    layers = [m for m in model.submodules if isinstance(m, tf.keras.layers.Layer)
              and id(m) not in left_out]
    names = {}
    for i, layer in enumerate([model, *layers]):
        names.setdefault(getattr(layer, "name", ""), i)
    names.pop("", None)
    described = []
    logger = tf.get_logger()  # a subclassed model's get_config warns that it has none
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        for layer in [model, *layers]:
            try:
                config = layer.get_config()
            except (NotImplementedError, TypeError, ValueError, AttributeError):
                config = None
            kind = f"{type(layer).__module__}.{type(layer).__qualname__}"
            described.append([kind, _canonical(config, names)])
    finally:
        logger.setLevel(level)
    task_weights = {id(w) for w in task.variables} if task is not None else set()
    weights = [w for w in model.weights if id(w) not in task_weights]
    shapes = [[_shape(w), tf.as_dtype(w.dtype).name, bool(w.trainable)] for w in weights]
    optimizer = getattr(model, "optimizer", None)
    try:
        optimizer_config = [type(optimizer).__qualname__,
                            _canonical(optimizer.get_config(), {})] if optimizer else None
    except (NotImplementedError, TypeError, ValueError, AttributeError):
        optimizer_config = [type(optimizer).__qualname__, None]
    text = json.dumps([described, shapes, optimizer_config], sort_keys=True)
    parameters = sum(int(np.prod(_shape(w))) for w in weights
                     if w.trainable and _shape(w) is not None and None not in _shape(w))
    return (f"{len(layers)} layers, {parameters:,} parameters, "
            f"{hashlib.sha256(text.encode()).hexdigest()[:16]}")


def _embedder(how: Embedder, role: str) -> Callable[[Any, Any], tf.Tensor]:
    if callable(how):
        return how

    def embed(model, features):
        tower = getattr(model, how, None)
        if tower is None or not callable(tower):
            raise CompareError(
                f"the model has no {role} tower {how!r}: pass {role}_model= the attribute "
                f"that embeds a {role} (TFRS's tutorials: query_model/candidate_model, "
                f"user_model/movie_model) or a function (model, features) -> embeddings.")
        return tower(features)
    return embed


def _embeddings(embed, model, batches: list, role: str) -> tf.Tensor:
    out = [tf.cast(embed(model, b), tf.float32) for b in batches]
    result = tf.concat(out, 0) if out else tf.zeros([0, 0])
    if result.shape.rank != 2:
        raise CompareError(f"the {role} tower returns embeddings of shape {result.shape}; "
                           f"compare ranks by dot product of [n, dim] embeddings.")
    return result


class _SeededRandomLayers:
    """Within the block, Keras' random layers (Dropout, ...) built draw from a
    `tf.random.Generator` seeded from `tf.keras.utils.set_random_seed`'s stream (in the
    order they are built), not from a process-wide op seed: their masks are then the same
    for every loss of a seed, and their state can be checkpointed (`_random_generators`)."""

    def __enter__(self):
        experimental = tf.keras.backend.experimental
        self.was = experimental.is_tf_random_generator_enabled()
        experimental.enable_tf_random_generator()
        return self

    def __exit__(self, *exc) -> None:
        if not self.was:
            tf.keras.backend.experimental.disable_tf_random_generator()


def _random_generators(model) -> list:
    """The `tf.random.Generator` of each random layer of ``model``: Keras leaves them out
    of its checkpoints, so they are saved beside the model, and a resumed run draws the
    masks the uninterrupted run would have."""
    found: list = []
    for layer in model.submodules:
        generator = getattr(getattr(layer, "_random_generator", None), "_generator", None)
        if isinstance(generator, tf.random.Generator) and all(generator is not g
                                                              for g in found):
            found.append(generator)
    return found


UNKNOWN_IDS_WARNING = 0.1
"""The share of a training batch's ``candidate_ids`` unknown to the training frequencies
above which `compare_model` warns (the positives' own ids are all known)."""


def _check_ids(recorded: list, data: _Data, say: Optional[Callable[[str], None]]) -> None:
    """Refuses ``candidate_ids`` (``recorded``: those the task was passed on the checked
    batch) none of which is a candidate; says a warning when more than
    `UNKNOWN_IDS_WARNING` of them are unknown to the training frequencies (they get the
    smallest log Q)."""
    recorded = [ids for ids in recorded if ids.size]
    if not recorded or data.candidate_index is None:
        return
    ids = _as_numpy_ids(np.concatenate(recorded))
    fix = (f"pass the positives' ids, candidate_ids=features[{data.candidate_feature!r}] (the "
           f"task looks Q up and masks accidental hits by these ids)")
    if bool(np.all(data.candidate_index.positions(ids) < 0)):
        raise CompareError(
            f"the candidate_ids the model passes its task are no candidate's (the first: "
            f"{_shown(ids[0])}; a candidate's: {_shown(data.candidate_ids[0])}): {fix}.")
    if say is None:
        return
    try:
        unknown = np.asarray(data.frequency.count(tf.constant(ids))) <= 0
    except (TypeError, ValueError, tf.errors.OpError):
        return
    if unknown.mean() > UNKNOWN_IDS_WARNING:
        say(f"compare: warning: {unknown.mean():.0%} of the candidate_ids the model passes "
            f"its task on a training batch are not in train's {data.candidate_feature!r} "
            f"(the first: {_shown(ids[unknown][0])}), so they get the smallest log Q; {fix}.")


def _embeddings_of(embed, model, batches: list, role: str) -> tf.Tensor:
    """`_embeddings` of the check: the user's tower failing is one line, the error kept as
    its cause."""
    try:
        return _embeddings(embed, model, batches, role)
    except CompareError:
        raise
    except Exception as error:
        raise CompareError(f"the model's {role} tower failed on the {role} features "
                           f"compare gives it ({_raised(error)}); it is called with "
                           f"{'the test set' if role == 'query' else 'the candidates'}'s "
                           f"features.") from error


def _check_model(model, query_embed, candidate_embed, data: _Data, task: ComparedTask,
                 model_fn_name: str, say: Optional[Callable[[str], None]] = None) -> dict:
    """Refuses, in one line (``model_fn_name``: how it names the function, its flag
    first), a model `compare_model` cannot train or evaluate, or whose
    ``candidate_ids`` are no candidates' (`_check_ids`; ``say``: where its warning goes,
    None for none); returns what the plan records of it (optimizer, learning rate,
    embedding size, `architecture`)."""
    if not isinstance(model, tfrs.models.Model):
        raise CompareError(
            f"{model_fn_name} returned a {type(model).__name__}, not a tfrs.Model: "
            f"return the tfrs.Model built around its task argument (class M(tfrs.Model) "
            f"with self.task = task).")
    if not getattr(model, "_is_compiled", False) or model.optimizer is None:
        raise CompareError(
            f"{model_fn_name} returned a model that is not compiled: compile it "
            f"there, e.g. model.compile(optimizer=tf.keras.optimizers.Adagrad(0.1)) "
            f"(compare trains it with model.fit).")
    per_execution = getattr(model, "_steps_per_execution", None)
    if per_execution is not None and int(per_execution.numpy()) != 1:
        raise CompareError("model_fn compiled the model with steps_per_execution > 1: "
                           "leave it at 1 (compare evaluates and checkpoints at exact "
                           "steps).")
    task.recorded_ids = []
    try:
        model.compute_loss(data.probe_batch, training=False)
    except CompareError:
        raise
    except Exception as error:  # the user's code on our batch: say what the batch held
        dimensions = _tower_dimensions(model, query_embed, candidate_embed, data)
        if dimensions is not None:
            raise dimensions from error
        raise CompareError(
            f"the model's compute_loss failed on a batch of the training set "
            f"({type(error).__name__}: {' '.join(str(error).split())[:200]}); its examples "
            f"hold {_describe(data.train.element_spec)}.") from error
    finally:
        recorded, task.recorded_ids = task.recorded_ids, None
    if task.calls == 0:
        raise CompareError(
            f"the model of {model_fn_name} never calls the task it was given: its "
            f"compute_loss uses another; build the model around the task argument "
            f"(self.task = task) and return self.task(...) from compute_loss.")
    _check_ids(recorded, data, say)
    queries = _embeddings_of(query_embed, model, data.query_batches[:1], "query")
    items = _embeddings_of(candidate_embed, model, data.candidate_batches[:1], "candidate")
    if queries.shape[1] != items.shape[1]:
        raise _dimension_error(queries.shape[1], items.shape[1])
    optimizer = model.optimizer
    try:
        rate = optimizer.learning_rate
        rate = float(f"{float(rate.numpy() if hasattr(rate, 'numpy') else rate):.6g}")
    except (TypeError, ValueError, AttributeError):
        rate = None
    return {"optimizer": type(optimizer).__name__, "learning_rate": rate,
            "embedding_dim": int(items.shape[1]), "architecture": architecture(model, task)}


def _dimension_error(query_dim, candidate_dim) -> CompareError:
    return CompareError(f"the query tower's embeddings have {query_dim} dimensions and the "
                        f"candidate tower's {candidate_dim}: a dot product needs the same "
                        f"size.")


def _tower_dimensions(model, query_embed, candidate_embed, data: _Data):
    """The `_dimension_error` of towers whose embeddings differ in size (why a
    compute_loss fails in its dot product), or None."""
    try:
        queries = _embeddings(query_embed, model, data.query_batches[:1], "query")
        items = _embeddings(candidate_embed, model, data.candidate_batches[:1], "candidate")
    except Exception:  # the towers fail too: the compute_loss error says it
        return None
    if queries.shape[1] != items.shape[1]:
        return _dimension_error(queries.shape[1], items.shape[1])
    return None


# ---------------------------------------------------------------------------- training

class _Batches(tf.keras.callbacks.Callback):
    """Calls ``on_batch(step, logs)`` after each step ``model.fit`` trains (0-based,
    counted from the run's first step)."""

    def __init__(self, first_step: int, on_batch: Callable[[int, dict], None]) -> None:
        super().__init__()
        self.first_step, self.on_batch = first_step, on_batch

    def on_train_batch_end(self, batch, logs=None) -> None:
        self.on_batch(self.first_step + int(batch), logs or {})


class _QuietSlowCallback(logging.Filter):
    """Drops Keras' warning that a callback is slower than a step: evaluating and saving a
    checkpoint at some steps is what `_Batches` is for."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "is slow compared to the batch time" not in record.getMessage()


class _ModelFnTrainer:
    """Builds, trains and evaluates the runs of a user's model (`Trainer.train`)."""

    def __init__(self, plan: Plan, model_fn: Callable, data: _Data, query_model: Embedder,
                 candidate_model: Embedder, checkpoint_seconds: float, extra: dict,
                 flag: str = "model_fn") -> None:
        self.plan, self.model_fn, self.data = plan, model_fn, data
        self.query_embed = _embedder(query_model, "query")
        self.candidate_embed = _embedder(candidate_model, "candidate")
        self.checkpoint_seconds = float(checkpoint_seconds)
        self.extra = extra
        self.ks = cutoffs(len(data.candidate_ids))
        self.target_bands = popularity_bands(data.counts)[data.targets]
        self.code = model_source(model_fn)  # the plan's model_source, the checkpoints' key
        self.name = f"{flag} {_name(model_fn)}"  # as messages name it

    def build(self, loss: str, seed: int, batch_size: int, shuffle_buffer: int,
              say: Optional[Callable[[str], None]] = None):
        """``(model, task, batches, facts)`` of a run: the seed set, then the task, the
        batches (`training_batches`) and the model (``model_fn(task)``: an exception of it
        is one line, `_raised`), checked and built on a batch (`_check_model`, whose
        ``facts`` these are; ``say``: where its warnings go)."""
        task = ComparedTask(parse_loss_name(loss, None).correction, self.data.frequency)
        with _SeededRandomLayers():
            tf.keras.utils.set_random_seed(seed)
            batches = training_batches(self.data.train, seed, batch_size, shuffle_buffer)
            try:
                model = self.model_fn(task)
            except CompareError:
                raise
            except Exception as error:  # the user's code: one line, its traceback the cause
                raise CompareError(f"{self.name} raised {_raised(error)} when "
                                   f"called with the task; fix it (--verbose shows the "
                                   f"traceback).") from error
            facts = _check_model(model, self.query_embed, self.candidate_embed, self.data,
                                 task, self.name, say)
        return model, task, batches, facts

    def evaluate(self, model, steps: int) -> tuple[dict, tf.Tensor, tf.Tensor, np.ndarray]:
        items = _embeddings(self.candidate_embed, model, self.data.candidate_batches,
                            "candidate")
        queries = _embeddings(self.query_embed, model, self.data.query_batches, "query")
        ranks = target_ranks(queries, items, self.data.targets, exclude=self.data.exclude,
                             padding_id=None, chunk_size=EVAL_BATCH)
        metrics = recall_ndcg_from_ranks(ranks, self.ks)
        metrics.update(recall_ndcg_by_band(ranks, self.target_bands, self.ks))
        return {"steps": steps, **metrics}, queries, items, np.asarray(ranks, np.int64)

    def positive_share(self, queries: tf.Tensor, items: tf.Tensor) -> dict:
        """The regime, as the built-in two-tower reports it
        (`tfrs_logq.towers.training.positive_share`): quantiles of the trained model's
        ``P(p|u)`` over all candidates and of the positive's share of the standard logQ
        denominator, ``(P/Q) / (P/Q + n)``, ``n`` the batch's negatives."""
        log_p = []
        for start in range(0, len(self.data.targets), EVAL_BATCH):
            scores = tf.matmul(queries[start:start + EVAL_BATCH], items, transpose_b=True)
            column = tf.constant(self.data.targets[start:start + EVAL_BATCH])
            log_p.append((tf.gather(scores, column, batch_dims=1)
                          - tf.reduce_logsumexp(scores, axis=1)).numpy())
        log_p = np.concatenate(log_p) if log_p else np.zeros(0)
        p_over_q = np.exp(log_p - self.data.candidate_log_q[self.data.targets])
        share = np.asarray(standard_positive_share(p_over_q, self.plan.config.batch_size))
        out = {}
        for q in (10, 50, 90):
            out[f"model_p_q{q}"] = float(np.percentile(np.exp(log_p), q)) if len(log_p) else 0.0
            out[f"positive_share_q{q}"] = float(np.percentile(share, q)) if len(share) else 0.0
        return out

    def train(self, loss, seed, run_dir, on_eval, on_step, evaluations) -> dict:
        config = self.plan.run_config(loss, seed)
        done = {int(r["steps"]) for r in evaluations}
        model, _, batches, facts = self.build(loss, seed, config.batch_size,
                                              config.shuffle_buffer)
        if facts["architecture"] != config.architecture:
            raise CompareError(
                f"{self.name} built another model for {loss}, seed {seed} "
                f"({facts['architecture']}) than the plan's ({config.architecture}): build "
                f"the same model on every call, whatever the task's loss.")
        weights = model.trainable_variables
        if callable(getattr(model.optimizer, "build", None)):
            model.optimizer.build(weights)  # slots exist before a restore
        generators = _random_generators(model)
        checkpoint = StepCheckpoint(
            run_dir, f"{checkpoint_key(config)}|model_fn_source={self.code}",
            self.checkpoint_seconds, model=model, optimizer=model.optimizer,
            **({"random_generators": generators} if generators else {}))
        first = checkpoint.restore()
        batches = batches.skip(first)  # the dataset's position: the step restored
        eval_at = set(config.eval_steps[:-1])
        state = {"loss": float("nan"), "start": time.perf_counter(), "saving": 0.0}

        def timing(step: int) -> dict:
            timed = step - first - 1
            spent = time.perf_counter() - state["start"] - state["saving"]
            per_step = spent / timed if timed > 0 else float("nan")
            return {"seconds_per_step": round(per_step, 5) if np.isfinite(per_step) else None,
                    "resumed_from_step": first}

        def on_batch(i: int, logs: dict) -> None:
            state["loss"] = float(logs.get("loss", float("nan")))
            if i == first:  # the first step traces the function: not timed
                state["start"] = time.perf_counter()
            if i + 1 in eval_at and i + 1 not in done:
                began = time.perf_counter()
                row, _, _, _ = self.evaluate(model, i + 1)
                on_eval({**row, **timing(i + 1)})
                state["saving"] += time.perf_counter() - began
            if i + 1 < config.steps:
                before = checkpoint.seconds_saving
                checkpoint.step_done(i + 1)
                state["saving"] += checkpoint.seconds_saving - before
            on_step(i)

        if first < config.steps:
            quiet = _QuietSlowCallback()
            tf.get_logger().addFilter(quiet)
            try:
                model.fit(batches, steps_per_epoch=config.steps - first, epochs=1,
                          verbose=0, callbacks=[_Batches(first, on_batch)])
            finally:
                tf.get_logger().removeFilter(quiet)
            checkpoint.save(config.steps)  # a kill while evaluating does not repeat training
        last, queries, items, ranks = self.evaluate(model, config.steps)
        last.update(timing(config.steps))
        last.update(self.positive_share(queries, items))
        last.update(self.data.facts)
        finite = (first >= config.steps or np.isfinite(state["loss"])) and all(
            bool(np.all(np.isfinite(w.numpy()))) for w in model.trainable_variables)
        last["diverged"] = int(not finite)
        if config.steps not in done:
            on_eval(last)
        return {**window_row(self.plan, loss, seed, evaluations, last), **self.extra,
                FINAL_RANKS: ranks,
                FINAL_EMBEDDINGS: (np.asarray(items, np.float32),
                                   np.asarray(queries, np.float32))}


# ---------------------------------------------------------------------------- the API

def compare_model(
    model_fn: Union[Callable[[CorrectedRetrieval], tfrs.Model], str],
    train: tf.data.Dataset,
    test: tf.data.Dataset,
    candidates: tf.data.Dataset,
    *,
    candidate_id: str,
    query_model: Embedder = "query_model",
    candidate_model: Embedder = "candidate_model",
    losses: Sequence[str] = ("inbatch-logq-tfrs", "inbatch-logq-official", "inbatch-corrected"),
    seeds: Sequence[int] = (0, 1, 2),
    steps: int = 3000,
    eval_every: int = 500,
    window: Optional[int] = None,
    batch_size: int = 512,
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
    baseline: Optional[str] = None,
    output_dir: str = "compare_output",
    margin: Optional[str] = None,
    primary_metric: Optional[str] = None,
    primary_baseline: Optional[str] = None,
    max_runs: Optional[int] = None,
    source: str = "",
    checkpoint_seconds: float = 120.0,
    say: Callable[[str], None] = print,
    served_index: Optional[ServedIndex] = None,
    tracking=None,
) -> list[dict]:
    """Compares the corrected logQ loss with the standard ones on your own `tfrs.Model`,
    paired by seed, and writes what ``tfrs-logq compare`` writes into ``output_dir``.

    Your model is a TFRS tutorial's with two changes: it is built around the task it is
    given, and it passes the positives' ids to it, ``self.task(query_embeddings,
    candidate_embeddings, candidate_ids=features["movie_title"])``; the task looks up
    ``Q(d)``, the candidates' frequency in ``train``, by id. ``model_fn`` compiles the
    model (its optimizer). Each loss x seed run is built after
    ``tf.keras.utils.set_random_seed(seed)``, trains ``steps`` steps of ``model.fit`` on
    the seed's batches (common random numbers: the runs of one seed share batches, initial
    weights and dropout masks) with a checkpoint every ``checkpoint_seconds`` (a killed
    comparison goes on from it when called again), and is scored every ``eval_every``
    steps by exact top-k over all candidates' embeddings, as served; its result is the
    mean of its last ``window`` evaluations. See docs/compare.md ("Your own TFRS model").

    Args:
      model_fn: ``model_fn(task) -> tfrs.Model``, compiled, its ``compute_loss`` returning
        ``task(...)``; or ``"module:function"`` naming one.
      train: `tf.data.Dataset` of single training examples (not batched: it is shuffled
        with the seed and batched by ``batch_size``), as ``compute_loss`` takes them.
      test: `tf.data.Dataset` of ``(query features, target id)`` or ``(query features,
        target id, history ids)``: the features the query tower takes, the id of the
        candidate to find, and optionally the ids to leave out of the ranking (what the
        served ``top_k`` is sent as the history: a target among them is a miss).
      candidates: `tf.data.Dataset` of ``(id, features)``: every candidate once, its
        features as the candidate tower takes them (TFRS's ``index_from_dataset`` form).
      candidate_id: str. The feature of ``train``'s examples (dicts of features, as TFRS's
        tutorials read MovieLens) holding the positive's id, one of the candidates' ids
        (``"movie_title"``); ``Q`` is its frequency.
      query_model: str or callable. The model's attribute that embeds a query (called with
        the test set's query features), or ``f(model, features) -> [n, dim]``. Defaults to
        ``"query_model"``.
      candidate_model: str or callable. The same for candidates (called with their
        features). Defaults to ``"candidate_model"``.
      losses: the losses compared, ``inbatch-`` + ``none``/``logq-tfrs``/``logq-official``/
        ``corrected`` (`tfrs_logq.studies.compare.plan.TFRS_MODEL_LOSSES`); the first is the
        baseline unless ``baseline``.
      seeds: one pair per seed. Defaults to (0, 1, 2).
      steps: training steps of every run (fixed: no early stopping). Defaults to 3000.
      eval_every: evaluate every this many steps (and at the last). Defaults to 500.
      window: a run's result is the mean of its last this many evaluations. Defaults to
        3, or every evaluation when fewer.
      batch_size: training examples per step. Defaults to 512.
      shuffle_buffer: the training set's shuffle buffer. Defaults to 100,000.
      baseline: the loss the others are paired against. Defaults to the first.
      output_dir: where plan.json, results.csv, curves.csv, report.md and the charts go
        (a rerun goes on; another plan is refused, and so is another model: plan.json
        pins the source of the file defining ``model_fn``, comments aside, and the built
        model's architecture). Defaults to ``"compare_output"``.
      margin: the equivalence margin, an absolute difference (``"0.002"``) or a share of
        the reference's value (``"2%"``). Defaults to the report's
        (`tfrs_logq.studies.compare.report.DEFAULT_MARGIN`).
      max_runs: train at most this many unfinished runs, then stop. Defaults to all.
      source: words naming the data in the report. Defaults to none.
      checkpoint_seconds: the least time between two checkpoints of a run. Defaults to 120.
      say: where progress lines go. Defaults to `print`.
      served_index: ``served_index(item_embeddings, query_embeddings, ks) -> record``,
        called on the final model of each loss at the first seed with every candidate's
        embedding and the test queries' (those its exact evaluation ranks), its record
        kept in ``served_index.json`` and said in the report
        (`tfrs_logq.studies.compare.runner.run_plan`;
        `tfrs_logq.serving.served_recall.served_recall` measures the index ``tfrs-logq
        export --index auto`` builds). Defaults to None: not measured.
      tracking: `tfrs_logq._util.tracking.Tracking` (`tracking(True)` makes one from
        ``MLFLOW_TRACKING_URI``): the comparison is also an MLflow parent run, each run a
        child. Defaults to None.

    Returns:
      The rows of ``results.csv``: one per finished loss and seed.

    Raises:
      tfrs_logq.studies.compare.plan.CompareError: bad input (one line naming the fix; an error
        of your own code is its ``__cause__``), before the output directory is made and
        before any training; an ``output_dir`` of a comparison whose model's source or
        architecture changed, before any training.
    """
    return _compare(model_fn, train, test, candidates, candidate_id=candidate_id,
                    query_model=query_model, candidate_model=candidate_model, losses=losses,
                    seeds=seeds, steps=steps, eval_every=eval_every, window=window,
                    batch_size=batch_size, shuffle_buffer=shuffle_buffer, baseline=baseline,
                    output_dir=output_dir, margin=margin, primary_metric=primary_metric,
                    primary_baseline=primary_baseline, max_runs=max_runs, source=source,
                    checkpoint_seconds=checkpoint_seconds, say=say, served_index=served_index,
                    tracking=tracking)


def _compare(model_fn, train, test, candidates, *, data_identity: Optional[dict] = None,
             facts: Optional[dict] = None, extra: Optional[dict] = None,
             model_fn_flag: str = "model_fn", **given) -> list[dict]:
    """`compare_model` (``given``: its keyword arguments; the others take its defaults),
    with what a log adds (`compare_split`): its identity and facts (``data_identity``,
    ``facts``), columns for every row (``extra``), the flag that names ``model_fn``."""

    o = _options(given)
    check_output_dir(o.output_dir)
    margin = o.margin if o.margin is None or isinstance(o.margin, Margin) else Margin(o.margin)
    name = _name(model_fn)
    if isinstance(model_fn, str):
        model_fn = load_model_fn(model_fn, model_fn_flag)
    elif not callable(model_fn):
        raise CompareError(f"model_fn must be a function model_fn(task) -> tfrs.Model or "
                           f"'module:function', received {type(model_fn).__name__}.")
    else:
        check_model_fn_signature(model_fn, name, model_fn_flag)
    # The plan (losses, seeds, baseline, window) is checked before the data is read.
    plan = _initial_plan(o, name)
    config = plan.config
    data = _read_data(train, test, candidates, o.candidate_id, o.batch_size)
    data.facts.update(facts or {})
    trainer = _ModelFnTrainer(plan, model_fn, data, o.query_model, o.candidate_model,
                              o.checkpoint_seconds, extra or {}, model_fn_flag)
    # The model checked (and measured) before the output directory is made.
    _, _, _, measured = trainer.build(plan.losses[0], plan.seeds[0], o.batch_size,
                                      o.shuffle_buffer, say=o.say)
    history = 0 if data.exclude is None else int(data.exclude.shape[1])
    config = dataclasses.replace(config, loss=plan.losses[0], history_length=history,
                                 exclude_seen=data.exclude is not None,
                                 model_source=trainer.code, **measured)
    plan = trainer.plan = dataclasses.replace(
        plan, config=config, data={**(data_identity or {}), **data.identity})
    _check_same_model(plan, o.output_dir, trainer.name,
                      "--output-dir" if model_fn_flag.startswith("--") else "output_dir=")
    o.say(f"compare: your model ({name}): {data.num_examples:,} training examples, "
          f"{len(data.candidate_ids):,} candidates, {len(data.targets):,} test queries; "
          f"{config.optimizer}, embeddings of {config.embedding_dim}")
    return run_plan(plan, o.output_dir, Trainer(
        catalog=f"compare: {len(data.candidate_ids):,} candidates, {len(data.targets):,} "
                f"test targets, {data.num_examples:,} training examples",
        key=lambda loss, seed: plan.run_config(loss, seed).run_id, train=trainer.train,
        test_users=data.query_users),
        say=o.say, max_runs=o.max_runs, served_index=o.served_index,
        report=reporter(margin, (o.primary_metric, o.primary_baseline)), tracking=o.tracking)


def _options(given: dict) -> types.SimpleNamespace:
    """`compare_model`'s keyword arguments ``given``, the others at their defaults."""
    parameters = inspect.signature(compare_model).parameters
    unknown = sorted(set(given) - set(parameters))
    if unknown:
        raise TypeError(f"compare_model() got an unexpected keyword argument {unknown[0]!r}")
    return types.SimpleNamespace(**{**{n: p.default for n, p in parameters.items()
                                       if p.default is not inspect.Parameter.empty}, **given})


def _listed(values, what: str, example: str) -> tuple:
    """``values`` as a tuple, refused when it is one string or not a list, or names a value
    twice (it would be one run)."""
    if isinstance(values, (str, bytes)):
        raise CompareError(f"`{what}` must be a list, received the string "
                           f"{_shown(values)}: write {what}={example}.")
    try:
        values = tuple(values)
    except TypeError:
        raise CompareError(f"`{what}` must be a list, received {_shown(values)}: write "
                           f"{what}={example}.") from None
    for i, value in enumerate(values):
        if any(type(value) is type(v) and value == v for v in values[:i]):
            raise CompareError(f"`{what}` names {_shown(value)} twice: a run named twice "
                               f"would be one run; give each once.")
    return values


def _initial_plan(o: types.SimpleNamespace, name: str) -> Plan:
    """The plan of `compare_model`'s arguments ``o``, before the data and the model are
    read: losses and seeds (lists, each given once, the seeds integers), the baseline,
    steps and window checked."""
    losses = _listed(o.losses, "losses", "('inbatch-logq-tfrs', 'inbatch-corrected')")
    bad = [loss for loss in losses if not isinstance(loss, str)]
    if bad:
        raise CompareError(f"`losses` must be loss names, received {_shown(bad[0])} (a "
                           f"{type(bad[0]).__name__}).")
    seeds = _listed(o.seeds, "seeds", "(0, 1, 2)")
    bad = [s for s in seeds if isinstance(s, (bool, np.bool_))
           or not isinstance(s, (int, np.integer))]
    if bad:
        raise CompareError(f"`seeds` must be integers, received {_shown(bad[0])} (a "
                           f"{type(bad[0]).__name__}): write seeds=(0, 1, 2).")
    if len({int(s) for s in seeds}) < len(seeds):
        raise CompareError("`seeds` names a seed twice: a run named twice would be one run; "
                           "give each once.")
    config = ModelFnConfig(steps=o.steps, batch_size=o.batch_size, eval_every=o.eval_every,
                           shuffle_buffer=o.shuffle_buffer, model_fn=name,
                           query_model=_name(o.query_model),
                           candidate_model=_name(o.candidate_model))
    return Plan(losses=losses, seeds=tuple(int(s) for s in seeds), config=config,
                window=o.window or min(3, len(config.eval_steps)), baseline=o.baseline or "",
                model="tfrs-model", source=o.source)


def check_arguments(**given) -> None:
    """Refuses, before any data is read, what `compare_model` refuses of its settings
    alone (``given``: its keyword arguments): the losses, seeds, baseline, steps and
    window (``tfrs-logq compare tfrs-model`` checks them before it reads the log)."""
    _initial_plan(_options(given), "")


_PINNED = (("model_source", "source"), ("architecture", "architecture"))


def _check_same_model(plan: Plan, output_dir: str, name: str, output_flag: str) -> None:
    """Refuses, in one line naming what changed (the source of ``model_fn``, its built
    architecture, or both) and how to start a new directory (``output_flag``), a rerun
    into a directory whose comparison trained another model: its seeds and this model's
    would be pooled in one verdict."""

    saved = read_plan_json(output_dir) if os.path.isdir(output_dir) else None
    if saved is None or saved["fixed"].get("model") != "tfrs-model":
        return  # no comparison yet, or another model's (run_plan names it)
    old = saved["fixed"]["config"]
    if not any(key in old for key, _ in _PINNED):
        raise CompareError(
            f"{output_dir} holds a comparison whose plan.json does not pin its model's "
            f"source and architecture (written by an earlier version): this model cannot "
            f"be checked against its runs; give a new {output_flag} (--report-only still "
            f"reads it).")
    changed = [(what, old.get(key, "(none)"), getattr(plan.config, key))
               for key, what in _PINNED if old.get(key) != getattr(plan.config, key)]
    if changed:
        words = " and ".join(what for what, _, _ in changed)
        details = "; ".join(f"{what} {was} there, {now} now" for what, was, now in changed)
        raise CompareError(
            f"{output_dir} holds runs of another model: {name}'s {words} changed "
            f"({details}), and new seeds would be pooled with its in one verdict; give a "
            f"new {output_flag} for this model, or restore the one it ran.")


# ---------------------------------------------------------------------------- a log

def log_datasets(split: Split, history_length: int = 50,
                 exclude_seen: bool = True) -> tuple[tf.data.Dataset, tf.data.Dataset,
                                                     tf.data.Dataset]:
    """``(train, test, candidates)`` of a log's `Split` as `compare_model` takes them, the
    log's ids as text (``tfrs-logq compare tfrs-model --model-fn``):

    - ``train``: every training interaction, ``{"user_id": tf.string, "item_id": tf.string}``
      (``candidate_id="item_id"``);
    - ``test``: ``(user id, target item id, history)`` per test target, the history the
      last ``history_length`` items before it (what a request sends, left out of the
      ranking), padded with ``""``; without the history when not ``exclude_seen``;
    - ``candidates``: ``(item id, item id)`` for every item of the catalog.
    """
    from tfrs_logq.pipelines.sequential import evaluation_arrays

    inter = split.interactions
    users = np.asarray([str(u) for u in inter.raw_users], dtype=str)
    items = np.asarray([""] + [str(i) for i in inter.raw_items], dtype=str)
    lengths = np.asarray(split.train_lengths, np.int64)
    train_users = np.repeat(np.arange(len(lengths)), lengths)
    train_items = (np.concatenate([s[:n] for s, n in zip(split.sequences, lengths)])
                   if len(lengths) else np.zeros(0, np.int64))
    train = tf.data.Dataset.from_tensor_slices(
        {"user_id": users[train_users], "item_id": items[train_items]})
    arrays = evaluation_arrays(split, split.test, history_length, exclude_seen)
    parts = (users[split.test.users], items[arrays["targets"]])
    if exclude_seen:
        parts += (items[arrays["history"]],)
    candidates = tf.data.Dataset.from_tensor_slices((items[1:], items[1:]))
    return train, tf.data.Dataset.from_tensor_slices(parts), candidates


def compare_split(model_fn, split: Split, *, history_length: int = 50,
                  exclude_seen: bool = True, data_identity: Optional[dict] = None,
                  model_fn_flag: str = "model_fn", **options) -> list[dict]:
    """`compare_model` on a log's `Split` (``tfrs-logq compare tfrs-model --model-fn``): its
    `log_datasets` (``candidate_id="item_id"``), the report's facts from the split (test
    users, repeat and cold targets, duplicates), ``data_identity`` (the file and its
    preprocessing) in the plan; ``options``: `compare_model`'s keyword arguments."""

    check_evaluable(split, split.test)
    train, test, candidates = log_datasets(split, history_length, exclude_seen)
    return _compare(model_fn, train, test, candidates, candidate_id="item_id",
                    data_identity=data_identity, model_fn_flag=model_fn_flag,
                    facts=target_facts(split, split.test, history_length),
                    extra=_duplicates(split), **options)


__all__ = ["ComparedTask", "UNKNOWN_IDS_WARNING",
           "architecture", "check_arguments", "check_model_fn_signature", "code_fingerprint",
           "compare_model", "compare_split", "load_model_fn", "log_datasets", "model_source",
           "training_batches"]
