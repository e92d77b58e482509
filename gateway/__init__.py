"""Shared mode: nginx in front of everything, a small sign-in service behind its ``auth_request``."""
