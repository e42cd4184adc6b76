"""The server's handlers, one module per resource (`health`, `rollouts`, `claims`, `events`,
`gateway`, `models`, `training`, `leases`); each handler is attached to the endpoint of
`calcx.api.endpoints` it serves, which alone names its path, method, audience and body model.
"""

from __future__ import annotations

from calcx.server.routes import claims, events, gateway, health, leases, models, rollouts, training
from calcx.server.routing import Routes

#: Every resource module's handlers; together they serve each declared endpoint once.
ROUTES: tuple[Routes, ...] = (
    health.routes,
    rollouts.routes,
    claims.routes,
    events.routes,
    gateway.routes,
    models.routes,
    training.routes,
    leases.routes,
)
