#!/bin/bash
# The entrypoint of raftlog's Spark image, as Spark's Kubernetes resource manager calls it:
#   driver ARGS...   the driver pod: spark-submit in client mode inside the pod, bound to the
#                    pod's address (SPARK_DRIVER_BIND_ADDRESS), with the arguments the submission
#                    client gave (--properties-file /opt/spark/conf/spark.properties, --class...)
#   executor         an executor pod: Spark's Kubernetes executor backend, configured by the
#                    SPARK_* variables the driver set on the pod
#   anything else    run as given
set -euo pipefail
SPARK_HOME=${SPARK_HOME:-/opt/spark-home}
case "${1:-}" in
driver)
  shift
  exec "$SPARK_HOME/bin/spark-submit" \
    --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS:?}" \
    --deploy-mode client "$@"
  ;;
executor)
  shift
  # The driver's options (port, auth, extraJavaOptions) in order: SPARK_JAVA_OPT_0, _1, ...
  java_opts=()
  for n in $(compgen -v SPARK_JAVA_OPT_ | sed 's/^SPARK_JAVA_OPT_//' | sort -n); do
    var="SPARK_JAVA_OPT_$n"
    java_opts+=("${!var}")
  done
  classpath="${SPARK_CONF_DIR:-/opt/spark/conf}"
  classpath+="${SPARK_CLASSPATH:+:$SPARK_CLASSPATH}:$SPARK_HOME/jars/*:$PWD"
  exec "${JAVA_HOME:-/usr/lib/jvm/java-17-openjdk-amd64}/bin/java" "${java_opts[@]}" \
    "-Xms${SPARK_EXECUTOR_MEMORY:?}" "-Xmx${SPARK_EXECUTOR_MEMORY}" -cp "$classpath" \
    org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
    --driver-url "${SPARK_DRIVER_URL:?}" --executor-id "${SPARK_EXECUTOR_ID:?}" \
    --cores "${SPARK_EXECUTOR_CORES:?}" --app-id "${SPARK_APPLICATION_ID:?}" \
    --hostname "${SPARK_EXECUTOR_POD_IP:?}" --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
    --podName "${SPARK_EXECUTOR_POD_NAME:?}"
  ;;
*)
  exec "$@"
  ;;
esac
