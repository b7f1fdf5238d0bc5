"""The asyncio client's old name (layout-move: keep): it lives in supervisor/client/aio.py."""
from .client.aio import AsyncChild, AsyncClient   # layout-move: keep

__all__ = ["AsyncChild", "AsyncClient"]
