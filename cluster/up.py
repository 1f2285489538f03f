"""Starting and stopping the cluster: control plane, containerd, kubelet, kube-proxy, add-ons.

Order of `up`: network namespace and veth, etcd, API server, controller manager and scheduler,
containerd (images imported), kubelet (bridge CNI), kube-proxy (iptables mode), then the add-ons
(CoreDNS, the local-path provisioner as the default StorageClass). It waits until the node is
Ready, DNS answers from the host and the provisioner runs, and is idempotent: what runs already
is left alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from cluster import build, images, layout, pki, procs
from cluster.build import say

PKI = layout.STATE / "pki"
DATA = layout.STATE / "data"
CTRD = layout.STATE / "containerd"
CTRD_SOCK = CTRD / "containerd.sock"
KUBELET_DIR = layout.STATE / "kubelet"
VOLUMES = layout.STATE / "volumes"
CNI_CONF = layout.STATE / "cni" / "net.d"
OWNER = Path("/run") / f"{layout.NETNS}.owner"
AUDIT_POLICY = layout.STATE / "audit-policy.yaml"
AUDIT_LOG = layout.STATE / "logs" / "audit.log"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
              "containerd", "kubelet", "kube-proxy")  # fmt: skip


def write(path: Path, text: str) -> None:
    """Rewritten only when it changes: kube-proxy exits when its config file is touched."""
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=120)


def in_ns(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return sh("nsenter", f"--net={procs.NETNS_PATH}", "--", *argv, check=check)


# ---------------------------------------------------------------------------------- network
def network() -> None:
    if not procs.NETNS_PATH.exists():
        sh("ip", "netns", "add", layout.NETNS)
    if sh("ip", "link", "show", layout.HOST_VETH, check=False).returncode != 0:
        sh("ip", "link", "add", layout.HOST_VETH, "type", "veth", "peer", "name", layout.NS_VETH,
           "netns", layout.NETNS)  # fmt: skip
        sh("ip", "addr", "add", f"{layout.HOST_IP}/30", "dev", layout.HOST_VETH)
        sh("ip", "-n", layout.NETNS, "addr", "add", f"{layout.NODE_IP}/30", "dev", layout.NS_VETH)
    for link in ("lo", layout.NS_VETH):
        sh("ip", "-n", layout.NETNS, "link", "set", link, "up")
    sh("ip", "link", "set", layout.HOST_VETH, "up")
    # The host reaches pods and Services through the node, as a router would.
    for cidr in (layout.POD_CIDR, layout.SERVICE_CIDR):
        sh("ip", "route", "replace", cidr, "via", layout.NODE_IP)
    # Pod-to-Service replies cross the bridge: they must go through the node's conntrack.
    in_ns("sysctl", "-qw", "net.ipv4.ip_forward=1", "net.bridge.bridge-nf-call-iptables=1")


# ---------------------------------------------------------------------------------- control plane
def _api_ready() -> bool:
    ctx = ssl.create_default_context(cafile=str(PKI / "ca.crt"))
    ctx.load_cert_chain(str(PKI / "admin.crt"), str(PKI / "admin.key"))
    url = f"https://{layout.NODE_IP}:{layout.API_PORT}/readyz"
    with urllib.request.urlopen(url, context=ctx, timeout=5) as r:
        return bool(r.status == 200)


def control_plane(bins: dict[str, Path]) -> None:
    p = str(PKI)
    write(AUDIT_POLICY, yaml.safe_dump({
        "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
        "rules": [
            {"level": "None", "userGroups": [f"system:serviceaccounts:{ns}" for ns in
                                             ("kube-system", "local-path-storage")]},
            {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
            {"level": "None"},
        ],
    }))  # fmt: skip
    procs.start("etcd", [
        str(bins["etcd"]), "--name", "raftlog", "--data-dir", str(DATA / "etcd"),
        "--listen-client-urls", layout.ETCD_CLIENT, "--advertise-client-urls", layout.ETCD_CLIENT,
        "--listen-peer-urls", "http://127.0.0.1:2380", "--quota-backend-bytes", str(2 << 30),
        "--log-level", "warn",
    ])  # fmt: skip
    procs.start("kube-apiserver", [
        str(bins["kube-apiserver"]),
        f"--advertise-address={layout.NODE_IP}", f"--secure-port={layout.API_PORT}",
        f"--etcd-servers={layout.ETCD_CLIENT}",
        f"--client-ca-file={p}/ca.crt",
        f"--tls-cert-file={p}/apiserver.crt", f"--tls-private-key-file={p}/apiserver.key",
        f"--kubelet-client-certificate={p}/apiserver-kubelet-client.crt",
        f"--kubelet-client-key={p}/apiserver-kubelet-client.key",
        f"--kubelet-certificate-authority={p}/ca.crt",
        "--kubelet-preferred-address-types=InternalIP",
        f"--service-account-issuer=https://kubernetes.default.svc.{layout.CLUSTER_DOMAIN}",
        f"--service-account-key-file={p}/sa.pub",
        f"--service-account-signing-key-file={p}/sa.key",
        f"--service-cluster-ip-range={layout.SERVICE_CIDR}",
        "--authorization-mode=Node,RBAC",
        # The default admission plugins, plus the Node restriction kubeadm enables.
        "--enable-admission-plugins=NodeRestriction",
        "--allow-privileged=true", "--profiling=false", "--v=1",
        # What ServiceAccounts outside the cluster's own namespaces ask for, as the audit
        # log records it: the tests check the operator's calls against the chart's RBAC.
        f"--audit-policy-file={AUDIT_POLICY}", f"--audit-log-path={AUDIT_LOG}",
        "--audit-log-maxsize=200", "--audit-log-maxbackup=1", "--audit-log-format=json",
    ])  # fmt: skip
    procs.wait_for("API server /readyz", _api_ready, 120, log="kube-apiserver")
    common = [
        f"--kubeconfig={p}/{{}}.kubeconfig",
        f"--authentication-kubeconfig={p}/{{}}.kubeconfig",
        f"--authorization-kubeconfig={p}/{{}}.kubeconfig",
        "--leader-elect=false", "--bind-address=127.0.0.1", "--profiling=false", "--v=1",
    ]  # fmt: skip
    procs.start("kube-controller-manager", [
        str(bins["kube-controller-manager"]),
        *[c.format("controller-manager") for c in common],
        f"--root-ca-file={p}/ca.crt",
        f"--service-account-private-key-file={p}/sa.key",
        f"--cluster-signing-cert-file={p}/ca.crt", f"--cluster-signing-key-file={p}/ca.key",
        "--use-service-account-credentials=true",
        f"--service-cluster-ip-range={layout.SERVICE_CIDR}",
    ])  # fmt: skip
    procs.start("kube-scheduler", [
        str(bins["kube-scheduler"]), *[c.format("scheduler") for c in common],
    ])  # fmt: skip


# ---------------------------------------------------------------------------------- node
def containerd(image_tars: list[images.Image]) -> None:
    CTRD.mkdir(parents=True, exist_ok=True)
    CNI_CONF.mkdir(parents=True, exist_ok=True)
    cri = '"io.containerd.grpc.v1.cri"'
    write(
        CTRD / "config.toml",
        f"""version = 2
