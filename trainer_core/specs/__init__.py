"""What every job kind other than training shares, below the kinds' own packages (evaluation/, serving/, export/) and
the jobs/ package that runs them: the JobSpec base and job.json (jobspec), the model sources a spec names and how
they are found in run folders (model_source), a run's completed checkpoints (checkpoints), and the import of every
kind's spec class (jobkinds).
"""
