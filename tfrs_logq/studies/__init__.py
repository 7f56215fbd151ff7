"""The project's experiments on top of the library and the SASRec trainer: the demo,
the gradient-bias diagnostic (`diagnose`), the SASRec grid (`experiment`) and the
large-catalog study on the synthetic stream (`study`, `study_grid`, `study_report`)."""
