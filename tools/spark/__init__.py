"""The Spark pipeline: a PySpark data source over store files, and the distributed jobs
(export, check, rebuild, stats)."""
