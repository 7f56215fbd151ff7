"""Reads TensorBoard event files back with TensorBoard's own event reader, for the tests of
what `train` and `compare` log."""

import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.hparams import metadata as hp_metadata


def scalars(logdir) -> dict:
    """``{tag: [(step, value), ...]}`` of the scalars in a TensorBoard log directory."""
    accumulator = event_accumulator.EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    accumulator.Reload()
    return {tag: [(e.step, float(tf.make_ndarray(e.tensor_proto)))
                  for e in accumulator.Tensors(tag)]
            for tag in accumulator.Tags()["tensors"]}


def hparams_trial(logdir):
    """The HParams plugin's trial (its ``hparams``) in ``logdir``."""
    return _plugin(logdir, hp_metadata.SESSION_START_INFO_TAG,
                   hp_metadata.parse_session_start_info_plugin_data)


def hparams_experiment(logdir):
    """The HParams plugin's experiment (``hparam_infos``, ``metric_infos``) in ``logdir``."""
    return _plugin(logdir, hp_metadata.EXPERIMENT_TAG, hp_metadata.parse_experiment_plugin_data)


def _plugin(logdir, tag, parse):
    accumulator = event_accumulator.EventAccumulator(str(logdir))
    accumulator.Reload()
    return parse(accumulator.PluginTagToContent(hp_metadata.PLUGIN_NAME)[tag])
