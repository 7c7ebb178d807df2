"""A Lakeflow Declarative Pipelines source file on Databricks: a streaming table fed by a RabbitMQ queue, exactly once.

Untested (it needs a Databricks workspace): ``pipeline.json`` beside it creates the pipeline, and README.md
("Lakeflow Declarative Pipelines") says how. docs/pipelines.md runs the same definitions with open-source Spark's
``spark-pipelines`` in its tests. The pipeline's configuration gives ``amqp.uri``, ``amqp.queue`` and
``amqp.journal`` (a folder on a Unity Catalog volume, one per table); the password comes from a secret scope.
"""

from pyspark import pipelines as dp  # on channels without it: import dlt as dp

import spark_amqp

# Needed where the pipeline's Spark does not see the library by itself (DATA_SOURCE_NOT_FOUND); where it does, on
# Spark Connect, it does nothing.
spark_amqp.register(spark)  # noqa: F821 (the pipeline gives spark)


@dp.table(name="orders_raw", comment="RabbitMQ queue, exactly once (the batch journal); a full refresh keeps only what arrives after it")
def orders_raw():
    conf = spark.conf  # noqa: F821
    return (
        spark.readStream.format("amqp")  # noqa: F821
        .option("uri", conf.get("amqp.uri"))
        .option("password", dbutils.secrets.get("rabbitmq", "rabbitmq-password"))  # noqa: F821 (the pipeline gives dbutils)
        .option("queue", conf.get("amqp.queue"))
        .option("maxMessagesPerTrigger", "10000")
        .option("journalLocation", conf.get("amqp.journal"))  # on a volume: it must outlive the pipeline's compute
        .load()
        .selectExpr("CAST(body AS STRING) AS json", "message_id", "timestamp")
    )
