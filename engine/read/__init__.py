"""The dashboard's door into the engine (torch-free): what the engine stored, read and worded for the pages, and the
checks a form runs before it enqueues a job. ``app/`` imports ``storage``, ``engine.core`` and these modules (the
Learn demos also their own ``engine.learn`` module); ``tests/test_floors.py`` holds it to that.

- :mod:`engine.read.matrices`: stored compatibility matrices over seeds, judged, rendered and bundled;
- :mod:`engine.read.verdicts`: stored verdicts, decisions and plans in words, and the release report;
- :mod:`engine.read.samples`: stored samples' thumbnails and texts, and cross-model nearest neighbours;
- :mod:`engine.read.requests`: a request's grammar and the cheap file checks before a job is queued.

Each name lives where it is computed; this package imports it (one fact, one room) and never enqueues or runs a job.
"""
