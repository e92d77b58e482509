"""Persistence: SQLModel tables and the store, the only code that writes to the database."""
from db.store import Store, default_url

__all__ = ["Store", "default_url"]
