"""Sweeps: a hyperparameter search as one grouped job. A sweep is an Optuna study whose trials are ordinary training
runs started through the orchestrator (spec.py: the ``sweep:`` section and its checks; record.py: the sweep's folder;
driver.py: ask, start, report, prune, tell; runner.py: which process drives which sweep; decisions.py: divergence and
a trial's value). See docs/sweeps.md."""
