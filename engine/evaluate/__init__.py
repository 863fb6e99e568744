"""engine.evaluate."""
