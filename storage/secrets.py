"""Secrets in URLs, source texts and messages: the one masking function, and the rule that a stored payload names a
secret by reference instead of holding it.

:func:`mask_url` is used for every label, message, export and log line that may carry a URL or a source text
(``storage.db``'s database URLs, ``engine.sources``' messages, job labels, the release report): a URL's password
(``scheme://user:PASSWORD@``; a bare ``https://TOKEN@`` too) and the value of every secret key (``?password=``,
``#api_key=``, ``&token=`` ...) become ``***``. A job's payload is stored and listed, so it keeps no secret: a
source text there names each as ``${SOURCE_SECRET_NAME}`` (:data:`SECRET_REF`), which the reader resolves from its
own environment; :func:`clear_secret` says what a text holds in clear. Pure text rules, no imports beyond ``re``.
"""
from __future__ import annotations

import re
from urllib.parse import unquote

SECRET_KEYS = ("api_key", "apikey", "password", "token", "secret")  # option or query keys whose value is a secret
SECRET_REF = re.compile(r"\$\{(SOURCE_SECRET_[A-Z0-9_]+)\}")  # a secret by reference: the reader's environment
_PASSWORD = re.compile(r"([A-Za-z][\w+.-]*://[^/@\s:]*):([^@\s/]*)@")  # scheme://user:PASSWORD@host
_BARE_TOKEN = re.compile(r"((?:https?|s3|gs|az)://)([^/@\s:]+)@", re.IGNORECASE)  # https://TOKEN@host
_KEY_VALUE = re.compile(r"([#?&](" + "|".join(SECRET_KEYS) + r")=)([^&#\s]*)", re.IGNORECASE)


def mask_url(text: str) -> str:
    """``text`` (a URL, a source text or a whole message) with every password, bare token and secret key's value
    replaced by ``***``; works on text no URL parser accepts (a typo'd URL still must not print its password)."""
    out = _PASSWORD.sub(r"\1:***@", str(text))
    out = _BARE_TOKEN.sub(r"\1***@", out)
    return _KEY_VALUE.sub(r"\1***", out)


_NETLOC = re.compile(r"([A-Za-z][\w+.-]*)://([^/?#\s]*)")


def url_host(text: str) -> str | None:
    """The ``host`` or ``host:port`` a source text connects to (lower-cased, userinfo dropped), or None for a local
    path or ``file://``; a bucket for ``s3://``, ``gs://``, ``az://``."""
    m = _NETLOC.search(text)
    if m is None or m.group(1).lower() == "file":
        return None
    return m.group(2).rsplit("@", 1)[-1].lower() or None


def host_allowed(host: str, allowed: tuple[str, ...]) -> bool:
    """Whether ``host`` (``name`` or ``name:port``) is in ``allowed``: an entry without a port allows every port."""
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 or host.startswith("[") and "]:" in host else host
    return host in allowed or name in allowed


def _clear(value: str) -> bool:
    value = unquote(value)
    return bool(value) and not SECRET_REF.fullmatch(value) and value != "***"


def clear_secret(text: str) -> str | None:
    """What secret a source text holds in clear (a URL password, a secret option or query value), or None when it
    holds none or names each by reference."""
    m = _PASSWORD.search(text)
    if m and _clear(m.group(2)):
        return "a password in its URL"
    for _, key, value in _KEY_VALUE.findall(text):
        if _clear(value):
            return f"a value of {key.lower()}"
    return None
