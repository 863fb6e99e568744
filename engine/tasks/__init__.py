"""engine.tasks."""
