"""What the parts of calcx agree on, defined once: the agent's environment and the rule for
the values it may carry (`env`), exit codes, failure reasons and the failure line
(`failures`), the lines a started process prints when it is ready (`ready`), and the labels a
trainer rollout carries (`labels`).

Standard library only: the agent PEX, the server, the controller, the k8s renderer and the
trainer all import it.
"""
