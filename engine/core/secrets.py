"""Secrets in source texts: which keys hold one, how a text names one by reference, and whether it holds one in clear.

A job's payload is stored (and shown on Overview), so it keeps no secret: a source text in a payload names each
secret as ``${COMPATLAB_SOURCE_NAME}``, which the reader resolves from its own environment
(:func:`engine.sources.text.resolve_secrets`). Pure text rules; numpy-free.
"""
from __future__ import annotations

import re
from urllib.parse import unquote

SECRET_KEYS = ("api_key", "apikey", "password", "token", "secret")  # option or query keys whose value is a secret
SECRET_REF = re.compile(r"\$\{(COMPATLAB_SOURCE_[A-Z0-9_]+)\}")  # a secret by reference: the reader's environment
_PASSWORD = re.compile(r"[A-Za-z][\w+.-]*://[^/@\s:]*:([^@\s/]*)@")  # scheme://user:PASSWORD@host
_KEY_VALUE = re.compile(r"[#&?](" + "|".join(SECRET_KEYS) + r")=([^&#]*)", re.IGNORECASE)


def _clear(value: str) -> bool:
    value = unquote(value)
    return bool(value) and not SECRET_REF.fullmatch(value)


def clear_secret(text: str) -> str | None:
    """What secret a source text holds in clear (a URL password, a secret option or query value), or None when it
    holds none or names each by reference."""
    m = _PASSWORD.search(text)
    if m and _clear(m.group(1)):
        return "a password in its URL"
    for key, value in _KEY_VALUE.findall(text):
        if _clear(value):
            return f"a value of {key.lower()}"
    return None
