"""Two-tower retrieval trainers: a run's settings free of TensorFlow (`config`), the
training step the study and the trainer on users' logs share (`loop`), the trainer on a
`Split` of interactions (`training`) and a run in a model directory (`run`)."""
