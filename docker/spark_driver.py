"""Driver main for the chart's SparkApplication mode.

spark-submit runs this file as the application's primary resource and passes
the changelake CLI arguments after it (``run -c /etc/changelake/pipeline.yaml``),
so the driver runs the same command as the single-pod StatefulSet does.
"""

import sys

from changelake.service.cli import main

if __name__ == "__main__":
    sys.argv = ["changelake", *sys.argv[1:]]
    sys.exit(main())
