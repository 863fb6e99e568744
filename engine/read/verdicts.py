"""Stored verdicts, decisions and plans in words, for the pages (torch-free): the one vocabulary of verdicts and
backfilling needs (``engine.results.verdict_words``), the upgrade verdict's sentences (``engine.upgrade.words``), the
migration plan's lines and roll-out pick (``engine.upgrade.plan``), the best backfilling ordering
(``engine.upgrade.orders``) and the release report of a stored check (``engine.upgrade.release_report``).

Each name is defined and tested where the engine computes it; the pages import it from here."""
from __future__ import annotations

from engine.results.verdict_words import (artefact_note, interval_text, matrix_verdict, metric_order, needs_lines,
                                          tie_lines)
from engine.upgrade.orders import best_by_area
from engine.upgrade.plan import forecast_line, option_line, pick_rollout, recovery_line
from engine.upgrade.release_report import report_context, report_data, report_html
from engine.upgrade.words import NOT_JUDGED, interval, pct, sentence, share, tie_line

__all__ = ["artefact_note", "interval_text", "matrix_verdict", "metric_order", "needs_lines", "tie_lines",
           "best_by_area", "forecast_line", "option_line", "pick_rollout", "recovery_line", "report_context", "report_data",
           "report_html", "NOT_JUDGED", "interval", "pct", "sentence", "share", "tie_line"]
