"""Rollouts on the calcx server, settled and turned into training samples: what verl's agent loop
workers and the eval-only driver run alike. Plain Python over the server's API: no verl, torch
or ray (the import-layers check holds it to that)."""
