"""supervisor/manifests/: see docs/design.md."""
