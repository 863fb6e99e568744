"""engine.core."""
