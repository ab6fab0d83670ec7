"""The audit log: the `AuditRequests` stage (one record per request) and the hash-chained writer."""
