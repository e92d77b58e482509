"""GRPO rewards: built-in reward functions and the ``grpo.rewards`` settings (no ML imports)."""
