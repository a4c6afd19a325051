-- chronos: compatible from 8
-- The input partitions this database's cell owns, each with its epoch and state: `open` (its messages are
-- written here) or `moving` (on its way to another cell: written nowhere until that cell opens it at a
-- higher epoch). Empty, the cell owns every partition: a deployment without cells is one cell. Every
-- change of the map locks the table against the consumers' writes (cell_map_lock), and a consumer checks
-- in its write's own transaction, as its last statement, that the partitions it wrote are still this
-- cell's at the epochs it knows (cell_fence): a consumer holding a stale map cannot write a moved partition.
CREATE TABLE IF NOT EXISTS chronos_cell_partitions (
    partition  integer PRIMARY KEY CHECK (partition >= 0),
    epoch      bigint NOT NULL CHECK (epoch > 0),
    state      text NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'moving'))
);
