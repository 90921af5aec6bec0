"""The node's TLS certificates, re-read when their files change: rotation without a restart.

The node's gRPC port serves with ``grpc.tls_cert``/``grpc.tls_key`` and, with
``grpc.tls_client_ca``, requires client certificates that chain to that bundle. gRPC asks
:meth:`ServerCertificates.fetch` for the configuration at the start of every TLS
handshake (``grpc.dynamic_ssl_server_credentials``); it looks at the three files at most
once per :data:`CHECK_INTERVAL_S` and, when one changed (size, mtime or inode: a file
rewritten in place, replaced by a rename, or a Kubernetes secret's symlink swap), reads
them again. Connections already open keep the certificate they were set up with; every
new handshake gets the new one.

A half-done change must not take the port down: the files are read, checked (the key
must match the certificate, every PEM must parse, with Python's :mod:`ssl`) and read a
second time, and only a set that passed and did not change meanwhile replaces the one in
use. Anything else leaves the current certificates in place with one WARNING per bad
state of the files (a certificate written before its key, say), and the next change is
tried again. Rotating the CA is done with an overlap window (docs/operations.md#tls): the
client CA bundle holds the old and the new CA while certificates of both are about.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from chronoshard.scheduler.config import GrpcConfig
from chronoshard.settings import ConfigError

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 1.0
"""How often, at most, a handshake makes the node look at its certificate files."""

FileState = tuple[int, int, int, int] | None
"""A file's (device, inode, size, mtime in ns), None when it cannot be read."""


@dataclass(frozen=True)
class CertificateFiles:
    """The node's certificate chain, key and (optional) client CA bundle, as read."""

    certificate: bytes
    key: bytes
    client_ca: bytes | None


class CertificateError(Exception):
    """The files do not hold a usable certificate, key and CA bundle; ``key`` names the
    setting of the file at fault."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


class ServerCertificates:
    """``grpc.tls_*`` of one node: the server credentials and the fetcher that reloads.

    ``monotonic`` is the clock the checks are spaced by (a test's may be fake).
    """

    def __init__(
        self, config: GrpcConfig, *, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        if config.tls_cert is None or config.tls_key is None:
            raise ValueError("ServerCertificates needs grpc.tls_cert and grpc.tls_key")
        self._paths: dict[str, str | None] = {
            "grpc.tls_cert": config.tls_cert,
            "grpc.tls_key": config.tls_key,
            "grpc.tls_client_ca": config.tls_client_ca,
        }
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._next_check = 0.0
        try:
            self._states, self.current = self._read_checked()
        except CertificateError as exc:
            raise ConfigError(exc.key, str(exc).partition(": ")[2]) from None
        self._refused: tuple[FileState, ...] | None = None
        self.reloads = 0

    @property
    def requires_client_certificates(self) -> bool:
        return self._paths["grpc.tls_client_ca"] is not None

    def credentials(self) -> grpc.ServerCredentials:
        """Server credentials that ask :meth:`fetch` at every handshake."""
        return grpc.dynamic_ssl_server_credentials(
            _configuration(self.current),
            self.fetch,
            require_client_authentication=self.requires_client_certificates,
        )

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """The new configuration when the files changed (and are sound), else None: what
        gRPC's fetcher returns to keep the current one. Never raises (gRPC would fail
        the handshake)."""
        with self._lock:
            now = self._monotonic()
            if now < self._next_check:
                return None
            self._next_check = now + CHECK_INTERVAL_S
            states = self._states_now()
            if states == self._states or states == self._refused:
                return None
            try:
                self._states, self.current = self._read_checked()
            except CertificateError as exc:
                self._refused = states
                log.warning(
                    "TLS certificate files changed but are not usable; "
                    "keeping the certificates in use",
                    extra={"error": str(exc)},
                )
                return None
            except Exception:  # a bug here must not fail every handshake
                self._refused = states
                log.exception("reading the TLS certificate files failed")
                return None
            self._refused = None
            self.reloads += 1
            log.info(
                "TLS certificates reloaded",
                extra={key: path for key, path in self._paths.items() if path is not None},
            )
            return _configuration(self.current)

    def _states_now(self) -> tuple[FileState, ...]:
        return tuple(_state(path) for path in self._paths.values())

    def _read_checked(self) -> tuple[tuple[FileState, ...], CertificateFiles]:
        """The files' states and contents, checked and unchanged while checked.

        Raises:
            CertificateError: a file is missing or unreadable, a PEM does not parse, the
                key is not the certificate's, or a file changed while it was checked.
        """
        before = self._states_now()
        files = self._read()
        cert_path, key_path = self._paths["grpc.tls_cert"], self._paths["grpc.tls_key"]
        assert cert_path is not None and key_path is not None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            context.load_cert_chain(cert_path, key_path)
        except (ssl.SSLError, OSError) as exc:
            raise CertificateError(
                "grpc.tls_cert",
                f"{cert_path} and {key_path} are not a PEM certificate and its key: {exc}",
            ) from None
        if files.client_ca is not None:
            try:
                context.load_verify_locations(cadata=files.client_ca.decode("ascii"))
            except (ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
                raise CertificateError(
                    "grpc.tls_client_ca",
                    f"{self._paths['grpc.tls_client_ca']} holds no PEM CA certificates: {exc}",
                ) from None
        if self._read() != files or self._states_now() != before:
            raise CertificateError("grpc.tls_cert", "the files changed while they were read")
        return before, files

    def _read(self) -> CertificateFiles:
        contents: dict[str, bytes | None] = {}
        for key, path in self._paths.items():
            if path is None:
                contents[key] = None
                continue
            try:
                with open(path, "rb") as file:
                    contents[key] = file.read()
            except OSError as exc:
                raise CertificateError(key, f"cannot read {path}: {exc.strerror or exc}") from None
        certificate, private_key = contents["grpc.tls_cert"], contents["grpc.tls_key"]
        assert certificate is not None and private_key is not None
        return CertificateFiles(certificate, private_key, contents["grpc.tls_client_ca"])


def _configuration(files: CertificateFiles) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration(
        [(files.key, files.certificate)], root_certificates=files.client_ca
    )


def _state(path: str | None) -> FileState:
    if path is None:
        return None
    try:
        found = os.stat(path)
    except OSError:
        return None
    return (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns)
