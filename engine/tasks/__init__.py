"""The task mechanism: claim, lease, heartbeat, retry, complete exactly once; handlers passed in (``loop``)."""
