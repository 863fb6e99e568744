"""Entry point of the dashboard: ``streamlit run app/main.py`` (``python run_app.py`` also starts the worker).

The pages live in ``app_pages/``, not ``pages/``: Streamlit treats a ``pages/`` folder next to the entry
file as a legacy multipage app until ``st.navigation`` has run once, so the first visit after a server
start to a page's URL (a bookmark) would run that page without this router.

With ``$COMPATLAB_SECRET`` set (run_app.py does so for ``--secret-file``), every session must enter the
shared secret before any page renders.
"""
from __future__ import annotations

import hmac
import os

import streamlit as st

from app import queries as q
from app.learn import LEARN_PAGES
from storage import mask_url

SECRET_ENV = "COMPATLAB_SECRET"

st.set_page_config(page_title="Compatibility Lab", page_icon=":material/science:", layout="wide")


def require_secret() -> None:
    """When run_app.py configured a shared secret, ask for it before anything else renders (once per session)."""
    secret = os.environ.get(SECRET_ENV, "")
    if not secret or st.session_state.get("secret_ok"):
        return
    st.title("Compatibility Lab")
    with st.form("secret_form"):
        given = st.text_input("Shared secret", type="password", help="Ask the person who started the dashboard")
        entered = st.form_submit_button("Enter")
    if entered and hmac.compare_digest(given.encode("utf-8"), secret.encode("utf-8")):
        st.session_state["secret_ok"] = True
        st.rerun()
    if entered:
        st.error("That is not the secret.")
    st.stop()


require_secret()

PAGES = [
    st.Page("app_pages/overview.py", title="Overview", icon=":material/dashboard:", default=True),
    st.Page("app_pages/upgrade.py", title="Upgrade check", icon=":material/verified:"),
    st.Page("app_pages/new_experiment.py", title="New experiment", icon=":material/add_circle:"),
    st.Page("app_pages/compatibility.py", title="Compatibility", icon=":material/grid_on:"),
    st.Page("app_pages/geometry.py", title="Feature geometry", icon=":material/scatter_plot:"),
    st.Page("app_pages/backfilling.py", title="Backfilling", icon=":material/stacked_line_chart:"),
    st.Page("app_pages/checkpoints.py", title="Checkpoints", icon=":material/upload_file:"),
]
LEARN = [st.Page(f"learn/{file}", title=title, icon=icon) for file, title, icon in LEARN_PAGES]

page = st.navigation({"Explore": PAGES, "Learn": LEARN})
with st.sidebar:
    st.caption("**Compatibility Lab** — learning compatible representations across model updates.")
    st.caption(f"Database: `{mask_url(q.db_url())}`")
try:
    if q.read_only(q.db_url()):
        st.error(f"{q.read_only(q.db_url())}. Stored results are shown; launching is disabled.")
except ValueError as exc:  # storage.DatabaseUnavailable: corrupt, unreachable, bad URL or missing driver
    st.error(str(exc))
    st.stop()
page.run()
