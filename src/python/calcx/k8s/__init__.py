"""Kubernetes manifests for calcx: rendering from `src/k8s/templates` with escaping, and offline
schema validation. The k8s runner and `python -m calcx.k8s.build` use it."""
