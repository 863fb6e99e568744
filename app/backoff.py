"""Back-off on wrong secrets: after a few failures from one client address, its next tries wait a growing window.

Stdlib only. Bounded: at most ``MAX_TRACKED`` addresses are remembered (the quiet ones are forgotten first); an
IPv6 client counts by its /64 network, since one machine usually holds a whole /64.
"""
from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable

FREE_FAILURES = 5  # wrong secrets an address may enter before it has to wait
FIRST_WAIT_S = 60.0  # the wait after the FREE_FAILURES-th failure; it doubles with each further one
MAX_WAIT_S = 3600.0
FORGET_S = 24 * 3600.0  # an address that failed nothing for this long starts afresh
MAX_TRACKED = 10_000


def client_key(host: str | None) -> str:
    """The address wrong guesses are counted under: the IPv4 address, the IPv6 /64, or the text as given."""
    if not host:
        return "unknown"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.is_loopback:
            return str(address)
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


class Backoff:
    """Failures per client address and the window each must wait before its next try."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._failures: dict[str, tuple[int, float]] = {}  # key -> (failures in a row, time of the last one)

    def wait_s(self, key: str) -> float:
        """Seconds ``key`` must still wait before its next try is checked (0 when it may try now)."""
        failures, last = self._failures.get(key, (0, 0.0))
        return max(0.0, last + lock_s(failures) - self._clock())

    def failed(self, key: str) -> float:
        """Record a wrong secret from ``key``; return the seconds it must now wait (0 while tries are free)."""
        now = self._clock()
        failures, last = self._failures.pop(key, (0, now))
        if now - last > FORGET_S:
            failures = 0
        if len(self._failures) >= MAX_TRACKED:
            self._forget(now)
        self._failures[key] = (failures + 1, now)  # re-inserted: the dict stays ordered by last failure
        return lock_s(failures + 1)

    def succeeded(self, key: str) -> None:
        """The right secret from ``key``: its count starts again."""
        self._failures.pop(key, None)

    def _forget(self, now: float) -> None:
        """Drop the addresses that may try again; if none may, the one that failed longest ago."""
        for key, (failures, last) in list(self._failures.items()):
            if now >= last + lock_s(failures):
                del self._failures[key]
        if len(self._failures) >= MAX_TRACKED:
            del self._failures[next(iter(self._failures))]


def lock_s(failures: int) -> float:
    """The window after ``failures`` wrong secrets in a row: 0 before FREE_FAILURES, then 60, 120, 240 ... 3600 s."""
    if failures < FREE_FAILURES:
        return 0.0
    return min(MAX_WAIT_S, FIRST_WAIT_S * 2.0 ** min(failures - FREE_FAILURES, 64))
