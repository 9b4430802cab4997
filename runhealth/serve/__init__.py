"""runhealth.serve: see docs/design.md for its modules."""
