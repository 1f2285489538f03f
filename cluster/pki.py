"""The cluster's certificates, service-account keys and kubeconfigs (made once per state dir).

One CA signs every serving and client certificate, as kubeadm lays them out: each component
authenticates to the API server with a client certificate whose CN/O are the user and group the
built-in RBAC roles name (`system:kube-controller-manager`, `system:node:<node>` in
`system:nodes`, ...), so `--authorization-mode=Node,RBAC` holds for the control plane too.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cluster import layout

Key = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
YEAR = datetime.timedelta(days=365)

# name -> (CN, O, server alt names or None for a client certificate)
CLIENTS: dict[str, tuple[str, str | None]] = {
    "admin": ("kubernetes-admin", "system:masters"),
    "controller-manager": ("system:kube-controller-manager", None),
    "scheduler": ("system:kube-scheduler", None),
    "kubelet": (f"system:node:{layout.NODE_NAME}", "system:nodes"),
    "kube-proxy": ("system:kube-proxy", None),
    "apiserver-kubelet-client": ("kube-apiserver-kubelet-client", "system:masters"),
}


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _pem_key(key: Key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.write_bytes(data)
    path.chmod(0o600 if private else 0o644)


def _issue(
    ca_key: Key,
    ca_cert: x509.Certificate,
    cn: str,
    org: str | None,
    sans: list[str] | None,
) -> tuple[Key, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn, org))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + YEAR)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, True, False, False, False, False, False, False),
            critical=True,
        )
    )
    if sans is None:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    else:
        alt: list[x509.GeneralName] = []
        for s in sans:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(s)))
            except ValueError:
                alt.append(x509.DNSName(s))
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        ).add_extension(x509.SubjectAlternativeName(alt), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def _ca() -> tuple[Key, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    name = _name("raftlog-test-cluster-ca")
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + 10 * YEAR)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def kubeconfig(user: str, ca: bytes, cert: bytes, key: bytes, server: str) -> dict[str, Any]:
    def b64(b: bytes) -> str:
        return base64.b64encode(b).decode()

    cluster = {"server": server, "certificate-authority-data": b64(ca)}
    creds = {"client-certificate-data": b64(cert), "client-key-data": b64(key)}
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "raftlog", "cluster": cluster}],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": "raftlog", "context": {"cluster": "raftlog", "user": user}}],
        "current-context": "raftlog",
    }


def ensure(pki: Path) -> None:
    """Certificates, keys and kubeconfigs under `pki`, unless they are already there."""
    if (pki / "done").exists():
        return
    pki.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _ca()
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    _write(pki / "ca.crt", ca_pem)
    _write(pki / "ca.key", _pem_key(ca_key), private=True)

    def issue(name: str, cn: str, org: str | None, sans: list[str] | None) -> tuple[bytes, bytes]:
        key, cert = _issue(ca_key, ca_cert, cn, org, sans)
        cert_pem, key_pem = cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)
        _write(pki / f"{name}.crt", cert_pem)
        _write(pki / f"{name}.key", key_pem, private=True)
        return cert_pem, key_pem

    svc_domain = f"svc.{layout.CLUSTER_DOMAIN}"
    issue(
        "apiserver", "kube-apiserver", None,
        ["kubernetes", "kubernetes.default", "kubernetes.default.svc",
         f"kubernetes.default.{svc_domain}", "localhost", layout.API_SERVICE_IP,
         layout.NODE_IP, "127.0.0.1"],
    )  # fmt: skip
    issue("kubelet-serving", layout.NODE_NAME, None, [layout.NODE_NAME, layout.NODE_IP])
    server = f"https://{layout.NODE_IP}:{layout.API_PORT}"
    for name, (cn, org) in CLIENTS.items():
        cert_pem, key_pem = issue(name, cn, org, None)
        if name != "apiserver-kubelet-client":
            cfg = kubeconfig(cn, ca_pem, cert_pem, key_pem, server)
            _write(pki / f"{name}.kubeconfig", yaml.safe_dump(cfg).encode(), private=True)
    # The service-account token signing key (RSA: what every client library verifies).
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write(pki / "sa.key", _pem_key(sa), private=True)
    _write(
        pki / "sa.pub",
        sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )
    (pki / "done").write_text("")
