"""SASRec with every loss of the paper: its configuration (`config`), model (`models`),
objectives (`objectives`), the resumable trainer (`training`, `callbacks`,
`run_directory`) and loading a trained run (`trained`).

    from tfrs_logq.sasrec import training
    training.train(training.resolve_config("cpu", loss="inbatch-corrected"), "runs/a")
"""
