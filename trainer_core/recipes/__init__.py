"""Data recipes' dashboard half: datasets made inside the studio from documents, seed data and a teacher model.

``validators`` (the row checks a recipe declares; ``sql_check`` runs SQL ones, ``user_code`` Python ones in a
child process), ``dedupe`` (exact and near-duplicate rows). Pure Python: the dashboard (previews) and the recipe's
worker import it; no torch or transformers.
"""
