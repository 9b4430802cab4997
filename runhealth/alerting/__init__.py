"""runhealth.alerting: see docs/design.md for its modules."""
