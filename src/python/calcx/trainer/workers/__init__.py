"""What verl loads inside its Ray workers by class path or module name (calcx.yaml,
agent_loops.yaml): the agent loop and its manager, the task runner, the packed-rows attention,
the native-library lookup; and `calcx profile-step`, which times that GPU work on its own."""
