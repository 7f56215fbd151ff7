"""The two-tower trainer on several replicas (`TwoTowerConfig.strategy`): on the conftest's
two logical CPUs (``mirrored``) and as a cluster of two worker processes on loopback
(``multi-worker``, ``TF_CONFIG``), a run follows the one-device run on the same global
batches (its training loss at every evaluation, its final weights) within float rounding;
a resumed run ends as the uninterrupted one; a worker killed mid-training and the cluster
started again resume from the chief's checkpoint and end as an uninterrupted cluster run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tfrs_logq._util.strategy import free_ports
from tfrs_logq.pipelines.user_log import UserLogSource, load_user_log_split
from tfrs_logq.serving.export import load_trained
from tfrs_logq.towers import run as tower_run
from tfrs_logq.towers.config import TwoTowerConfig

CONFIG = TwoTowerConfig(loss="mns-corrected", steps=24, batch_size=32, embedding_dim=8,
                        history_length=5, learning_rate=2e-2, eval_every=4, num_negatives=16)


def write_log(path, num_users=120, seed=0):
    """A CSV of text ids (``u7``, ``film-42``): users read items of one of 4 topics."""
    rng = np.random.default_rng(seed)
    lines = ["user,item,ts"]
    for u in range(num_users):
        for t in range(12):
            lines.append(f"u{u},film-{int(rng.integers(0, 15)) * 4 + u % 4},{u * 100 + t}")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def log_split(tmp_path_factory):
    path = write_log(tmp_path_factory.mktemp("log") / "log.csv")
    source = UserLogSource(path, "user", "item", time_column="ts")
    data = {"interactions": path, "user_column": "user", "item_column": "item",
            "time_column": "ts", "split": "temporal"}
    return load_user_log_split(source, "temporal"), data


def _curve(result_or_dir) -> list:
    if isinstance(result_or_dir, dict):
        rows = result_or_dir["evaluations"]
    else:
        rows = json.load(open(os.path.join(result_or_dir, "evaluations.json")))
    return [r["train_loss"] for r in sorted(rows, key=lambda r: r["steps"])]


def _weights(model_dir) -> list:
    encoder, _, _ = load_trained(model_dir)
    return [encoder.item_embeddings().numpy()] + [
        w.numpy() for w in encoder.model.query_tower.weights]


def test_mirrored_two_replicas_follow_the_one_device_run(log_split, tmp_path,
                                                         mirrored_strategy):
    assert mirrored_strategy.num_replicas_in_sync == 2
    split, data = log_split
    one = tower_run.train_run(CONFIG, split, str(tmp_path / "one"), data)
    mirrored = dataclasses.replace(CONFIG, strategy="mirrored")
    two = tower_run.train_run(mirrored, split, str(tmp_path / "two"), data)
    assert len(_curve(one)) == 6
    np.testing.assert_allclose(_curve(two), _curve(one), rtol=1e-4)
    for a, b in zip(_weights(tmp_path / "two"), _weights(tmp_path / "one")):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)
    # Each replica's own negatives are another loss: the check above can fail.
    local = dataclasses.replace(mirrored, cross_replica_negatives=False)
    own = tower_run.train_run(local, split, str(tmp_path / "own"), data)
    assert not np.allclose(_curve(own), _curve(one), rtol=1e-3)


def test_a_mirrored_run_killed_and_resumed_ends_as_the_uninterrupted_one(
        log_split, tmp_path, mirrored_strategy):
    del mirrored_strategy
    split, data = log_split
    config = dataclasses.replace(CONFIG, strategy="mirrored", steps=16)
    whole = tower_run.train_run(config, split, str(tmp_path / "whole"), data)

    def kill(step):
        if step == 9:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tower_run.train_run(config, split, str(tmp_path / "killed"), data, on_step=kill,
                            checkpoint_seconds=0.0)
    resumed = tower_run.train_run(config, split, str(tmp_path / "killed"), data,
                                  checkpoint_seconds=0.0)
    assert resumed["resumed_from_step"] == 10
    assert _curve(resumed) == _curve(whole)
    for a, b in zip(_weights(tmp_path / "killed"), _weights(tmp_path / "whole")):
        np.testing.assert_array_equal(a, b)


def test_a_global_batch_the_replicas_cannot_share_is_refused(log_split, tmp_path,
                                                            mirrored_strategy):
    del mirrored_strategy
    split, data = log_split
    config = dataclasses.replace(CONFIG, strategy="mirrored", batch_size=33, steps=2)
    with pytest.raises(ValueError, match="--batch-size 33.*multiple of the 2 replicas"):
        tower_run.train_run(config, split, str(tmp_path / "odd"), data)


@pytest.mark.parametrize("tf_config, named", [
    (None, "not set"), ("{nope", "not JSON"), ('{"task": {}}', "no cluster"),
    ('{"cluster": {"worker": ["localhost:1"]}, "task": {"type": "worker", "index": 3}}',
     "index"),
])
def test_multi_worker_without_a_valid_tf_config_is_one_line(log_split, tmp_path, monkeypatch,
                                                            tf_config, named):
    split, data = log_split
    if tf_config is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", tf_config)
    config = dataclasses.replace(CONFIG, strategy="multi-worker")
    with pytest.raises(ValueError, match=named) as caught:
        tower_run.train_run(config, split, str(tmp_path / "m"), data)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "m").exists()  # before any work


# One worker of the cluster: `train_run` on the log, saving every step; with a step to die
# at, the process kills itself there (SIGKILL: no cleanup, as a lost machine).
WORKER = r"""
import json, os, signal, sys
import tfrs_logq
from tfrs_logq.pipelines.user_log import UserLogSource, load_user_log_split
from tfrs_logq.towers import run as tower_run
from tfrs_logq.towers.config import TwoTowerConfig
path, model_dir, die_at = sys.argv[1], sys.argv[2], int(sys.argv[4])
config = json.loads(sys.argv[3])
split = load_user_log_split(UserLogSource(path, "user", "item", time_column="ts"), "temporal")
data = {"interactions": path, "user_column": "user", "item_column": "item",
        "time_column": "ts", "split": "temporal"}
