"""Type names for the store's connections and pool."""

from __future__ import annotations

from typing import TypeAlias

import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

Connection: TypeAlias = psycopg.AsyncConnection[TupleRow]
Pool: TypeAlias = AsyncConnectionPool[Connection]
