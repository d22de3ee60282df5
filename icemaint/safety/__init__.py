"""Safety: table claims, the append-only audit log, approvals, and the PostgreSQL plumbing they share."""
