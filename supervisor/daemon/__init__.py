"""supervisor/daemon/: see docs/design.md."""
