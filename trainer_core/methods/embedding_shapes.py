"""The data shapes an embedding model trains on and the losses each takes (names only, no imports): the
dashboard's method registry and config read these without the data package; trainer_core.data.embedding_pairs
detects and normalises rows into them.
"""
from __future__ import annotations

SHAPES = {
    "anchor_positive": "(anchor, positive) pairs, e.g. query and the passage that answers it",
    "triplet": "(anchor, positive, negative) triplets: a hard negative per pair",
    "scored_pair": "(sentence1, sentence2, score) pairs with a similarity score (0-1, or 0/1 labels)",
    "labelled": "(sentence, label) rows: sentences of the same label belong together",
}
# Which shapes each loss trains on; "auto" takes the first loss listed for the shape in DEFAULT_LOSS.
LOSS_SHAPES = {
    "mnrl": ("anchor_positive", "triplet"), "cached_mnrl": ("anchor_positive", "triplet"),
    "triplet": ("triplet",), "cosent": ("scored_pair",), "angle": ("scored_pair",),
    "contrastive": ("scored_pair",), "batch_all_triplet": ("labelled",),
}
