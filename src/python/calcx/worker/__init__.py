"""The local runner's pre-forked agent worker ("zygote") and the code that talks to it.

The worker (`serve`, `fork`, `preload`, `warmup`, `main`) runs inside the agent artifact and
needs only the standard library next to the agent; the controller drives it through `client`
(asyncio) and hands calculators to it through the tiny programs of `launcher`. The wire
protocol and the command name are in `protocol`.
"""
