"""calcx HTTP API: pydantic models, the endpoint table, the one client and its error, attempt tokens."""
