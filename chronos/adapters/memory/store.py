"""`MemoryStore`, the twin of the PostgreSQL `Store`: one class per port, each in its own module over the
handle (`base.MemoryHandle`), all of them together."""

from __future__ import annotations

from chronos import ports
from chronos.adapters.memory.cells import MemoryCellMap
from chronos.adapters.memory.claims import MemoryClaims
from chronos.adapters.memory.detect import MemoryDetect
from chronos.adapters.memory.intake import MemoryIntake
from chronos.adapters.memory.moves import MemoryMoves
from chronos.adapters.memory.operators import MemoryOperators
from chronos.adapters.memory.settle import MemorySettle
from chronos.adapters.memory.takes import MemoryTakes


class MemoryStore(MemoryIntake, MemoryClaims, MemorySettle, MemoryDetect, MemoryOperators, MemoryCellMap, MemoryMoves):
    """A handle on a `MemoryDatabase` (a fresh one when none is given), for one thread."""


# held to the ports by the type checker, as the PostgreSQL store is; and each port's statements in the class of
# its module
_PORT: type[ports.Store] = MemoryStore
_OPERATORS_PORT: type[ports.OperatorsStore] = MemoryStore
_INTAKE_PORT: type[ports.IntakeStore] = MemoryIntake
_CLAIM_PORT: type[ports.ClaimStore] = MemoryClaims
_SETTLE_PORT: type[ports.SettleStore] = MemorySettle
_DETECT_PORT: type[ports.DetectStore] = MemoryDetect
_OPERATORS_STATEMENTS_PORT: type[ports.OperatorsStore] = MemoryOperators
_TAKE_PORT: type[ports.TakeStore] = MemoryTakes
_CELL_MAP_PORT: type[ports.CellMapStore] = MemoryCellMap
_MOVE_PORT: type[ports.MoveStore] = MemoryMoves
_MOVE_STORE: type[ports.MoveStore] = MemoryStore
