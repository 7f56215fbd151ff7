"""The synthetic study (research/study.md) on Keras 3 / JAX, without TensorFlow.

Entry point: ``benchmarks/accelerator_study.py``; guide: ``research/accelerator-study.md``.

Modules: `world` (the synthetic world and its device sampler), `tf_philox` (TensorFlow's
stateless RNG in numpy, for the held-out examples), `loss` (the corrections through
keras-logq), `model` (the two-tower model, negatives, the row-sparse Adam step),
`evaluate` (top-k, recall and the truth on the device), `runs` (the grid and presets),
`driver` (results.csv, checkpoints, the time budget), `cli`, `bench` (step timings).
"""

# No side effect here: `curve_report` is read from TensorFlow processes
# (the test suite), where a KERAS_BACKEND=jax set on import leaked to every later
# subprocess. `loss`, the one module that imports keras, chooses JAX.
