"""Entry point of the dashboard: ``streamlit run app/main.py`` (``python run_app.py`` also starts the workers).

This file is two things. Imported by ``streamlit run`` (as the module ``main``), it is the server: ``app`` below, an
``st.App`` whose gate (``app/gate.py``) answers every request before Streamlit does. With ``$COMPATLAB_SECRET``
set (run_app.py does so for ``--secret-file``; at least 16 characters), nothing is served (no page, websocket,
upload, media, component, static file or metrics) until the browser has entered the secret; without one the
server starts only on a loopback address (``app/.streamlit/config.toml`` makes 127.0.0.1 the default).
Run by each browser session as its script (``__main__``), it is the router below.

The pages live in ``app_pages/``, not ``pages/``: Streamlit treats a ``pages/`` folder next to the entry
file as a legacy multipage app until ``st.navigation`` has run once, so the first visit after a server
start to a page's URL (a bookmark) would run that page without this router.
"""
from __future__ import annotations

import streamlit as st

if __name__ != "__main__":  # the server: `streamlit run` found `app` here and serves it with uvicorn
    from app.gate import streamlit_middleware

    app = st.App(__file__, middleware=streamlit_middleware(check_address=__name__ == "main"))
else:  # a session's script run: the router
    from app import queries as q
    from app.learn import LEARN_PAGES
    from storage import mask_url

    st.set_page_config(page_title="Compatibility Lab", page_icon=":material/science:", layout="wide")

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
