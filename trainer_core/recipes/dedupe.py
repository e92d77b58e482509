"""Exact and near-duplicate rows left out of a recipe's dataset, each with the row it repeats.

A row's text is its ``columns`` joined, each casefolded with its whitespace collapsed. The same text as a row kept
before is an exact duplicate; a text whose character shingles overlap a kept row's by an estimated Jaccard
similarity of ``threshold`` or more is a near duplicate (datasketch's MinHash, a fixed seed, and MinHashLSH to find
the candidates without comparing every pair). Nothing is random and nothing is persisted: a resumed job rebuilds
the state by ``add``-ing the rows it kept before, so it never keeps a duplicate of a row kept before the kill.
Memory: about 1 KiB a kept row (its 128 hash values) plus the LSH index.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
from datasketch import MinHash, MinHashLSH

SEED = 1  # MinHash permutations: the same on every run and in every process
LSH_THRESHOLD_CAP = 0.9  # MinHashLSH finds no band layout above ~0.95: candidates from 0.9, then the exact threshold
_SEPARATOR = "\x1f"  # between columns: "a b" + "c" is not "a" + "b c"


class Deduper:
    """Remembers kept rows; ``check_and_add`` says whether a new row repeats one of them."""

    def __init__(self, columns: list[str], *, threshold: float = 0.8, num_perm: int = 128, shingle: int = 5):
        if not isinstance(columns, list) or not columns or not all(isinstance(c, str) and c for c in columns):
            raise ValueError(f"columns must be a non-empty list of column names, not {columns!r}")
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold <= 1:
            raise ValueError(f"threshold must be a number above 0 and at most 1 (an estimated Jaccard similarity), "
                             f"not {threshold!r}")
        if isinstance(num_perm, bool) or not isinstance(num_perm, int) or not 32 <= num_perm <= 1024:
            raise ValueError(f"num_perm must be an integer from 32 to 1024, not {num_perm!r}")
        if isinstance(shingle, bool) or not isinstance(shingle, int) or not 1 <= shingle <= 64:
            raise ValueError(f"shingle must be an integer from 1 to 64 (characters), not {shingle!r}")
        self.columns, self.threshold, self.num_perm, self.shingle = list(columns), float(threshold), num_perm, shingle
        self._lsh = MinHashLSH(threshold=min(self.threshold, LSH_THRESHOLD_CAP), num_perm=num_perm)
        self._exact: dict[bytes, str] = {}   # digest of the normalised text -> the row kept with it
        self._ids: list[str] = []            # LSH key (its position here) -> row id
        self._hashes: list[np.ndarray] = []  # LSH key -> MinHash values

    def __len__(self) -> int:
        return len(self._ids)

    def check_and_add(self, row: dict, row_id: str) -> str | None:
        """None when ``row`` repeats no kept row (it is kept and remembered), else why it is a duplicate."""
        text = self.text(row)
        digest = _digest(text)
        if digest in self._exact:
            return f"exact duplicate of {self._exact[digest]}"
        minhash = self._minhash(text)
        best = self._nearest(minhash)
        if best is not None:
            similarity, key = best
            return f"near duplicate of {self._ids[key]} (estimated Jaccard {similarity:.2f})"
        self._remember(digest, minhash, row_id)
        return None

    def add(self, row: dict, row_id: str) -> None:
        """Remember ``row`` as kept without checking it (rebuilding the state from the rows a job kept before)."""
        text = self.text(row)
        digest = _digest(text)
        self._remember(digest, self._minhash(text), row_id)

    def text(self, row: dict) -> str:
        """The normalised text of ``row``'s columns (a missing column or None is empty; non-text values as JSON)."""
        return _SEPARATOR.join(" ".join(_value_text(row.get(column)).casefold().split()) for column in self.columns)

    def _minhash(self, text: str) -> MinHash:
        size = self.shingle
        shingles = {text[i:i + size] for i in range(max(1, len(text) - size + 1))} if text else set()
        minhash = MinHash(num_perm=self.num_perm, seed=SEED)
        minhash.update_batch([s.encode("utf-8", "surrogatepass") for s in shingles])  # a set: order changes nothing
        return minhash

    def _nearest(self, minhash: MinHash) -> tuple[float, int] | None:
        """(estimated Jaccard, key) of the most similar kept row at or above the threshold (the first kept on a tie)."""
        best = None
        for key in sorted(self._lsh.query(minhash)):
            similarity = float(np.count_nonzero(self._hashes[key] == minhash.hashvalues)) / self.num_perm
            if similarity >= self.threshold and (best is None or similarity > best[0]):
                best = (similarity, key)
        return best

    def _remember(self, digest: bytes, minhash: MinHash, row_id: str) -> None:
        if digest in self._exact:
            return  # add() of a copy of a kept row: the first one is the one duplicates are named after
        key = len(self._ids)
        self._exact[digest] = row_id
        self._ids.append(row_id)
        self._hashes.append(minhash.hashvalues.copy())
        self._lsh.insert(key, minhash)


def _value_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
