"""The dashboard's Learn section: one Streamlit page per teaching demo, computing through ``engine.learn``.

``LEARN_PAGES`` lists ``(file_name, title, icon)``; file names are relative to this folder, so the
router in ``app/main.py`` registers them as ``st.Page(f"learn/{file_name}", title=title, icon=icon)``
under a "Learn" section. Every page also runs on its own: ``streamlit run app/learn/<file_name>``.
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
