"""Two-tower retrieval trainers: the training step the study and the trainer on users'
logs share (`loop`), and the trainer on a `Split` of interactions (`training`)."""
