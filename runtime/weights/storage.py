"""Where delta weight sync publishes (SkyRL's `delta_weight_sync.sync_dir`): a local or shared path, an S3 bucket
(`s3://bucket/prefix`, through boto3, which reads AWS_ENDPOINT_URL for an S3-compatible store) or a GCS bucket
(`gs://bucket/prefix`, through google-cloud-storage). One small interface, `Store`, whatever the place: put and get
whole objects by name, under the store's root.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol


class StoreError(RuntimeError):
    """A store cannot be opened (its client library is missing) or an object is not there."""


class Store(Protocol):
    uri: str

    def check(self) -> None:
        """Raise StoreError when the place cannot be written to: a run stops before its first step, not at its first
        sync."""

    def put(self, name: str, data: bytes) -> None: ...

    def get(self, name: str) -> bytes: ...


def join(base: str, child: str) -> str:
    return f"{base.rstrip('/')}/{child}"


def open_store(uri: str) -> Store:
    """The store at `uri`: s3://, gs://, or a filesystem path."""
    if uri.startswith("s3://"):
        return S3Store(uri)
    if uri.startswith("gs://"):
        return GcsStore(uri)
    if "://" in uri:
        raise StoreError(f"delta weight sync cannot publish to {uri!r}: sync_dir is a path, s3:// or gs://")
    return LocalStore(uri)


class LocalStore:
    """A directory (local, or a shared filesystem every node mounts)."""

    def __init__(self, uri: str):
        self.uri = uri
        self.root = Path(uri).expanduser()

    def check(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create {self.uri}: {exc.strerror}") from None
        if not os.access(self.root, os.W_OK):
            raise StoreError(f"{self.uri} is not writable")

    def put(self, name: str, data: bytes) -> None:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # a reader sees the whole object or none

    def get(self, name: str) -> bytes:
        try:
            return (self.root / name).read_bytes()
        except FileNotFoundError:
            raise StoreError(f"{join(self.uri, name)} does not exist") from None


def _bucket_and_prefix(uri: str) -> tuple[str, str]:
    bucket, _, prefix = uri.split("://", 1)[1].partition("/")
    if not bucket:
        raise StoreError(f"{uri!r} names no bucket")
    return bucket, prefix.strip("/")


class S3Store:
    """An S3 bucket, or any S3-compatible store (MinIO, moto): boto3 takes the endpoint from AWS_ENDPOINT_URL and
    the credentials from its usual chain."""

    def __init__(self, uri: str):
        try:
            import boto3  # deferred: boto3, needed only for an s3:// sync_dir
        except ImportError:
            raise StoreError(
                f"delta weight sync to {uri} needs boto3 on every node that publishes or loads weights "
                "(pip install boto3)"
            ) from None
        self.uri = uri
        self.bucket, self.prefix = _bucket_and_prefix(uri)
        self.client: Any = boto3.client("s3")
        self.missing = self.client.exceptions.NoSuchKey

    def check(self) -> None:
        import botocore.exceptions  # deferred: botocore, installed with boto3

        try:
            self.client.head_bucket(Bucket=self.bucket)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise StoreError(f"cannot reach the bucket of {self.uri}: {exc}") from None

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def put(self, name: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(name), Body=data)

    def get(self, name: str) -> bytes:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(name))["Body"].read()
        except self.missing:
            raise StoreError(f"{join(self.uri, name)} does not exist") from None


class GcsStore:
    """A Google Cloud Storage bucket, through google-cloud-storage (application default credentials)."""

    def __init__(self, uri: str):
        try:
            from google.cloud import storage  # deferred: google (google-cloud-storage), only for a gs:// sync_dir
        except ImportError:
            raise StoreError(
                f"delta weight sync to {uri} needs google-cloud-storage on every node that publishes or loads "
                "weights (pip install google-cloud-storage)"
            ) from None
        self.uri = uri
        bucket, self.prefix = _bucket_and_prefix(uri)
        self.bucket: Any = storage.Client().bucket(bucket)

    def check(self) -> None:
        try:
            found = self.bucket.exists()
        except Exception as exc:  # google-api-core's errors, or the transport's
            raise StoreError(f"cannot reach the bucket of {self.uri}: {exc}") from None
        if not found:
            raise StoreError(f"the bucket of {self.uri} does not exist")

    def _blob(self, name: str) -> Any:
        return self.bucket.blob(f"{self.prefix}/{name}" if self.prefix else name)

    def put(self, name: str, data: bytes) -> None:
        self._blob(name).upload_from_string(data)

    def get(self, name: str) -> bytes:
        blob = self._blob(name)
        if not blob.exists():
            raise StoreError(f"{join(self.uri, name)} does not exist")
        return blob.download_as_bytes()
