"""The `tf.distribute` strategy a training runs under, by name, one per process.

``default`` (one device), ``mirrored`` (every local GPU, or without one every logical CPU
the process configured: `tf.config.set_logical_device_configuration`), ``multi-worker``
(`MultiWorkerMirroredStrategy`, the cluster and this process's task read from
``TF_CONFIG``), ``tpu``, and ``auto`` (TPU if ``TPU_NAME`` is set,
multi-worker if ``TF_CONFIG`` names a cluster, mirrored with several GPUs, else default).

One instance per kind and process (`make_strategy` caches it): two MirroredStrategy
instances in one process share the collective runtime and can collide on its instance
keys, and a multi-worker strategy can be made once. TensorFlow is imported when a strategy
is made, so `check_tf_config` runs without it (a command refuses a bad ``TF_CONFIG``
before any work).
"""

from __future__ import annotations

import json
import os

STRATEGIES = ("auto", "default", "mirrored", "multi-worker", "tpu")

_MADE: dict = {}


def check_tf_config(environ=None) -> dict:
    """``TF_CONFIG`` of a multi-worker run, parsed; one line naming what is wrong otherwise.

    Raises:
      ValueError: unset, not JSON, no ``cluster`` with a ``worker`` (or ``chief``) list of
        ``host:port`` addresses, or a ``task`` whose type or index is not in the cluster.
    """
    environ = os.environ if environ is None else environ
    text = environ.get("TF_CONFIG")
    hint = ('e.g. TF_CONFIG=\'{"cluster": {"worker": ["host1:2222", "host2:2222"]}, '
            '"task": {"type": "worker", "index": 0}}\'')
    if not text:
        raise ValueError(f"--strategy multi-worker needs TF_CONFIG (the cluster and this "
                         f"process's task), which is not set: {hint}.")
    try:
        config = json.loads(text)
    except ValueError:
        raise ValueError(f"TF_CONFIG is not JSON ({text[:60]!r}): {hint}.") from None
    cluster = config.get("cluster") if isinstance(config, dict) else None
    task = config.get("task") if isinstance(config, dict) else None
    if not isinstance(cluster, dict) or not any(cluster.get(k) for k in ("worker", "chief")):
        raise ValueError(f"TF_CONFIG has no cluster with workers: {hint}.")
    for kind, addresses in cluster.items():
        if not isinstance(addresses, list) or not all(
                isinstance(a, str) and ":" in a for a in addresses):
            raise ValueError(f"TF_CONFIG's cluster {kind!r} must be a list of host:port "
                             f"addresses, received {str(addresses)[:60]}.")
    if not isinstance(task, dict) or task.get("type") not in cluster:
        raise ValueError(f"TF_CONFIG's task must name one of the cluster's kinds "
                         f"({', '.join(cluster)}), received {str(task)[:60]}.")
    index = task.get("index", 0)
    if isinstance(index, bool) or not isinstance(index, int) \
            or not 0 <= index < len(cluster[task["type"]]):
        raise ValueError(f"TF_CONFIG's task index must be in [0, "
                         f"{len(cluster[task['type']])}) for {task['type']!r}, received "
                         f"{str(index)[:20]}.")
    return config


def is_chief(environ=None) -> bool:
    """Whether this process writes a multi-worker run's files: the ``chief`` task, or worker
    0 of a cluster without one; True outside a cluster."""
    environ = os.environ if environ is None else environ
    try:
        config = json.loads(environ.get("TF_CONFIG") or "{}")
    except ValueError:
        return True
    cluster, task = config.get("cluster"), config.get("task") or {}
    if not cluster or not task:
        return True
    kind, index = task.get("type", "worker"), int(task.get("index", 0))
    return kind == "chief" or (kind == "worker" and index == 0 and "chief" not in cluster)


def make_strategy(kind: str = "auto"):
    """The strategy ``kind`` names (see the module docstring), made once per process."""
    if kind not in STRATEGIES:
        raise ValueError(f"unknown strategy {kind!r}; expected one of {STRATEGIES}.")
    import tensorflow as tf

    if kind == "auto":
        if os.environ.get("TPU_NAME"):
            kind = "tpu"
        elif "cluster" in json.loads(os.environ.get("TF_CONFIG") or "{}"):
            kind = "multi-worker"
        elif len(tf.config.list_logical_devices("GPU")) > 1:
            kind = "mirrored"
        else:
            kind = "default"
    if kind == "default":
        return tf.distribute.get_strategy()
    if kind not in _MADE:
        if kind == "tpu":
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
            _MADE[kind] = tf.distribute.TPUStrategy(resolver)
        elif kind == "multi-worker":
            check_tf_config()
            _MADE[kind] = tf.distribute.MultiWorkerMirroredStrategy()
        else:  # the GPUs, else every logical CPU (MirroredStrategy() alone takes CPU:0)
            gpus = tf.config.list_logical_devices("GPU")
            devices = gpus or tf.config.list_logical_devices("CPU")
            _MADE[kind] = tf.distribute.MirroredStrategy([d.name for d in devices])
    return _MADE[kind]


def free_ports(n: int, host: str = "127.0.0.1") -> list:
    """``n`` ports free on ``host`` now (bound, read and released: another process may take
    one before it is used, as with any such probe)."""
    import socket

    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind((host, 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def loopback_cluster(num_workers: int, num_ps: int):
    """A `ParameterServerStrategy` cluster in this process, as TensorFlow's tutorial builds
    one: ``num_workers`` workers and ``num_ps`` parameter servers as `tf.distribute.Server`s
    on free loopback ports (each worker with ``num_workers + 1`` inter-op threads, for few
    cores). Returns ``(resolver, servers)``: the `SimpleClusterResolver` the strategy takes,
    and the servers, to keep alive as long as it. For tests and benchmarks on one machine."""
    import tensorflow as tf

    ports = free_ports(num_workers + num_ps)
    spec = tf.train.ClusterSpec({
        "worker": [f"localhost:{p}" for p in ports[:num_workers]],
        "ps": [f"localhost:{p}" for p in ports[num_workers:]]})
    config = tf.compat.v1.ConfigProto()
    config.inter_op_parallelism_threads = num_workers + 1
    servers = [tf.distribute.Server(spec, job_name="worker", task_index=i, config=config,
                                    protocol="grpc") for i in range(num_workers)]
    servers += [tf.distribute.Server(spec, job_name="ps", task_index=i, protocol="grpc")
                for i in range(num_ps)]
    return tf.distribute.cluster_resolver.SimpleClusterResolver(spec, rpc_layer="grpc"), servers


__all__ = ["STRATEGIES", "check_tf_config", "free_ports", "is_chief", "loopback_cluster",
           "make_strategy"]
