"""The Spark wing: everything that imports pyspark lives here and nowhere else.

session, the Kafka source (a Python streaming data source), the decode stage, the plan compiler,
the operator binding (Arrow payloads across transformWithStateInPandas), the report channel from
the Python workers to the driver, the delta-spark sink engine and the progress listener. The rest
of the package (formats, operators, plan, the delta-rs sink, the service's config) imports and
works without pyspark. Importing this package itself does not import pyspark.
"""
