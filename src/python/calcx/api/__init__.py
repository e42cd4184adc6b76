"""calcx HTTP API: pydantic models, sync/async clients, attempt tokens."""
