"""Routes, one module per resource; ``ROUTERS`` is mounted under ``/api`` by ``create_app``."""

from fleet_api.routes import (
    artifacts,
    attachments,
    evals,
    feedback,
    health,
    memory,
    notebook,
    runs,
    sessions,
    skills,
    tools,
    turns,
    volume,
    workspace,
)

ROUTERS = [
    health.router,
    sessions.router,
    notebook.router,
    turns.router,
    runs.router,
    attachments.router,
    artifacts.router,
    volume.router,
    skills.router,
    tools.router,
    memory.router,
    workspace.router,
    feedback.router,
    evals.router,
]
