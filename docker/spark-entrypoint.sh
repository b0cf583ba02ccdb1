#!/bin/sh
# Entrypoint of the "spark" image target, used by the chart's SparkApplication
# mode. The Spark Kubernetes backend starts the driver pod with
# "driver <spark-submit args>" and executor pods with "executor" plus SPARK_*
# environment variables; anything else runs the changelake CLI.
set -eu

SPARK_HOME="${SPARK_HOME:?SPARK_HOME must point at the pyspark installation}"
classpath="${SPARK_HOME}/jars/*${SPARK_CLASSPATH:+:${SPARK_CLASSPATH}}"

case "${1:-}" in
  driver)
    shift
    exec "${SPARK_HOME}/bin/spark-submit" \
      --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS}" \
      --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=${SPARK_DRIVER_BIND_ADDRESS}" \
      --deploy-mode client \
      "$@"
    ;;
  executor)
    shift
    # Spark passes executor JVM options as SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, ...
    java_opts=""
    opt=""
    i=0
    while eval "[ -n \"\${SPARK_JAVA_OPT_${i}+set}\" ]"; do
      eval "opt=\${SPARK_JAVA_OPT_${i}}"
      java_opts="${java_opts} ${opt}"
      i=$((i + 1))
    done
    # shellcheck disable=SC2086  # options are separate words by design
    exec "${JAVA_HOME}/bin/java" ${java_opts} \
      -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
      -cp "${classpath}" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "${SPARK_DRIVER_URL}" \
      --executor-id "${SPARK_EXECUTOR_ID}" \
      --cores "${SPARK_EXECUTOR_CORES}" \
      --app-id "${SPARK_APPLICATION_ID}" \
      --hostname "${SPARK_EXECUTOR_POD_IP}" \
      --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID}" \
      --podName "${SPARK_EXECUTOR_POD_NAME}"
    ;;
  *)
    exec changelake "$@"
    ;;
esac
