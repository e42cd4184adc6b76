"""What every route shares: one `ServerState` per app, at `app.state.calcx`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from calcx.server.auth import Authenticator
from calcx.server.budget import AttemptBudgets
from calcx.server.gateway import Gateway
from calcx.server.metrics import ServerMetrics
from calcx.server.service import RolloutService
from calcx.server.settings import ServerSettings
from calcx.server.store import RolloutStore


@dataclass
class ServerState:
    """The gateway and the service's store exist between startup and shutdown."""

    settings: ServerSettings
    auth: Authenticator
    metrics: ServerMetrics
    service: RolloutService
    budgets: AttemptBudgets
    gateway: Gateway | None = None
    registry: dict[str, Any] = field(default_factory=dict)  # the model registry, as stored

    @property
    def db(self) -> RolloutStore:
        return self.service.db

    def begin_shutdown(self) -> None:
        """Answer every long poll now (called when the HTTP server starts shutting down)."""
        self.service.begin_shutdown()
