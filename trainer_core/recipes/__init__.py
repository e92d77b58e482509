"""Data recipes: datasets made inside the studio from documents, seed data and a teacher model, with NVIDIA NeMo Data
Designer (docs/data-recipes.md).

``spec`` (the job's settings), ``checking`` (seeds, endpoints, each record into a training row or set aside),
``rows`` (the output template), ``store`` (batches on disk, published versions), ``launch`` (start, resume and
preview through the orchestrator), ``starters``; ``validators`` (the row checks a recipe declares; ``sql_check`` runs
SQL ones, ``user_code`` Python ones in a child process) and ``dedupe`` (exact and near-duplicate rows). No torch or
transformers; Data Designer itself runs in its own venv (trainer_core/worker/recipe_child.py).
"""
