"""The CLI's commands with logic of their own (``python -m trainer_core`` is ``trainer_core/__main__.py``): evaluate
(``eval``), export (``export RUN --to ...``) and serve (``chat``, ``serve``). They drive the orchestrator, so they sit
on top with the dashboard's ui/, above the job kinds' own packages (evaluation/, export/, serving/)."""
