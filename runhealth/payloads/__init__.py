"""runhealth.payloads: see docs/design.md for its modules."""
