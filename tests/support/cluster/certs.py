"""The test cluster's credentials: Trainer's serving certificate and the service-account tokens
the kubelet projects into pods, made with the `cryptography` package.

- `ServingCert`: what Trainer's certificate rotator keeps in Secret
  `kubeflow-trainer-webhook-cert` (kubeflow/trainer v2.3.0 pkg/util/cert/cert.go, ManageCerts,
  with open-policy-agent/cert-controller): a CA named `kubeflow-trainer-ca` of organization
  `kubeflow-trainer`, and a certificate it signs for `<service>.<namespace>.svc`, which the
  webhook and the status server serve. Here the certificate also names 127.0.0.1, where the
  pods reach that service (cluster/kubelet.py maps its DNS name there).
- `TokenIssuer`: the API server's service-account token issuer, as a TokenRequest for a
  projected `serviceAccountToken` volume gets it (kubernetes pkg/serviceaccount/claims.go): an
  RS256 JWT whose `aud` is the projection's audience, `exp` its expirationSeconds from now,
  `sub` `system:serviceaccount:<namespace>:<name>`, and `kubernetes.io` naming the namespace,
  the pod and the service account; `verify` is what Trainer's status server checks of one
  (pkg/statusserver/auth.go, through coreos/go-oidc v3 `IDTokenVerifier.Verify`).
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509.oid import NameOID

# The issuer kubeadm and most clusters give service-account tokens (--service-account-issuer).
ISSUER = "https://kubernetes.default.svc.cluster.local"
# coreos/go-oidc v3 verify.go: a token's nbf may be up to 5 minutes ahead (clock skew).
NBF_LEEWAY_S = 300


@dataclass(frozen=True)
class ServingCert:
    """A CA and a serving certificate it signed, PEM."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    @classmethod
    def make(cls, dns_name: str) -> ServingCert:
        now = dt.datetime.now(dt.UTC)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubeflow-trainer-ca"),
                             x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kubeflow-trainer")])
        ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
              .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - dt.timedelta(hours=1))
              .not_valid_after(now + dt.timedelta(days=1))
              .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
              .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                           crl_sign=True, content_commitment=False,
                                           key_encipherment=False, data_encipherment=False,
                                           key_agreement=False, encipher_only=False,
                                           decipher_only=False), critical=True)
              .sign(ca_key, hashes.SHA256()))  # fmt: skip
        key = ec.generate_private_key(ec.SECP256R1())
        names = [x509.DNSName(dns_name), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_name)]))
                .issuer_name(ca_name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(hours=1))
                .not_valid_after(now + dt.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName(names), critical=False)
                .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                               critical=False)
                .sign(ca_key, hashes.SHA256()))  # fmt: skip
        pem = serialization.Encoding.PEM
        return cls(ca.public_bytes(pem), cert.public_bytes(pem), key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))  # fmt: skip


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenIssuer:
    """Signs and verifies projected service-account tokens (RS256, one key)."""

    def __init__(self, issuer: str = ISSUER) -> None:
        self.issuer = issuer
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def issue(self, audience: str, expiration_s: int, namespace: str, pod: dict[str, Any],
              service_account: str = "default") -> str:  # fmt: skip
        """A token for `pod` (its metadata) running as `service_account` of `namespace`."""
        now = int(time.time())
        claims = {
            "aud": [audience], "exp": now + expiration_s, "iat": now, "nbf": now,
            "iss": self.issuer, "jti": str(uuid.uuid4()),
            "sub": f"system:serviceaccount:{namespace}:{service_account}",
            "kubernetes.io": {
                "namespace": namespace,
                "pod": {"name": pod["name"], "uid": pod["uid"]},
                "serviceaccount": {"name": service_account, "uid": str(uuid.uuid4())},
            },
        }  # fmt: skip
        header = {"alg": "RS256", "kid": "test-cluster"}
        signed = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        signature = self._key.sign(signed.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signed}.{_b64(signature)}"

    def verify(self, raw: str, audience: str) -> dict[str, Any] | None:
        """The token's claims where go-oidc's verifier accepts it for `audience`, else None:
        a JWS of three parts signed RS256 by this issuer's key, `iss` this issuer, `audience`
        among `aud`, not expired, and `nbf` (if any) no more than 5 minutes ahead."""
        parts = raw.split(".")
        if len(parts) != 3:
            return None
        try:
            header, claims = (json.loads(_unb64(p)) for p in parts[:2])
            if header.get("alg") != "RS256":
                return None
            self._key.public_key().verify(_unb64(parts[2]), f"{parts[0]}.{parts[1]}".encode(),
                                          padding.PKCS1v15(), hashes.SHA256())  # fmt: skip
        except (ValueError, InvalidSignature):
            return None
        aud = claims.get("aud")
        audiences = aud if isinstance(aud, list) else [aud]
        now = time.time()
        if (claims.get("iss") != self.issuer or audience not in audiences
                or not isinstance(claims.get("exp"), int | float) or claims["exp"] < now
                or (isinstance(claims.get("nbf"), int | float)
                    and now + NBF_LEEWAY_S < claims["nbf"])):  # fmt: skip
            return None
        return claims
