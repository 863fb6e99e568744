"""Helpers shared by test modules (fixtures, data makers, page openers); test modules import from here, never
from each other (tests/test_test_layout.py)."""
