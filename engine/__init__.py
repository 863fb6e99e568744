"""Compatibility Lab engine: data, models, methods, training, features, metrics, jobs and CLI."""
