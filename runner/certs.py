"""Certificates and keys for a secure deployment: a CA, the SuperLink's TLS certificate, and one
ECDSA key pair per SuperNode for Flower's SuperNode authentication.

    python -m runner.certs --out certs --supernodes 2 --names localhost,127.0.0.1,superlink

writes (private keys mode 0600)::

    certs/ca.crt, certs/ca.key                  the CA (keep ca.key offline; SuperNodes get ca.crt)
    certs/superlink.pem, certs/superlink.key    the SuperLink's certificate, SANs = --names
    certs/supernodes/supernode-<i>, .pub        SuperNode i's P-384 key (OpenSSH format, as
                                                ``ssh-keygen -t ecdsa -b 384`` makes it)

The SuperLink runs with ``--ssl-ca-certfile ca.crt --ssl-certfile superlink.pem --ssl-keyfile
superlink.key --enable-supernode-auth``; each public key is registered with ``flwr supernode
register supernode-<i>.pub <connection>``; each SuperNode runs with ``--root-certificates ca.crt
--auth-supernode-private-key supernode-<i>``. ``--names`` must hold every name or address the
SuperNodes and the ``flwr`` CLI use to reach the SuperLink. Existing files are kept (a SuperNode
key is its identity) unless ``--force``; to rotate one SuperNode's key, see README "Deployment".
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 365


def _write(path: Path, data: bytes, private: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _certificate(subject: str, public_key, issuer: x509.Name, signing_key, *, ca: bool,
                 names: list[str] = ()) -> x509.Certificate:
    now = dt.datetime.now(dt.timezone.utc)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(issuer).public_key(public_key).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=VALID_DAYS))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
            decipher_only=False), critical=True)
    else:
        builder = builder.add_extension(x509.SubjectAlternativeName([_san(n) for n in names]), critical=False)
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    return builder.sign(signing_key, hashes.SHA256())


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def make_ca(out: Path, name: str = "pfl-flower CA", force: bool = False) -> tuple[Path, Path]:
    """A self-signed CA (``ca.crt``, ``ca.key``); an existing one is reused unless ``force``."""
    crt, key_path = out / "ca.crt", out / "ca.key"
    if force or not (crt.exists() and key_path.exists()):
        key = ec.generate_private_key(ec.SECP384R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        _write(key_path, _key_pem(key), private=True)
        _write(crt, _certificate(name, key.public_key(), subject, key, ca=True).public_bytes(
            serialization.Encoding.PEM), private=False)
    return crt, key_path


def make_server_certificate(out: Path, names: list[str], stem: str = "superlink") -> tuple[Path, Path]:
    """The SuperLink's key and certificate signed by the CA in ``out``, valid for ``names`` (SANs).
    Always made anew: cheap, and the names may have changed."""
    ca_key = serialization.load_pem_private_key((out / "ca.key").read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
    key = ec.generate_private_key(ec.SECP384R1())
    cert = _certificate(names[0], key.public_key(), ca_cert.subject, ca_key, ca=False, names=names)
    key_path, pem = out / f"{stem}.key", out / f"{stem}.pem"
    _write(key_path, _key_pem(key), private=True)
    _write(pem, cert.public_bytes(serialization.Encoding.PEM), private=False)
    return pem, key_path


def make_supernode_key(out: Path, name: str, force: bool = False) -> tuple[Path, Path]:
    """One SuperNode's ECDSA P-384 key pair in OpenSSH format (private, ``.pub``); kept if present."""
    private, public = out / name, out / f"{name}.pub"
    if force or not (private.exists() and public.exists()):
        key = ec.generate_private_key(ec.SECP384R1())
        _write(private, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                          serialization.NoEncryption()), private=True)
        _write(public, key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                     serialization.PublicFormat.OpenSSH) + b"\n", private=False)
    return private, public


def make_all(out: Path, supernodes: int, names: list[str], force: bool = False) -> dict:
    """CA, SuperLink certificate and ``supernodes`` key pairs under ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    ca, _ = make_ca(out, force=force)
    pem, key = make_server_certificate(out, names)
    keys = [make_supernode_key(out / "supernodes", f"supernode-{i}", force=force) for i in range(supernodes)]
    return {"ca": ca, "certificate": pem, "key": key, "supernode_keys": keys}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("certs"))
    parser.add_argument("--supernodes", type=int, default=2)
    parser.add_argument("--names", default="localhost,127.0.0.1",
                        help="comma-separated names and IP addresses the SuperLink is reached by (its SANs)")
    parser.add_argument("--force", action="store_true", help="replace an existing CA and SuperNode keys")
    args = parser.parse_args(argv)
    paths = make_all(args.out, args.supernodes, [n.strip() for n in args.names.split(",") if n.strip()], args.force)
    print(f"CA {paths['ca']}; SuperLink certificate {paths['certificate']} for {args.names}; "
          f"{len(paths['supernode_keys'])} SuperNode key pairs in {args.out / 'supernodes'}")


if __name__ == "__main__":
    main()
