"""tracetap's local CA: what a proxy-mode gateway signs intercepted hosts' certificates with.

Generated once under tracetap's home (never in a repository or a store), built in a private scratch
directory and renamed into place, so two gateways starting together share one CA and nobody sees a
half-written key. The key file is readable by its owner only. `trust_env` gives the environment each
ecosystem reads to trust it: Node.js adds `NODE_EXTRA_CA_CERTS` to its own roots, while OpenSSL,
requests, httpx and curl replace theirs with the file they are given, so they get a bundle of the
usual roots plus this CA.
"""

from __future__ import annotations

import os
from pathlib import Path

import certifi
from mitmproxy.certs import CertStore
from mitmproxy.options import CONF_BASENAME
from tracetap.engine.cache import build_once, home_dir

KEY_SIZE = 2048
BUNDLE_ENV = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


def ca_dir() -> Path:
    """The gateway's mitmproxy confdir, created with its CA on first use."""
    return build_once(home_dir() / "ca", lambda scratch: CertStore.create_store(scratch, CONF_BASENAME, KEY_SIZE))


def ca_cert() -> Path:
    """The CA's certificate (public): what clients are told to trust."""
    return ca_dir() / f"{CONF_BASENAME}-ca-cert.pem"


def ca_key() -> Path:
    """The CA's private key (with its certificate): mode 0600."""
    return ca_dir() / f"{CONF_BASENAME}-ca.pem"


def trust_bundle() -> Path:
    """certifi's roots followed by the CA, rewritten (atomically) when either changed."""
    bundle = ca_dir() / "trust-bundle.pem"
    text = Path(certifi.where()).read_text() + "\n" + ca_cert().read_text()
    if not bundle.exists() or bundle.read_text() != text:
        scratch = bundle.with_suffix(f".{os.getpid()}.tmp")
        scratch.write_text(text)
        os.replace(scratch, bundle)
    return bundle


def trust_env() -> dict[str, str]:
    """Environment variables that make Node.js, Python (requests, httpx), OpenSSL and curl trust the CA."""
    bundle = str(trust_bundle())
    return {"NODE_EXTRA_CA_CERTS": str(ca_cert()), **{name: bundle for name in BUNDLE_ENV}}
