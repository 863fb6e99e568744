"""Shared by several test modules; moved from tests/test_release_report.py."""
from __future__ import annotations

import re

EXTERNAL = re.compile(r"""(?:src|href|action|xlink:href)\s*=\s*["']?\s*(?:https?:)?//|url\(\s*["']?\s*(?:https?:)?//|@import""",
                      re.IGNORECASE)

