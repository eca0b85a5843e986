"""Pages of the benchmarks app, one module per feature: runs (launch, watch, cancel), history
(the table, compare, export/import), profiles, cost (prices and the cost page)."""
