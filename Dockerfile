# syntax=docker/dockerfile:1
#
# changelake production image.
#
#   docker build -t changelake:0.1.0 .
#   docker build --target spark -t changelake:0.1.0-spark .   # SparkApplication mode
#
# Stages:
#   jvm      - installs the project's pinned Spark JVM sets (jvm/pom.xml, checked
#              against jvm/jvm.lock: delta, spark-kafka) with Maven, as `make install` does.
#   jars     - fetches the optional S3A jars from Maven Central and checks them
#              against Maven's published SHA-1 sums.
#   builder  - builds a virtualenv with changelake and the pinned dependencies
#              from pyproject.toml.
#   runtime  - Python 3.11 + Java 17 JRE, non-root, ENTRYPOINT ["changelake"].
#   spark    - runtime plus an entrypoint that speaks the Spark-on-Kubernetes
#              driver/executor protocol, for the SparkApplication chart mode.

ARG PYTHON_VERSION=3.11
ARG DEBIAN_RELEASE=bookworm

# ---------------------------------------------------------------------------
FROM python:${PYTHON_VERSION}-slim-${DEBIAN_RELEASE} AS jvm

# The one pinned list of JVM artifacts (jvm/pom.xml, jvm/jvm.lock), installed by changelake/jvm_deps.py into
# /opt/changelake/jvm/<set>/ with the lock beside them; a jar that differs from the lock fails the build.
RUN apt-get update \
 && apt-get install -y --no-install-recommends maven openjdk-17-jdk-headless \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY jvm ./jvm
COPY changelake ./changelake
RUN CHANGELAKE_JVM_DEPS_HOME=/opt/changelake/jvm CHANGELAKE_JVM_DEPS_REQUIRED=1 \
    python -m changelake.jvm_deps install delta spark-kafka \
 && cp jvm/jvm.lock /opt/changelake/jvm/jvm.lock \
 && rm -rf /root/.m2

# ---------------------------------------------------------------------------
FROM debian:${DEBIAN_RELEASE}-slim AS jars

# Hadoop S3A connector; must equal the hadoop-client-api version bundled in pyspark's jars/.
ARG WITH_S3A=true
ARG HADOOP_VERSION=3.5.0
# "auto" reads the AWS SDK v2 version from Hadoop's own hadoop-project POM.
ARG AWS_SDK_BUNDLE_VERSION=auto
ARG MAVEN_REPO=https://repo1.maven.org/maven2

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/*

COPY docker/fetch-jar.sh /usr/local/bin/fetch-jar
WORKDIR /jars
RUN if [ "${WITH_S3A}" = "true" ]; then \
      sdk="${AWS_SDK_BUNDLE_VERSION}"; \
      if [ "$sdk" = "auto" ]; then \
        sdk="$(curl -fsSL "${MAVEN_REPO}/org/apache/hadoop/hadoop-project/${HADOOP_VERSION}/hadoop-project-${HADOOP_VERSION}.pom" \
               | sed -n 's:.*<aws-java-sdk-v2.version>\(.*\)</aws-java-sdk-v2.version>.*:\1:p' | head -n1)"; \
        test -n "$sdk" || { echo "could not read aws-java-sdk-v2.version from hadoop-project ${HADOOP_VERSION}" >&2; exit 1; }; \
      fi; \
      fetch-jar "${MAVEN_REPO}" org.apache.hadoop hadoop-aws "${HADOOP_VERSION}" \
      && fetch-jar "${MAVEN_REPO}" software.amazon.awssdk bundle "$sdk"; \
    fi

# ---------------------------------------------------------------------------
FROM python:${PYTHON_VERSION}-slim-${DEBIAN_RELEASE} AS builder

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Dependencies first (pinned in pyproject.toml) so code edits reuse this layer.
COPY pyproject.toml README.md ./
RUN python -c 'import tomllib; f = open("pyproject.toml", "rb"); print("\n".join(tomllib.load(f)["project"]["dependencies"]))' > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt
COPY changelake ./changelake
RUN pip install --no-deps . \
 && changelake version

# ---------------------------------------------------------------------------
FROM python:${PYTHON_VERSION}-slim-${DEBIAN_RELEASE} AS runtime

ARG PYTHON_VERSION
ARG METRICS_PORT=9108
ARG UID=10001

RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/*

ENV JAVA_HOME=/opt/java \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYSPARK_PYTHON=/opt/venv/bin/changelake-worker-python \
    PYSPARK_DRIVER_PYTHON=/opt/venv/bin/changelake-worker-python \
    SPARK_HOME=/opt/venv/lib/python${PYTHON_VERSION}/site-packages/pyspark \
    CHANGELAKE_METRICS__PORT=${METRICS_PORT} \
    CHANGELAKE_JVM_ARCHIVE=/opt/changelake/spark-classes.jsa \
    CHANGELAKE_JVM_DEPS_HOME=/opt/changelake/jvm \
    MALLOC_ARENA_MAX=2 \
    ARROW_DEFAULT_MEMORY_POOL=system \
    HOME=/home/changelake
# The JRE directory name differs per architecture; give it one stable path.
RUN ln -s "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /opt/java \
 && /opt/java/bin/java -version

COPY --from=builder /opt/venv /opt/venv
COPY --from=jars /jars/ ${SPARK_HOME}/jars/
# The pinned sets: delta on Spark's own classpath (linked into its jars/), spark-kafka added to spark.jars by
# the session builder (kafka.reader: spark-kafka) or listed by the chart's SparkApplication (spec.jars)
COPY --from=jvm /opt/changelake/jvm /opt/changelake/jvm
RUN ln -s /opt/changelake/jvm/delta/*.jar "${SPARK_HOME}/jars/"

# Spark's classes in a class-data-sharing archive, written by a short demo run at build time: the driver
# JVM maps them in instead of loading them one by one (changelake/spark/jvm_archive.py; ~2 s less per start).
# A build where it cannot be written still works: the JVM then starts without it.
RUN mkdir -p /opt/changelake \
 && (changelake jvm-archive || echo "no JVM class archive; Spark starts without one") \
 && rm -rf /tmp/spark-* /tmp/changelake-*

RUN groupadd --system --gid ${UID} changelake \
 && useradd --system --uid ${UID} --gid ${UID} --home-dir /home/changelake --create-home changelake \
 && mkdir -p /etc/changelake /var/lib/changelake/checkpoints /tmp/spark \
 && chown -R ${UID}:${UID} /var/lib/changelake /tmp/spark

USER 10001:10001
WORKDIR /var/lib/changelake
EXPOSE ${METRICS_PORT}

HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('CHANGELAKE_METRICS__PORT', '9108'), timeout=4)"]

ENTRYPOINT ["changelake"]
CMD ["run", "-c", "/etc/changelake/pipeline.yaml"]

# ---------------------------------------------------------------------------
FROM runtime AS spark

# The Spark Kubernetes backend starts driver and executor pods with the
# arguments "driver ..." or "executor"; this entrypoint turns them into
# spark-submit (client mode inside the driver pod) or the executor backend.
COPY --chmod=0755 docker/spark-entrypoint.sh /usr/local/bin/spark-entrypoint
COPY --chmod=0644 docker/spark_driver.py /opt/changelake/spark_driver.py
ENTRYPOINT ["spark-entrypoint"]
CMD []
