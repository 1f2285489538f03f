#!/usr/bin/env bash
# The archive job on Spark on Kubernetes with plain spark-submit (cluster mode).
#
#   K8S_API=https://kube.example.com:6443 IMAGE=registry.example.com/raftlog-spark:0.1.0 \
#   ENDPOINTS=http://orders-0.orders.raftlog.svc:7001,http://orders-1.orders.raftlog.svc:7001,http://orders-2.orders.raftlog.svc:7001 \
#   ./examples/spark/spark-submit-archive.sh
#
# Needs: a service account `spark` allowed to create pods in NAMESPACE (Spark's own RBAC), a
# ReadWriteMany PVC `raftlog-archive` for the Parquet output and the checkpoint (or use
# s3a:// paths with the Hadoop AWS jars in the image), and the RaftCluster's token secret when
# the job holds retention (`--retention-hold`).
set -euo pipefail
: "${K8S_API:?the Kubernetes API server URL}"
: "${IMAGE:?the image built from examples/spark/Dockerfile}"
: "${ENDPOINTS:?comma-separated raftlog node URLs}"
NAMESPACE=${NAMESPACE:-raftlog}
TOKEN_SECRET=${TOKEN_SECRET:-orders-token}   # the RaftCluster's bearer token secret

exec spark-submit \
  --master "k8s://${K8S_API}" \
  --deploy-mode cluster \
  --name raftlog-archive \
  --conf spark.kubernetes.namespace="${NAMESPACE}" \
  --conf spark.kubernetes.container.image="${IMAGE}" \
  --conf spark.kubernetes.authenticate.driver.serviceAccountName=spark \
  --conf spark.executor.instances=2 \
  --conf spark.kubernetes.driver.volumes.persistentVolumeClaim.archive.options.claimName=raftlog-archive \
  --conf spark.kubernetes.driver.volumes.persistentVolumeClaim.archive.mount.path=/data \
  --conf spark.kubernetes.executor.volumes.persistentVolumeClaim.archive.options.claimName=raftlog-archive \
  --conf spark.kubernetes.executor.volumes.persistentVolumeClaim.archive.mount.path=/data \
  --conf spark.kubernetes.driver.secrets."${TOKEN_SECRET}"=/etc/raftlog \
  local:///opt/raftlog/archive_main.py \
  --endpoints "${ENDPOINTS}" \
  --output /data/orders/records \
  --checkpoint /data/orders/checkpoint \
  --retention-hold archive-orders \
  --token-file /etc/raftlog/token \
  --trigger-seconds 30
