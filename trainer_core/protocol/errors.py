"""Problems with a job's settings, each naming its field and the fix (standard library only).

Defined here, below config/ and methods/, so that both can build them without importing each other;
``trainer_core.config`` re-exports them under their usual names."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FieldError:
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class ConfigError(ValueError):
    """Raised with every problem found, so a caller can show them all at once."""

    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))
