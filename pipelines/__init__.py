"""tf.data pipelines (importable as ``tfrs_logq.pipelines``)."""
