"""What a user runs on top of the library and the trainers: the demo, the gradient-bias
diagnostic (`diagnose`) and the comparison of standard against corrected logQ on a user's
log (`compare`, `compare_report`). The experiments behind the project's findings (the
large-catalog study, the SASRec grid) live in the repository's ``lab/``, not installed."""
