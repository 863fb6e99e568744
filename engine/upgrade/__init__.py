"""The engineer's question, "can I ship v2 without re-indexing?": the verdict (``verdict``) and its command (``cli``)."""
