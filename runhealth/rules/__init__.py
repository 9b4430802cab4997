"""runhealth.rules: see docs/design.md for its modules."""
