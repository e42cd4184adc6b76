"""calcx controller: claims queued rollouts and runs each through a runner (local or k8s)."""
