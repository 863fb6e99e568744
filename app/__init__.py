"""Compatibility Lab dashboard (Streamlit UI only): ``main.py`` routes to one file per page in ``pages/``."""
