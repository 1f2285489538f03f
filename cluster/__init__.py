"""A real single-machine Kubernetes built offline from upstream parts, for raftlog's `k8s` tests.

`python -m cluster up` (`make cluster`) builds what is missing (the Kubernetes commands, etcd,
CoreDNS, helm and the local-path provisioner from their Go modules; containerd, runc and the CNI
plugins from Debian; the images from Debian's packages), starts the control plane and one node
in a network namespace of its own, and writes `.cluster/kubeconfig`. `python -m cluster down`
(`make cluster-down`) stops every process it started and leaves nothing mounted.
"""