def on_step(step):
    if step == die_at:
        os.kill(os.getpid(), signal.SIGKILL)
result = tower_run.train_run(TwoTowerConfig(**config), split, model_dir, data,
                             on_step=on_step, checkpoint_seconds=0.0)
print("RESULT", json.dumps({"resumed_from_step": result["resumed_from_step"]}))
"""


def _cluster(log_path, model_dir, config, die_at=(-1, -1), timeout=240):
    """Starts the two workers (``config``, or one config a worker); returns their
    (returncode, stdout, stderr), killing both if one dies (as a scheduler restarting the
    job does) or past ``timeout`` seconds."""
    configs = config if isinstance(config, tuple) else (config, config)
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    for index in range(2):
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "",
               "TF_CONFIG": json.dumps({"cluster": cluster,
                                        "task": {"type": "worker", "index": index}})}
        procs.append(subprocess.Popen(
            [sys.executable, "-c", WORKER, log_path, model_dir,
             json.dumps(dataclasses.asdict(configs[index])), str(die_at[index])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):  # one lost: stop the job
                for p in procs:
                    if p.poll() is None:
                        p.send_signal(signal.SIGKILL)
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [(p.wait(), p.stdout.read(), p.stderr.read()) for p in procs]


@pytest.mark.slow  # two clusters of two TensorFlow processes and a one-process run
def test_two_worker_processes_follow_the_one_process_run_and_survive_a_lost_worker(
        log_split, tmp_path):
    split, data = log_split
    config = dataclasses.replace(CONFIG, strategy="multi-worker", steps=16)
    one = tower_run.train_run(CONFIG.__class__(**{**dataclasses.asdict(config),
                                                  "strategy": "default"}),
                              split, str(tmp_path / "one"), data)
    whole = str(tmp_path / "whole")
    results = _cluster(data["interactions"], whole, config)
    for code, out, err in results:
        assert code == 0, err[-3000:]
    # One model in the directory: the other worker's folder is gone.
    assert (tmp_path / "whole" / "metrics.json").exists()
    assert not [n for n in os.listdir(whole) if n.startswith("worker-")]
    np.testing.assert_allclose(_curve(whole), _curve(one), rtol=1e-4)

    # Worker 1 dies (SIGKILL) after step 9; the job is stopped and started again.
    killed = str(tmp_path / "killed")
    first = _cluster(data["interactions"], killed, config, die_at=(-1, 9))
    assert first[1][0] == -signal.SIGKILL
    assert not (tmp_path / "killed" / "metrics.json").exists()
    second = _cluster(data["interactions"], killed, config)
    for code, out, err in second:
        assert code == 0, err[-3000:]
    resumed = [json.loads(out.split("RESULT", 1)[1]) for _, out, _ in second]
    assert resumed[0]["resumed_from_step"] == resumed[1]["resumed_from_step"] >= 9
    # The same ops on the same state from the resumed step: the uninterrupted weights.
    np.testing.assert_allclose(_curve(killed), _curve(whole), rtol=1e-6)
    for a, b in zip(_weights(killed), _weights(whole)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # a cluster of two TensorFlow processes
def test_workers_started_with_different_settings_refuse_before_training(log_split, tmp_path):
    _, data = log_split
    config = dataclasses.replace(CONFIG, strategy="multi-worker", steps=4)
    other = dataclasses.replace(config, learning_rate=config.learning_rate / 2)
    results = _cluster(data["interactions"], str(tmp_path / "mixed"), (config, other))
    for code, _, err in results:
        assert code != 0
        assert "workers were started with different settings or logs" in err, err[-3000:]
    assert not (tmp_path / "mixed" / "metrics.json").exists()


def test_each_replicas_own_negatives_are_drawn_from_its_share(log_split, mirrored_strategy):
    """Off, a replica's in-batch draw is its share's (16 of the global 32), and the
    mixture's uniform share of the proposal counts those draws."""
    from tfrs_logq.towers import loop, training

    split, _ = log_split
    examples = training.Examples(split, CONFIG.history_length)
    for cross, in_batch in ((True, 32), (False, 16)):
        config = dataclasses.replace(CONFIG, strategy="mirrored", steps=2,
                                     cross_replica_negatives=cross)
        record = []
        loop.train_loop(training.run_spec(config, split.num_items),
                        examples.batches(config.seed, config.batch_size, config.steps),
                        split.train_log_q(), record=record)
        _, ids, valid = record[0]
        assert len(ids) == CONFIG.num_negatives + in_batch
        assert valid[CONFIG.num_negatives:].sum() <= in_batch
