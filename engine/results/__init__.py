"""An experiment's results: the one write path (``record``), how a number was obtained (``conventions``),
its text renderings (``report``) and the study summary printed by the CLI (``study_summary``)."""
