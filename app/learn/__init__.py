"""The dashboard's Learn section: one Streamlit page per teaching demo, computing through ``engine.learn``.

These pages are the one exception to "the app reads what the engine stored and enqueues jobs": each demo
computes in the Streamlit process (small synthetic problems, torch and numba included). Every other page
imports only ``storage`` and the torch-free engine modules (``tests/test_app_imports.py`` checks it).

``LEARN_PAGES`` lists ``(file_name, title, icon)``; file names are relative to this folder, so the
router in ``app/main.py`` registers them as ``st.Page(f"learn/{file_name}", title=title, icon=icon)``
under a "Learn" section. Every page also runs on its own: ``streamlit run app/learn/<file_name>`` (with the package installed,
``pip install -e .``, or ``PYTHONPATH=.``).
"""
from __future__ import annotations

LEARN_PAGES: list[tuple[str, str, str]] = [
    ("definition1.py", "Definition 1, by hand", ":material/compare_arrows:"),
    ("simplex.py", "The probability simplex", ":material/change_history:"),
    ("stationarity.py", "Stationarity vs a learnable classifier", ":material/anchor:"),
    ("caps.py", "Caps and expectations", ":material/bubble_chart:"),
    ("alignment.py", "Orthogonal vs affine alignment", ":material/rotate_90_degrees_ccw:"),
]

__all__ = ["LEARN_PAGES"]
