"""The version of the result-row schema (:data:`SCHEMA_VERSION`; the schema itself is
:data:`flyexplore.results.table.COLUMNS`), in a module of its own that imports nothing: a sweep's
worker process stamps each row it makes with it, and so never imports pandas and pyarrow
(0.35-0.45 CPU-s and tens of MB a process on a 2-core machine) for one integer."""

#: The schema version stored in every result row; :func:`flyexplore.results.table.load` upgrades
#: rows of older versions to it.
SCHEMA_VERSION = 2
