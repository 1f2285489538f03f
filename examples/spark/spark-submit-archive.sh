#!/usr/bin/env bash
# The archive job on Spark on Kubernetes with plain spark-submit (cluster mode): a streaming
# query that lands a RaftCluster's committed records as Parquet, exactly once, on the volume
# of examples/spark/archive-pvc.yaml, holding retention at what it has not archived yet.
#
#   kubectl apply -n raftlog -f examples/spark/rbac.yaml -f examples/spark/archive-pvc.yaml
#   K8S_API=https://kube.example.com:6443 IMAGE=registry.example.com/raftlog-spark:0.1.0 \
#     CLUSTER=orders NAMESPACE=raftlog ./examples/spark/spark-submit-archive.sh [JOB ARGS...]
#
# JOB ARGS go to the job after the ones below (`--once` archives what is committed and stops;
# see `python -m raftlog.spark.jobs.archive --help`). spark-submit is pyspark's (`pip install
# 'raftlog[spark]'`), and it reaches the API server with your kubeconfig ($KUBECONFIG).
# IMAGE is built from examples/spark/Dockerfile (`make cluster` builds it as
# ghcr.io/raftlog/raftlog-spark:0.1.0 for the tests).
set -euo pipefail
: "${K8S_API:?the Kubernetes API server URL}"
: "${IMAGE:?the image built from examples/spark/Dockerfile}"
CLUSTER=${CLUSTER:-orders}       # the RaftCluster's name
NAMESPACE=${NAMESPACE:-raftlog}  # its namespace, where the job runs too
MEMBERS=${MEMBERS:-3}            # its spec.replicas: every member is listed
EXECUTORS=${EXECUTORS:-2}        # and CPU_REQUEST (250m) each, the driver's too
# Each member by its DNS name (the operator's headless Service <cluster>-peers), on its client
# port 7001: reads spread over the replicas, and the retention hold is placed on each.
ENDPOINTS=${ENDPOINTS:-$(for ((i = 0; i < MEMBERS; i++)); do
  printf 'http://%s-%d.%s-peers.%s.svc:7001\n' "$CLUSTER" "$i" "$CLUSTER" "$NAMESPACE"
done | paste -sd, -)}
# The operator's Secret <cluster>-auth (key `token`), unless spec.authSecretName names another.
TOKEN_SECRET=${TOKEN_SECRET:-$CLUSTER-auth}
PYTHON=/opt/raftlog/bin/python   # the image's venv, for the driver and the executors' workers
POD_TEMPLATE=${POD_TEMPLATE:-$(dirname "$0")/pod-template.yaml}  # Pod Security "restricted"
# JVM options for the driver and the executors (a collector, a JIT setting), if any.
JAVA_OPTIONS=${JAVA_OPTIONS:-}
java_options=()
if [[ -n "$JAVA_OPTIONS" ]]; then
  java_options=(--conf "spark.driver.extraJavaOptions=${JAVA_OPTIONS}"
    --conf "spark.executor.extraJavaOptions=${JAVA_OPTIONS}")
fi

exec spark-submit \
  --master "k8s://${K8S_API}" \
  --deploy-mode cluster \
  --name "raftlog-archive-${CLUSTER}" \
  --conf spark.kubernetes.namespace="${NAMESPACE}" \
  --conf spark.kubernetes.container.image="${IMAGE}" \
  --conf spark.kubernetes.container.image.pullPolicy=IfNotPresent \
  --conf spark.kubernetes.authenticate.driver.serviceAccountName=spark \
  --conf spark.pyspark.python="${PYTHON}" \
  --conf spark.pyspark.driver.python="${PYTHON}" \
  --conf spark.executor.instances="${EXECUTORS}" \
  --conf spark.kubernetes.driver.podTemplateFile="${POD_TEMPLATE}" \
  --conf spark.kubernetes.executor.podTemplateFile="${POD_TEMPLATE}" \
  --conf spark.driver.memory=768m \
  --conf spark.executor.memory=768m \
  --conf spark.kubernetes.driver.request.cores="${CPU_REQUEST:-250m}" \
  --conf spark.kubernetes.executor.request.cores="${CPU_REQUEST:-250m}" \
  --conf spark.kubernetes.driver.volumes.persistentVolumeClaim.archive.options.claimName=raftlog-archive \
  --conf spark.kubernetes.driver.volumes.persistentVolumeClaim.archive.mount.path=/data \
  --conf spark.kubernetes.executor.volumes.persistentVolumeClaim.archive.options.claimName=raftlog-archive \
  --conf spark.kubernetes.executor.volumes.persistentVolumeClaim.archive.mount.path=/data \
  --conf spark.kubernetes.driver.secrets."${TOKEN_SECRET}"=/etc/raftlog \
  ${java_options[@]+"${java_options[@]}"} \
  local:///opt/raftlog/archive_main.py \
  --endpoints "${ENDPOINTS}" \
  --output "/data/${CLUSTER}/records" \
  --checkpoint "/data/${CLUSTER}/checkpoint" \
  --retention-hold "archive-${CLUSTER}" \
  --token-file /etc/raftlog/token \
  --trigger-seconds 30 \
  "$@"