root = "{CTRD}/root"
state = "{CTRD}/state"
[grpc]
  address = "{CTRD_SOCK}"
[plugins.{cri}]
  sandbox_image = "{images.PAUSE_REF}"
  netns_mounts_under_state_dir = true
  # This machine's root lacks CAP_SYS_RESOURCE: no oom_score_adj below containerd's own.
  restrict_oom_score_adj = true
  [plugins.{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins.{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{CTRD}/runc"
  [plugins.{cri}.cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{CNI_CONF}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{CTRD}/opt"
""",
    )
    procs.start("containerd", ["containerd", "--config", str(CTRD / "config.toml")])
    procs.wait_for(
        "containerd",
        lambda: sh("ctr", "--address", str(CTRD_SOCK), "version", check=False).returncode == 0,
        60, log="containerd",
    )  # fmt: skip
    listed = sh("ctr", "--address", str(CTRD_SOCK), "-n", "k8s.io", "images", "ls").stdout
    have = {tuple(line.split()[:3:2]) for line in listed.splitlines()[1:]}  # (ref, digest)
    for tar, ref in image_tars:
        # raftlog's ref is rebuilt under the same name when its sources change: by digest.
        if (ref, images.digest(tar)) not in have:
            images.import_image(tar, ref, str(CTRD_SOCK))


def kubelet(bins: dict[str, Path]) -> None:
    subnet = layout.POD_CIDR.replace(".0.0/16", ".0.0/24")
    write(CNI_CONF / "10-raftlog.conflist", json.dumps({
        "cniVersion": "1.0.0", "name": "raftlog",
        "plugins": [
            {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False,
             "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]],
                      "routes": [{"dst": "0.0.0.0/0"}],
                      "dataDir": str(layout.STATE / "cni" / "ipam")}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }, indent=1))  # fmt: skip
    KUBELET_DIR.mkdir(parents=True, exist_ok=True)
    resolv = layout.STATE / "resolv.conf"  # pods' upstream: none (the cluster is offline)
    write(resolv, f"nameserver {layout.DNS_SERVICE_IP}\n")
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(PKI / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,  # the machine's cgroups are v1
        "clusterDNS": [layout.DNS_SERVICE_IP],
        "clusterDomain": layout.CLUSTER_DOMAIN,
        "containerRuntimeEndpoint": f"unix://{CTRD_SOCK}",
        "resolvConf": str(resolv),
        "tlsCertFile": str(PKI / "kubelet-serving.crt"),
        "tlsPrivateKeyFile": str(PKI / "kubelet-serving.key"),
        "failSwapOn": False,
        "podLogsDirectory": str(layout.STATE / "pod-logs"),
        # Imported images cannot be pulled again: never garbage-collect them, never evict.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        "serializeImagePulls": False,
        "podPidsLimit": 4096,
    }  # fmt: skip
    write(KUBELET_DIR / "config.yaml", yaml.safe_dump(config))
    procs.start("kubelet", [
        str(bins["kubelet"]), f"--config={KUBELET_DIR}/config.yaml",
        f"--kubeconfig={PKI}/kubelet.kubeconfig", f"--root-dir={KUBELET_DIR}",
        f"--hostname-override={layout.NODE_NAME}", f"--node-ip={layout.NODE_IP}", "--v=1",
    ])  # fmt: skip
    proxy = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(PKI / "kube-proxy.kubeconfig")},
        "clusterCIDR": layout.POD_CIDR,
        "hostnameOverride": layout.NODE_NAME,
        "metricsBindAddress": "127.0.0.1:10249",
        "nodePortAddresses": ["primary"],
        # In a network namespace the conntrack table sizes are the host's: leave them alone.
        "conntrack": {"maxPerCore": 0, "tcpEstablishedTimeout": "0s",
                      "tcpCloseWaitTimeout": "0s"},
    }  # fmt: skip
    write(layout.STATE / "kube-proxy.yaml", yaml.safe_dump(proxy))
    procs.start("kube-proxy", [str(bins["kube-proxy"]), f"--config={layout.STATE}/kube-proxy.yaml"])


# ---------------------------------------------------------------------------------- add-ons
def kubectl(*args: str, stdin: str | None = None, check: bool = True) -> str:
    done = subprocess.run(
        ["kubectl", f"--kubeconfig={layout.KUBECONFIG}", *args],
        input=stdin, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if check and done.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def addons() -> None:
    values = {
        "DNS_SERVICE_IP": layout.DNS_SERVICE_IP,
        "CLUSTER_DOMAIN": layout.CLUSTER_DOMAIN,
        "COREDNS_IMAGE": images.COREDNS_REF,
        "LOCAL_PATH_IMAGE": images.LOCAL_PATH_REF,
        "BUSYBOX_IMAGE": images.busybox_ref(),
        "VOLUMES": str(VOLUMES),
    }
    for name in ("coredns.yaml", "local-path.yaml"):
        text = (layout.SRC / "addons" / name).read_text()
        for k, v in values.items():
            text = text.replace("${" + k + "}", v)
        kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=text)


def node_ready() -> bool:
    node = json.loads(kubectl("get", "node", layout.NODE_NAME, "-o", "json"))
    conds = {c["type"]: c["status"] for c in node["status"].get("conditions", [])}
    return conds.get("Ready") == "True"


def deployment_ready(ns: str, name: str) -> bool:
    d: dict[str, Any] = json.loads(kubectl("-n", ns, "get", "deployment", name, "-o", "json"))
    return bool(d.get("status", {}).get("readyReplicas", 0) >= d["spec"]["replicas"])


def dns_answers() -> bool:
    from cluster import dnsprobe

    name = f"kubernetes.default.svc.{layout.CLUSTER_DOMAIN}"
    return dnsprobe.resolve(name, layout.DNS_SERVICE_IP) == layout.API_SERVICE_IP


# ---------------------------------------------------------------------------------- up / down
def up() -> None:
    started = time.monotonic()
    if os.geteuid() != 0:
        raise SystemExit("cluster: run as root (it makes a network namespace and runs a kubelet)")
    take_over()
    build.ensure_packages()
    bins = build.ensure_binaries()
    tars = images.ensure_all(bins)
    layout.STATE.mkdir(exist_ok=True)
    OWNER.write_text(str(layout.STATE))
    pki.ensure(PKI)
    shutil.copy(PKI / "admin.kubeconfig", layout.KUBECONFIG)
    network()
    control_plane(bins)
    containerd(tars)
    kubelet(bins)
    try:
        procs.wait_for("node Ready", node_ready, 180, log="kubelet")
    except RuntimeError as e:
        if procs.running("kubelet"):
            raise
        # Once, on a fresh clone in CI, the kubelet exited at its start: the rename of its
        # pod-resources socket into place failed with EXDEV (same directory, same disk); the
        # next start went through. A second exit is the run's failure, with its log.
        say(f"the kubelet exited before the node was Ready; starting it once more: {e}")
        kubelet(bins)
        procs.wait_for("node Ready", node_ready, 180, log="kubelet")
    addons()
    procs.wait_for("CoreDNS ready", lambda: deployment_ready("kube-system", "coredns"), 180)
    procs.wait_for("DNS answers", dns_answers, 60, log="kube-proxy")
    procs.wait_for(
        "local-path provisioner",
        lambda: deployment_ready("local-path-storage", "local-path-provisioner"), 120,
    )  # fmt: skip
    say(f"up in {time.monotonic() - started:.0f} s; node {layout.NODE_NAME} Ready, DNS answers")
    print(f"export KUBECONFIG={layout.KUBECONFIG}")


def status() -> int:
    """0 when every component of this checkout's cluster runs; prints which do not."""
    down_ = [c for c in COMPONENTS if not procs.alive(c)]
    for c in down_:
        print(f"{c}: not running")
    if not down_:
        print(f"up: export KUBECONFIG={layout.KUBECONFIG}")
    return 1 if down_ else 0


def take_over() -> None:
    """A cluster of another checkout (or one whose processes died) is stopped first."""
    if not OWNER.exists():
        return
    other = Path(OWNER.read_text().strip())
    if other != layout.STATE:
        say(f"stopping the cluster of {other} (one cluster per machine)")
        down(other)


def down(state: Path = layout.STATE) -> None:
    """Stops every process, unmounts what the kubelet and containerd mounted, removes the netns."""
    pids = state / "pids"
    for name in reversed(COMPONENTS):
        pid_file = pids / f"{name}.pid"
        if pid_file.exists():
            with contextlib.suppress(ValueError):
                procs.kill_and_wait([int(pid_file.read_text())], 15)
            pid_file.unlink()
    # Containers outlive containerd (their shims are their parents): stop them by cgroup.
    procs.kill_and_wait(pod_processes() + shim_processes(state), 10)
    unmount_under(state)
    remove_pod_cgroups()
    if procs.NETNS_PATH.exists():
        sh("ip", "netns", "del", layout.NETNS, check=False)
    sh("ip", "link", "del", layout.HOST_VETH, check=False)
    if OWNER.exists() and Path(OWNER.read_text().strip()) == state:
        OWNER.unlink()
    say("down: no cluster process left, nothing mounted")


def pod_processes() -> list[int]:
    out: list[int] = []
    for procs_file in Path("/sys/fs/cgroup/pids/kubepods").rglob("cgroup.procs"):
        out += [int(p) for p in procs_file.read_text().split()]
    return out


def shim_processes(state: Path) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if b"containerd-shim" in cmd and str(state).encode() in cmd:
                out.append(int(d.name))
    return out


def unmount_under(state: Path) -> None:
    for _ in range(3):
        mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        mine = sorted({m for m in mounts if m.startswith(str(state) + "/")}, key=len, reverse=True)
        if not mine:
            return
        for m in mine:
            sh("umount", "-l", m, check=False)


def remove_pod_cgroups() -> None:
    for controller in Path("/sys/fs/cgroup").iterdir():
        root = controller / "kubepods"
        if root.is_dir():
            for d in sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                if d.is_dir():
                    d.rmdir()
            root.rmdir()
