"""Where a config object's bytes come from: the bucket mounted on the filesystem (an FSx for Lustre
data repository, or any directory holding <bucket>/<key>), or S3 itself through boto3."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol


class SourceError(Exception):
    """The object could not be read (HTTP 502: the sender may retry)."""


class ObjectSource(Protocol):
    def read(self, bucket: str, key: str, version_id: str, max_bytes: int) -> bytes:
        """The object's bytes; SourceError when it cannot be read, ValueError when it is too large."""
        ...


class FilesystemSource:
    """Objects at <root>/<bucket>/<key>."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def read(self, bucket: str, key: str, version_id: str, max_bytes: int) -> bytes:
        if bucket in ("", ".", "..") or "/" in bucket:
            raise ValueError(f"{bucket!r} is not a bucket name")
        top = (self.root / bucket).resolve()
        path = (top / key).resolve()
        if not path.is_relative_to(top):
            raise ValueError(f"object key {key!r} would lie outside {top}")
        try:
            size = path.stat().st_size
            if size > max_bytes:
                raise ValueError(f"object {bucket}/{key} is {size} bytes, over the {max_bytes}-byte limit")
            return path.read_bytes()
        except OSError as exc:
            raise SourceError(f"cannot read {path}: {exc.strerror or exc}") from None


class S3Source:
    """Objects from S3 (boto3; credentials from the usual AWS chain, e.g. IRSA on EKS)."""

    def __init__(self, endpoint_url: str = "", client: Any = None) -> None:
        if client is None:
            try:
                import boto3
            except ImportError:
                raise ValueError("MMRL_TRIGGER_OBJECT_SOURCE=s3 needs boto3: pip install 'mmrl[s3]'") from None
            client = boto3.client("s3", endpoint_url=endpoint_url or None)
        self.client = client

    def read(self, bucket: str, key: str, version_id: str, max_bytes: int) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        args = {"Bucket": bucket, "Key": key, **({"VersionId": version_id} if version_id else {})}
        try:
            reply = self.client.get_object(**args)
            size = int(reply.get("ContentLength", 0))
            if size > max_bytes:
                reply["Body"].close()
                raise ValueError(f"object s3://{bucket}/{key} is {size} bytes, over the {max_bytes}-byte limit")
            return bytes(reply["Body"].read())
        except (BotoCoreError, ClientError) as exc:
            raise SourceError(f"cannot read s3://{bucket}/{key}: {exc}") from None
