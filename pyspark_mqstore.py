from tools.spark.source import MqstoreDataSource as DefaultSource  # noqa: F401 - found by Spark
