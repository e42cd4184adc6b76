"""Reproducible container images: each layer a tar with fixed metadata, the image a docker-archive
whose config carries no build time, so the same inputs give the same image ID on any machine.
Standard library only: build-base.sh runs it with the host's python3."""
