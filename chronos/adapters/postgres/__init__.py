"""The PostgreSQL store adapter: its SQL (sql/queries.sql) and migrations (sql/NNNN_*.sql)."""
