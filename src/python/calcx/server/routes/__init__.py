"""The server's routes, one module per resource; each module's router declares who may call it.

| module | paths | audience |
|---|---|---|
| `health` | `/healthz`, `/metrics` | open |
| `rollouts` | `/v1/rollouts`, `/v1/rollouts/{rid}` (+ `/wait`, `/retry`, `/calls`), `/v1/terminal` | server key |
| `claims` | `/v1/claims`, `/v1/claims/heartbeat`, `/v1/rollouts/{rid}/attempts/{aid}/finish` | server key |
| `events` | `/v1/rollouts/{rid}/attempts/{aid}/events` | the attempt's token |
| `gateway` | `/v1/rollouts/{rid}/attempts/{aid}/v1/...` | the attempt's token |
| `models` | `/v1/models` | server key |
| `training` | `/v1/trained`, `/v1/trained/rewind` | server key |
"""

from __future__ import annotations

from calcx.server.routes import claims, events, gateway, health, models, rollouts, training

#: In the order the app adds them.
ROUTERS = (health.router, rollouts.router, claims.router, events.router, gateway.router, models.router,
           training.router)
