"""supervisor/client/: see docs/design.md."""
