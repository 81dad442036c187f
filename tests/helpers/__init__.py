"""Helpers shared by the unit tests and the end-to-end tests (tests/e2e)."""
