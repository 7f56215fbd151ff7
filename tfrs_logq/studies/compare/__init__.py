"""`tfrs-logq compare`: does the corrected loss beat the standard one on *this* log?

Every loss of the plan is trained for every seed, with common random numbers (the
runs of one seed share batches, initial weights and negatives: `tfrs_logq.towers`),
for a fixed number of steps (no early stopping); the test split is scored every
``eval_every`` steps and a run's result is the mean of its last ``window``
evaluations (the fixed-length protocol that produced this project's ML-1M result).
The differences against the baseline loss are then paired by seed
(`report`). `runner.run_plan` drives any model family through a `Trainer`: the built-in
two-tower and SASRec (`builtin.run_compare`), a user's own `tfrs.Model`
(`model_fn.compare_model`, ``model="tfrs-model"``).

The modules, each importing only those below it (an import-linter contract):

- `builtin` (`run_compare`: the built-in models) and `model_fn` (`compare_model`: your
  own `tfrs.Model`): the entry points;
- `report`: the report, rendered from results.csv, curves.csv and the hits alone
  (`report_only` rebuilds it from an output directory);
- `runner`: the runs, their hits and the served index's record;
- `plan`: what is compared (`Plan`, ``plan.json``), the run list and its share over
  processes, the checks of the output directory and of results.csv;
- `stats`: the paired statistics (differences, intervals, power, multiplicity), numpy and
  SciPy only.

Output directory:

- ``plan.json``: what is compared: every setting that changes a result, the data's
  identity (file, preprocessing flags, split and its fraction, a hash of the split's
  arrays) included (a rerun with another plan is refused, naming what differs; more
  seeds or losses may be added, and a rerun naming fewer keeps those planned);
- ``curves.csv``: every evaluation of every run; ``results.csv``: a row per loss and
  seed (the window's means, the regime, seconds per step);
- ``hits/<loss>-seed<seed>.npz``: each finished run's hits per test user at its last
  evaluation (`save_hits`: the user's index, number of targets and hits at each Recall@k
  cut-off), written before the run's row of results.csv: the report's intervals over
  seeds *and* test users read them;
- ``served_index.json``: where `run_plan` is given a ``served_index`` hook, what the index
  ``tfrs-logq export --index auto`` would serve keeps of the exact top-k, for the final
  model of each loss at the first seed (`record_served`, `load_served`): the report's
  sentence on how far a served figure can move from the exact one reads it;
- ``report.md``, ``learning_curves.png``, ``paired.png``;
- ``runs/``: checkpoints of unfinished runs (a killed run goes on from its last one;
  a finished run is skipped on rerun);
- ``.lock`` (held by a comparison run in one process for its whole time), ``.tables.lock``
  (held for each write of plan.json, results.csv, curves.csv and served_index.json) and
  ``.locks/`` (a lock per run, held while it trains).

Across processes (`RunShare`, ``compare --run-index I --run-count N``, or a Kubernetes
Indexed Job's or a Slurm array's variables: `resolve_share`): run ``k`` of the plan's
ordered list (`plan_runs`: seed by seed, the losses in order) goes to index ``k mod N``;
the processes share the directory, each run trained under its own lock (a run held by
another process is left to it) and every table written under ``.tables.lock``; the process
that finds every run of the plan done writes the report.
"""
