"""runhealth.collect: see docs/design.md for its modules."""
