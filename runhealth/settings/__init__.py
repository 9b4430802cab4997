"""runhealth.settings: see docs/design.md for its modules."""
