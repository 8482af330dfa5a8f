"""Helpers shared by the subsystems (op library loading, immutable value objects)."""
