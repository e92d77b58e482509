"""Where a job's worker runs, behind one interface (base.py): start, state, stop request, kill, adopt.

local.py runs it on this host, as a process of its own session (torchrun's launcher when a run uses several
processes). A cluster launcher (Ray) is another implementation of the same two classes.
"""
from trainer_core.launchers.base import JobHandle, JobState, Launcher

__all__ = ["JobHandle", "JobState", "Launcher"]
